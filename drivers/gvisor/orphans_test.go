package gvisor

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// TestSweepOrphans (issue 23): a sandbox whose driver state directory is
// gone (its data dir removed under it, the daemon dead) is killed by
// another driver's sweep; a sandbox whose state exists is not.
func TestSweepOrphans(t *testing.T) {
	runsc := requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := newTestDriver(t, runsc, "/amber/gvisor-orphan-a")
	b := newTestDriver(t, runsc, "/amber/gvisor-orphan-b")
	orphan := fmt.Sprintf("orphan-%d", os.Getpid())
	alive := fmt.Sprintf("kept-%d", os.Getpid())
	info, err := a.Create(ctx, sandbox.Spec{ID: orphan, Template: minimalTemplate(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Create(ctx, sandbox.Spec{ID: alive, Template: minimalTemplate(t)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), alive) })
	// The data dir goes: a's state is renamed away (mounts and all).
	stateA := a.opts.StateDir
	if err := os.Rename(stateA, stateA+".gone"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.Rename(stateA+".gone", stateA)
		_ = a.Destroy(context.Background(), orphan)
	})
	killed, err := b.SweepOrphans(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("swept: %v", killed)
	// Sweeps are host-wide: an `amber up` of another test may have swept
	// this orphan first. Then it is gone already; else this sweep names it.
	if !strings.Contains(strings.Join(killed, " "), stateA) && syscall.Kill(info.InitPID, 0) == nil {
		t.Fatalf("the orphan's runsc sandbox was not killed: %v", killed)
	}
	for deadline := time.Now().Add(10 * time.Second); syscall.Kill(info.InitPID, 0) == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the orphan's process %d still runs", info.InitPID)
		}
	}
	if out := mustSh(t, b, alive, "echo kept"); out != "kept\n" {
		t.Fatalf("the sandbox whose state exists: %q", out)
	}
}
