package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/lib/failpoint"
)

// TestRestoreAgainWhenAgentSilent: a restore whose agent does not answer
// within restoreAgentWait (the wait hung by the FPAgentWait failpoint, as
// CI met a restored agent that answered no dial for 60 s) kills that copy
// and restores again from the same image: the sandbox runs, with the
// layer and the process of the cut and without the file written after it.
// Without the second attempt the restore fails.
func TestRestoreAgainWhenAgentSilent(t *testing.T) {
	runsc := requireHost(t)
	tmpl := minimalTemplate(t)
	ctx := context.Background()
	d := newTestDriver(t, runsc, "/amber/gvisor-again")
	fp := failpoint.New()
	d.opts.Failpoints = fp
	defer func(w time.Duration) { restoreAgentWait = w }(restoreAgentWait)
	restoreAgentWait = 2 * time.Second

	id := fmt.Sprintf("again-%d", os.Getpid())
	spec := sandbox.Spec{ID: id, Template: tmpl}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	mustSh(t, d, id, `echo cut > /root/cut.txt`)
	pid, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "while :; do sleep 1; done"}})
	if err != nil {
		t.Fatal(err)
	}
	imageDir := filepath.Join(t.TempDir(), "image")
	if _, err := d.Checkpoint(ctx, id, imageDir, sandbox.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	mustSh(t, d, id, `echo after > /root/after.txt`)
	if err := d.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}

	fp.ArmCtx(FPAgentWait, fp.Hits(FPAgentWait)+1, false, failpoint.Hang(nil))
	start := time.Now()
	if _, err := d.Restore(ctx, spec, imageDir, sandbox.RestoreOptions{}); err != nil {
		t.Fatalf("restore with a silent first copy: %v", err)
	}
	t.Logf("restored in %v (a silent copy first)", time.Since(start).Round(time.Millisecond))
	if n := d.runscCalls("restore:again"); n != 1 {
		t.Fatalf("restore:again = %d, want 1: the silent copy was not replaced", n)
	}
	if got := strings.TrimSpace(mustSh(t, d, id, `cat /root/cut.txt; test -e /root/after.txt && echo after-exists; kill -0 `+fmt.Sprint(pid)+` && echo alive`)); got != "cut\nalive" {
		t.Fatalf("after the second restore: %q, want the cut's file and process and no later file", got)
	}
}
