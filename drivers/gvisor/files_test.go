package gvisor

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/core/sandbox/sandboxtest"
)

// TestFilesBenchmark: 1 MiB WriteFile and ReadFile of one sandbox through
// its agent and through the host-side confinedfs, in the same run (and
// 4 KiB, for the calls' fixed cost).
// AMBER_GVISOR_BENCH=1 only.
//
//	AMBER_GVISOR_BENCH=1 go test -tags seccomp -count=1 -run TestFilesBenchmark -v ./drivers/gvisor
func TestFilesBenchmark(t *testing.T) {
	if os.Getenv("AMBER_GVISOR_BENCH") != "1" {
		t.Skip("set AMBER_GVISOR_BENCH=1 to run")
	}
	runsc := requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d := newTestDriver(t, runsc, "/amber/gvisor-filesbench")
	id := fmt.Sprintf("filesbench-%d", os.Getpid())
	if _, err := d.Create(ctx, sandbox.Spec{ID: id, Template: minimalTemplate(t)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	viaAgent, err := d.Files(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := d.hostFiles(id)
	if err != nil {
		t.Fatal(err)
	}
	sandboxtest.FilesBenchmark(t, viaAgent, host)
}

// TestFilesHideAgentToken: the files API, served by the agent (the
// sandbox's root), does not read the sandbox's /proc, where the agent's
// initial environment holds its token — also not through a symlink the
// sandbox planted.
func TestFilesHideAgentToken(t *testing.T) {
	runsc := requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := newTestDriver(t, runsc, "/amber/gvisor-filestoken")
	id := fmt.Sprintf("filestoken-%d", os.Getpid())
	if _, err := d.Create(ctx, sandbox.Spec{ID: id, Template: minimalTemplate(t)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	rec, err := d.loadRecord(id)
	if err != nil {
		t.Fatal(err)
	}
	mustSh(t, d, id, "ln -s /proc/1/environ /root/env")
	fs, err := d.Files(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	sandboxtest.TokenUnreadable(t, fs, rec.AgentToken, "/root/env")
}
