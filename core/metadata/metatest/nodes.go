package metatest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
)

// testNodeLeases: a node registers with epoch 1, cannot register twice
// while live, heartbeats at its epoch; once its lease expired exactly one
// of two claimers wins it, its heartbeat is then fenced, and it registers
// again one epoch on. Sandbox rows move between nodes only from their
// current node.
func testNodeLeases(t *testing.T, open Opener) {
	ctx := ctxT(t)
	fc := clock.NewFake(epoch)
	s := mustOpen(t, open, fc)
	n, err := s.RegisterNode(ctx, metadata.Node{ID: "n1", Addr: "127.0.0.1:1"}, 5*time.Second)
	if err != nil || n.Epoch != 1 || n.State != metadata.NodeLive || !n.Alive(fc.Now()) {
		t.Fatalf("register: %+v %v", n, err)
	}
	if _, err := s.RegisterNode(ctx, metadata.Node{ID: "n1"}, 5*time.Second); !errdefs.IsConflict(err) {
		t.Fatalf("second registration while live: %v", err)
	}
	fc.Advance(3 * time.Second)
	if err := s.HeartbeatNode(ctx, "n1", 1, 5*time.Second, metadata.NodeCapacity{Sandboxes: 2}); err != nil {
		t.Fatal(err)
	}
	if g, err := s.GetNode(ctx, "n1"); err != nil || g.Capacity.Sandboxes != 2 || !g.Heartbeat.Equal(fc.Now()) {
		t.Fatalf("after a heartbeat: %+v %v", g, err)
	}
	if ok, err := s.ClaimDeadNode(ctx, "n1", 1, "n2"); err != nil || ok {
		t.Fatalf("claimed a live node: %v %v", ok, err)
	}
	fc.Advance(6 * time.Second)
	got := 0
	for _, by := range []string{"n2", "n3"} {
		ok, err := s.ClaimDeadNode(ctx, "n1", 1, by)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got++
		}
	}
	if got != 1 {
		t.Fatalf("%d claims of a dead node won, want 1", got)
	}
	if err := s.HeartbeatNode(ctx, "n1", 1, 5*time.Second, metadata.NodeCapacity{}); !errdefs.IsFenced(err) {
		t.Fatalf("heartbeat of a claimed node: %v", err)
	}
	if n, err = s.RegisterNode(ctx, metadata.Node{ID: "n1", Addr: "127.0.0.1:1"}, 5*time.Second); err != nil || n.Epoch != 2 || n.TakenBy != "" {
		t.Fatalf("register again: %+v %v", n, err)
	}
	sb := row("sbx-m", false)
	sb.Node = "n1"
	if _, err := s.Insert(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if got, err := s.MoveSandbox(ctx, "sbx-m", "n1", "n2"); err != nil || got.Node != "n2" {
		t.Fatalf("move: %+v %v", got, err)
	}
	if _, err := s.MoveSandbox(ctx, "sbx-m", "n1", "n3"); !errdefs.IsFenced(err) {
		t.Fatalf("second move from n1: %v", err)
	}
	on := "n2"
	if l, err := s.List(ctx, metadata.Filter{Node: &on}); err != nil || len(l) != 1 {
		t.Fatalf("n2's rows: %+v %v", l, err)
	}
	if l, err := s.ListNodes(ctx); err != nil || len(l) != 1 || l[0].Capacity.Sandboxes != 0 {
		t.Fatalf("nodes: %+v %v", l, err)
	}
	// A claim before the lease expires needs a liveness lock the backend
	// may not have: where it has none, the claim is refused.
	if _, supported, err := s.NodeLockHeld(ctx, "n1"); err != nil {
		t.Fatal(err)
	} else if !supported {
		if _, err := s.ClaimLostNode(ctx, "n1", n.Epoch, n.Heartbeat, "n2"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("claim of a lost node without liveness locks: %v", err)
		}
	}
}

// testNodeLock: where the backend has liveness locks, a node's lock is
// seen held once its process took it and free once it released it; where
// it has none, taking it reports false without an error.
func testNodeLock(t *testing.T, open Opener) {
	ctx := ctxT(t)
	s := mustOpen(t, open, clock.NewFake(epoch))
	l := s.NodeLock("n1")
	held, err := l.Ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	seen, supported, err := s.NodeLockHeld(ctx, "n1")
	switch {
	case err != nil:
		t.Fatal(err)
	case !supported:
		if held || seen {
			t.Fatalf("no liveness locks, yet held %v, seen %v", held, seen)
		}
		return
	case !held || !seen:
		t.Fatalf("lock taken %v, seen held %v", held, seen)
	}
	if again, err := l.Ensure(ctx); !again || err != nil {
		t.Fatalf("ensure of a held lock: %v %v", again, err)
	}
	if other, _, err := s.NodeLockHeld(ctx, "n2"); other || err != nil {
		t.Fatalf("another node's lock: %v %v", other, err)
	}
	l.Release()
	if seen, _, err := s.NodeLockHeld(ctx, "n1"); seen || err != nil {
		t.Fatalf("released lock seen held: %v %v", seen, err)
	}
}

