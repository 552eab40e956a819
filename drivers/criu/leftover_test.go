package criu

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/egress"
	"github.com/amber-run/amber/internal/egress/egresstest"
)

// TestThawLeftFrozen: a daemon SIGKILLed between a cut's freeze and its
// thaw left the sandbox's cgroup FROZEN; the next daemon's calls failed at
// once ("sandbox … is paused", a failed precondition), and the chaos run's
// session ended needing reconciliation (criu, seed 885261). Now the first
// call into a sandbox frozen by no cut of this driver thaws it and runs.
func TestThawLeftFrozen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	td, id := leftFrozen(t)
	var out bytes.Buffer
	st, err := td.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"echo", "alive"}, Stdout: &out})
	if err != nil || st.Code != 0 || out.String() != "alive\n" {
		t.Fatalf("exec into a sandbox left frozen: %+v %v %q", st, err, out.String())
	}
	assertThawedAndAlone(t, td.Driver, id)
}

// TestCheckpointThawsLeftFrozen: the next cut of a sandbox a dead
// daemon's cut left frozen thaws it and is cut as any other — it was
// refused as "paused" (its lock is the cut's own, so the thaw on the first
// call never ran), three times, and the session waited for a client event
// (chaos seeds 736966, 736971: 29–31 s).
func TestCheckpointThawsLeftFrozen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	td, id := leftFrozen(t)
	if _, err := td.Checkpoint(ctx, id, filepath.Join(t.TempDir(), "image"), sandbox.CheckpointOptions{}); err != nil {
		t.Fatalf("checkpoint of a sandbox left frozen: %v", err)
	}
	assertThawedAndAlone(t, td.Driver, id)
}

// leftFrozen makes a sandbox as a dead daemon's cut leaves it: frozen,
// the driver's lock free.
func leftFrozen(t *testing.T) (*testDriver, string) {
	t.Helper()
	td := newTestDriver(t)
	requireCriu(t, td)
	id := td.create(sandbox.Limits{})
	ls, err := td.container(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.c.Pause(); err != nil {
		t.Fatal(err)
	}
	return td, id
}

// TestThawLeftFrozenReplumbs: with egress the unfinished cut had also
// deleted the sandbox's veth for the dump (unlinkForDump): the thaw plumbs
// it again, and the sandbox reaches the outside through the gateway.
func TestThawLeftFrozenReplumbs(t *testing.T) {
	ledger := egresstest.NewLedger(t, true)
	path := egresstest.Start(t, map[string]netip.AddrPort{"payments.test": ledger.Addr()})
	td := newEgressDriver(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := newID("leftover")
	path.StartRun(t, "t1", id, "run-0")
	if _, err := td.Create(ctx, sandbox.Spec{ID: id, Template: sandbox.Template{Name: "minimal", RootFS: minimalRootfs(t)}}); err != nil {
		t.Fatal(err)
	}
	get := func() string { return pingLedger(td, id, ledger.Addr().Port()) }
	td.sh(id, fmt.Sprintf("printf '%s' > /etc/resolv.conf", egress.ResolvConf))
	if out := get(); !strings.Contains(out, "pong") {
		t.Fatalf("through the gateway: %q", out)
	}
	ls, err := td.container(id)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ls.c.State()
	if err != nil {
		t.Fatal(err)
	}
	// As the dead daemon's cut left it: link gone, frozen, lock free.
	if err := ls.c.Pause(); err != nil {
		t.Fatal(err)
	}
	if _, err := td.unlinkForDump(ctx, id, s.InitProcessPid); err != nil {
		t.Fatal(err)
	}
	if out := get(); !strings.Contains(out, "pong") {
		t.Fatalf("through the gateway after the thaw: %q", out)
	}
	assertThawedAndAlone(t, td.Driver, id)
}
