package criu

import (
	"context"
	"os"
	"testing"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/core/sandbox/sandboxtest"
)

// TestFilesBenchmark: 1 MiB WriteFile and ReadFile of one sandbox through
// its agent and through the host-side confinedfs, in the same run (and
// 4 KiB, for the calls' fixed cost).
// AMBER_BENCH=1 only.
//
//	AMBER_BENCH=1 go test -tags seccomp -count=1 -run TestFilesBenchmark -v ./drivers/criu
func TestFilesBenchmark(t *testing.T) {
	if os.Getenv("AMBER_BENCH") != "1" {
		t.Skip("set AMBER_BENCH=1 to measure")
	}
	td := newTestDriver(t)
	id := td.create(sandbox.Limits{})
	viaAgent, err := td.Files(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := td.hostFiles(id)
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
	td := newTestDriver(t)
	requireCriu(t, td)
	ctx := context.Background()
	id := td.create(sandbox.Limits{})
	rec, err := td.loadRecord(id)
	if err != nil {
		t.Fatal(err)
	}
	td.sh(id, "ln -s /proc/1/environ /root/env")
	fs, err := td.Files(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	sandboxtest.TokenUnreadable(t, fs, rec.AgentToken, "/root/env")
}