// testFailoverPlan: assignments of a dead node's sandboxes are pending
// while the sandbox is still on the dead node (and not destroyed), move to
// another target only from the target they have (one of two reassigners
// wins), and are dropped once done; a claim records its plan with it, a
// losing claim records nothing.
func testFailoverPlan(t *testing.T, open Opener) {
	ctx := ctxT(t)
	s := mustOpen(t, open, clock.Real{})
	for _, id := range []string{"sbx-f1", "sbx-f2", "sbx-f3"} {
		sb := row(id, false)
		sb.Node = "dead"
		if _, err := s.Insert(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	// claim registers node id with a lease that has already run out and
	// claims it for by with plan.
	claim := func(id, by string, plan ...metadata.FailoverAssignment) bool {
		t.Helper()
		n, err := s.RegisterNode(ctx, metadata.Node{ID: id, Addr: "127.0.0.1:1"}, time.Nanosecond)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
		ok, err := s.ClaimDeadNode(ctx, id, n.Epoch, by, plan...)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	plan := []metadata.FailoverAssignment{
		{SandboxID: "sbx-f1", DeadNode: "dead", Target: "n1"},
		{SandboxID: "sbx-f2", DeadNode: "dead", Target: "n2"},
		{SandboxID: "sbx-f3", DeadNode: "dead", Target: "n2"},
	}
	if !claim("dead", "n1", plan...) {
		t.Fatal("claim of a dead node with a plan lost")
	}
	pending := func() []metadata.FailoverAssignment {
		t.Helper()
		p, err := s.PendingFailovers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if got := pending(); !slices.Equal(got, plan) {
		t.Fatalf("pending: %+v, want %+v", got, plan)
	}
	// n2 is down: two nodes race to take sbx-f2 over; one wins.
	wins := 0
	for _, to := range []string{"n1", "n3"} {
		if ok, err := s.ReassignFailover(ctx, plan[1], to); err != nil {
			t.Fatal(err)
		} else if ok {
			wins++
		}
	}
	if got := pending(); wins != 1 || got[1].Target != "n1" {
		t.Fatalf("reassign: %d wins, pending %+v", wins, got)
	}
	// sbx-f1 taken over (its row moved), sbx-f3 destroyed: not pending.
	if _, err := s.MoveSandbox(ctx, "sbx-f1", "dead", "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetState(ctx, "sbx-f3", metadata.StateDestroyed, "test"); err != nil {
		t.Fatal(err)
	}
	if got := pending(); len(got) != 1 || got[0].SandboxID != "sbx-f2" {
		t.Fatalf("pending after one takeover and one destroy: %+v", got)
	}
	if err := s.DropDoneFailovers(ctx); err != nil {
		t.Fatal(err)
	}
	if got := pending(); len(got) != 1 || got[0].SandboxID != "sbx-f2" {
		t.Fatalf("pending after dropping the done ones: %+v", got)
	}

	sb := row("sbx-f4", false)
	sb.Node = "gone"
	if _, err := s.Insert(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if !claim("gone", "n1", metadata.FailoverAssignment{SandboxID: "sbx-f4", DeadNode: "gone", Target: "n3"}) {
		t.Fatal("claim with a plan lost")
	}
	g, err := s.GetNode(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.ClaimDeadNode(ctx, "gone", g.Epoch, "n2", metadata.FailoverAssignment{SandboxID: "sbx-f4", DeadNode: "gone", Target: "n2"}); err != nil || ok {
		t.Fatalf("second claim: %v %v", ok, err)
	}
	if got := pending(); len(got) != 2 || got[1] != (metadata.FailoverAssignment{SandboxID: "sbx-f4", DeadNode: "gone", Target: "n3"}) {
		t.Fatalf("pending after a claim with a plan and a losing one: %+v", got)
	}
}

// testDrainedNodeStaysDrained: a node drained and then stopped (cleanly
// or not) registers draining when it starts again; once undrained (live)
// it registers live.
func testDrainedNodeStaysDrained(t *testing.T, open Opener) {
	ctx := ctxT(t)
	fc := clock.NewFake(epoch)
	s := mustOpen(t, open, fc)
	n, err := s.RegisterNode(ctx, metadata.Node{ID: "c1", Addr: "127.0.0.1:1"}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetNodeState(ctx, "c1", n.Epoch, metadata.NodeDraining); err != nil {
		t.Fatal(err)
	}
	if err := s.SetNodeState(ctx, "c1", n.Epoch, metadata.NodeLeft); err != nil {
		t.Fatal(err)
	}
	if n, err = s.RegisterNode(ctx, metadata.Node{ID: "c1", Addr: "127.0.0.1:1"}, 5*time.Second); err != nil || n.State != metadata.NodeDraining {
		t.Fatalf("a drained node started again after a clean stop: %+v %v (want draining)", n, err)
	}
	fc.Advance(6 * time.Second)
	if ok, err := s.ClaimDeadNode(ctx, "c1", n.Epoch, "c2"); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	if n, err = s.RegisterNode(ctx, metadata.Node{ID: "c1", Addr: "127.0.0.1:1"}, 5*time.Second); err != nil || n.State != metadata.NodeDraining {
		t.Fatalf("a drained node started again after a takeover: %+v %v (want draining)", n, err)
	}
	if err := s.SetNodeState(ctx, "c1", n.Epoch, metadata.NodeLive); err != nil {
		t.Fatal(err)
	}
	if err := s.SetNodeState(ctx, "c1", n.Epoch, metadata.NodeLeft); err != nil {
		t.Fatal(err)
	}
	if n, err = s.RegisterNode(ctx, metadata.Node{ID: "c1", Addr: "127.0.0.1:1"}, 5*time.Second); err != nil || n.State != metadata.NodeLive {
		t.Fatalf("an undrained node started again: %+v %v (want live)", n, err)
	}
}
