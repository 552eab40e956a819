package logtest

import (
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// testReopen: events, bounds, leases and ids survive closing and reopening
// the store.
func testReopen(t *testing.T, e *env) {
	if e.opts.Reopen == nil {
		t.Skip("backend has no Reopen hook")
	}
	s := e.checkpointed(t, "reopen", 6, 4)
	if err := e.store.Truncate(e.ctx, s, 3); err != nil {
		t.Fatal(err)
	}
	l := e.acquire(t, s, "A")
	before := e.readAll(t, s, 3)

	e.store = e.opts.Reopen(t, e.store, e.clk)

	e.wantBounds(t, s, 3, 6)
	after := e.readAll(t, s, 3)
	sameIDs(t, "after reopen", after, before)
	for i := range after {
		if d := sameEvent(after[i], before[i]); d != "" {
			t.Fatalf("event %d changed across reopen: %s", after[i].Seq, d)
		}
	}
	e.wantLease(t, l)
	_, err := e.store.Acquire(e.ctx, s, "B", time.Second)
	wantErr(t, err, errdefs.ErrConflict, "Acquire by B of A's lease after reopen")
	// Ids are still known: a re-send is a duplicate, a new append continues.
	if res, err := e.store.Append(e.ctx, s, l.Epoch, 0, evs(s, "e", 6)[5]); err != nil || !res.Duplicate || res.First != 6 {
		t.Fatalf("re-append after reopen = %+v, %v; want duplicate at 6", res, err)
	}
	if res := e.append(t, s, l.Epoch, 6, ev(s, "new", 1)); res.First != 7 {
		t.Fatalf("append after reopen = %+v, want 7", res)
	}
}

// testClosed: a closed store refuses calls with an error (no panic, no
// hang), and a second Close is harmless.
func testClosed(t *testing.T, e *env) {
	s := e.stream("closed")
	e.append(t, s, 0, 0, ev(s, "a", 1))
	if err := e.store.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := e.store.Append(e.ctx, s, 0, eventlog.Any, ev(s, "b", 1)); err == nil {
		t.Fatal("Append on a closed store succeeded")
	}
	if _, err := e.store.Read(e.ctx, s, 1, 10); err == nil {
		t.Fatal("Read on a closed store succeeded")
	}
	if _, err := e.store.Acquire(e.ctx, s, "A", time.Second); err == nil {
		t.Fatal("Acquire on a closed store succeeded")
	}
	e.store.Close()
}
