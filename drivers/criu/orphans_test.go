package criu

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// TestSweepOrphans (issue 23): a sandbox whose driver state directory is
// gone (its data dir removed under it, the daemon dead) is killed by
// another driver's sweep, its whole cgroup; a sandbox whose state exists
// is not.
func TestSweepOrphans(t *testing.T) {
	a := newTestDriver(t)
	b := newTestDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	orphan := a.create(sandbox.Limits{})
	alive := b.create(sandbox.Limits{})
	info, err := a.Inspect(ctx, orphan)
	if err != nil || info.InitPID <= 0 {
		t.Fatalf("inspect: %+v %v", info, err)
	}
	child, err := a.Start(ctx, orphan, sandbox.ExecSpec{Args: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	_ = child
	// The data dir goes: a's state is renamed away (mounts and all).
	if err := os.Rename(a.state, a.state+".gone"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Rename(a.state+".gone", a.state) })
	killed, err := b.SweepOrphans(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("swept: %v", killed)
	// Sweeps are host-wide: an `amber up` of another test may have swept
	// this orphan first. Then it is gone already; else this sweep names it.
	if !strings.Contains(strings.Join(killed, "\n"), "pid "+strconv.Itoa(info.InitPID)+" and 2 processes") && syscall.Kill(info.InitPID, 0) == nil {
		t.Fatalf("swept %v, want the orphan's init %d and its sleep", killed, info.InitPID)
	}
	for deadline := time.Now().Add(10 * time.Second); syscall.Kill(info.InitPID, 0) == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the orphan's init %d still runs", info.InitPID)
		}
	}
	var out bytes.Buffer
	if st, err := b.Exec(ctx, alive, sandbox.ExecSpec{Args: []string{"echo", "kept"}, Stdout: &out}); err != nil || st.Code != 0 || out.String() != "kept\n" {
		t.Fatalf("the sandbox whose state exists: %+v %v %q", st, err, out.String())
	}
}
