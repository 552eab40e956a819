package logtest

import (
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

const ttl = 10 * time.Second

func (e *env) acquire(t *testing.T, stream, holder string) eventlog.Lease {
	t.Helper()
	l, err := e.store.Acquire(e.ctx, stream, holder, ttl)
	if err != nil {
		t.Fatalf("Acquire(%s, %s) at %v: %v", stream, holder, e.clk.Now(), err)
	}
	if l.Stream != stream || l.Holder != holder || l.Epoch == 0 || !l.Expires.Equal(e.clk.Now().Add(ttl)) {
		t.Fatalf("Acquire(%s, %s) at %v = %+v, want that stream and holder, epoch > 0, expiring at now+%v", stream, holder, e.clk.Now(), l, ttl)
	}
	return l
}

func (e *env) wantLease(t *testing.T, want eventlog.Lease) {
	t.Helper()
	got, err := e.store.CurrentLease(e.ctx, want.Stream)
	if err != nil {
		t.Fatalf("CurrentLease(%s): %v", want.Stream, err)
	}
	if got.Stream != want.Stream || got.Holder != want.Holder || got.Epoch != want.Epoch || !got.Expires.Equal(want.Expires) {
		t.Fatalf("CurrentLease(%s) = %+v, want %+v", want.Stream, got, want)
	}
}

// testLeases: one holder at a time until expiry; every grant a higher
// epoch; a stale holder is fenced.
func testLeases(t *testing.T, e *env) {
	s := e.stream("lease")
	l1 := e.acquire(t, s, "A")
	e.wantLease(t, l1)
	_, err := e.store.Acquire(e.ctx, s, "B", ttl)
	wantErr(t, err, errdefs.ErrConflict, "Acquire by B while A holds the lease")
	e.clk.Advance(ttl - time.Second)
	_, err = e.store.Acquire(e.ctx, s, "B", ttl)
	wantErr(t, err, errdefs.ErrConflict, "Acquire by B a second before A's lease expires")

	// A renews: the lease now runs ttl from now, same epoch.
	l1r, err := e.store.Renew(e.ctx, l1, ttl)
	if err != nil || l1r.Epoch != l1.Epoch || l1r.Holder != "A" || !l1r.Expires.Equal(e.clk.Now().Add(ttl)) {
		t.Fatalf("Renew = %+v, %v; want epoch %d expiring at %v", l1r, err, l1.Epoch, e.clk.Now().Add(ttl))
	}
	e.wantLease(t, l1r)
	e.clk.Advance(ttl - time.Second) // past l1's first expiry, within the renewal
	_, err = e.store.Acquire(e.ctx, s, "B", ttl)
	wantErr(t, err, errdefs.ErrConflict, "Acquire by B within A's renewed lease")

	e.clk.Advance(2 * time.Second) // A's lease expired
	l2 := e.acquire(t, s, "B")
	if l2.Epoch <= l1.Epoch {
		t.Fatalf("epoch went from %d to %d", l1.Epoch, l2.Epoch)
	}
	e.wantLease(t, l2)
	_, err = e.store.Renew(e.ctx, l1r, ttl)
	wantErr(t, err, errdefs.ErrFenced, "Renew by the stale holder A")
	err = e.store.Release(e.ctx, l1r)
	wantErr(t, err, errdefs.ErrFenced, "Release by the stale holder A")
	e.wantLease(t, l2)
	_, err = e.store.Acquire(e.ctx, s, "A", ttl)
	wantErr(t, err, errdefs.ErrConflict, "Acquire by A while B holds the lease")

	// B re-acquiring fences its own earlier incarnation.
	l3 := e.acquire(t, s, "B")
	if l3.Epoch <= l2.Epoch {
		t.Fatalf("re-acquire: epoch went from %d to %d", l2.Epoch, l3.Epoch)
	}
	_, err = e.store.Renew(e.ctx, l2, ttl)
	wantErr(t, err, errdefs.ErrFenced, "Renew by B's earlier incarnation")

	// Release ends the lease now but keeps the epoch; the next grant is
	// higher and needs no waiting.
	if err := e.store.Release(e.ctx, l3); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if cur, err := e.store.CurrentLease(e.ctx, s); err != nil || cur.Epoch != l3.Epoch || cur.Expires.After(e.clk.Now()) {
		t.Fatalf("CurrentLease after Release = %+v, %v; want epoch %d, expired", cur, err, l3.Epoch)
	}
	l4 := e.acquire(t, s, "A")
	if l4.Epoch <= l3.Epoch {
		t.Fatalf("after release: epoch went from %d to %d", l3.Epoch, l4.Epoch)
	}

	// Leases of other streams are independent.
	s2 := e.stream("lease-other")
	e.acquire(t, s2, "B")
	e.wantLease(t, l4)
}

// testLeaseFencing: appends carry the epoch; an older one is refused in the
// same transaction as the append.
func testLeaseFencing(t *testing.T, e *env) {
	s := e.stream("fence")
	e.append(t, s, 0, 0, ev(s, "e1", 1)) // no lease yet: epoch 0 is current
	la := e.acquire(t, s, "A")
	_, err := e.store.Append(e.ctx, s, 0, 1, ev(s, "zero", 1))
	wantErr(t, err, errdefs.ErrFenced, "append with epoch 0 under a lease")
	e.append(t, s, la.Epoch, 1, ev(s, "e2", 2))

	e.clk.Advance(ttl + time.Second)
	lb := e.acquire(t, s, "B")
	_, err = e.store.Append(e.ctx, s, la.Epoch, 2, ev(s, "stale", 1))
	wantErr(t, err, errdefs.ErrFenced, "append by A after B took the lease")
	_, err = e.store.Append(e.ctx, s, la.Epoch, eventlog.Any, ev(s, "stale-any", 1))
	wantErr(t, err, errdefs.ErrFenced, "append by A (expecting Any) after B took the lease")
	e.wantBounds(t, s, 1, 2)
	e.append(t, s, lb.Epoch, 2, ev(s, "e3", 3))

	// Fencing is by epoch, not by time: B's expired but untaken lease
	// still writes.
	e.clk.Advance(ttl + time.Second)
	e.append(t, s, lb.Epoch, 3, ev(s, "e4", 4))

	lb2 := e.acquire(t, s, "B")
	_, err = e.store.Append(e.ctx, s, lb.Epoch, 4, ev(s, "self-stale", 1))
	wantErr(t, err, errdefs.ErrFenced, "append with B's epoch before its re-acquire")
	e.append(t, s, lb2.Epoch, 4, ev(s, "e5", 5))

	got := e.readAll(t, s, 1)
	wantSeqs(t, "fenced stream", got, 1, 5)
	for i, ev := range got {
		if want := s + "#e" + string(rune('1'+i)); ev.ID != want {
			t.Fatalf("event %d is %s, want %s: a fenced append landed", ev.Seq, ev.ID, want)
		}
	}
	// A fenced append's ids were not recorded.
	if res := e.append(t, s, lb2.Epoch, 5, ev(s, "stale", 1)); res.Duplicate {
		t.Fatalf("id of a fenced append was recorded: %+v", res)
	}
}

// testLeaseBadInput: malformed lease calls are InvalidArgument.
func testLeaseBadInput(t *testing.T, e *env) {
	s := e.stream("lease-bad")
	l := e.acquire(t, s, "A")
	for name, call := range map[string]func() error{
		"Acquire empty holder": func() error { _, err := e.store.Acquire(e.ctx, s, "", ttl); return err },
		"Acquire ttl 0":        func() error { _, err := e.store.Acquire(e.ctx, s, "A", 0); return err },
		"Acquire ttl < 0":      func() error { _, err := e.store.Acquire(e.ctx, s, "A", -time.Second); return err },
		"Acquire bad stream":   func() error { _, err := e.store.Acquire(e.ctx, "", "A", ttl); return err },
		"Renew ttl 0":          func() error { _, err := e.store.Renew(e.ctx, l, 0); return err },
		"Renew bad stream": func() error {
			x := l
			x.Stream = "bad\x00"
			_, err := e.store.Renew(e.ctx, x, ttl)
			return err
		},
		"Release bad stream": func() error {
			x := l
			x.Stream = ""
			return e.store.Release(e.ctx, x)
		},
		"CurrentLease bad stream": func() error { _, err := e.store.CurrentLease(e.ctx, "a\nb"); return err },
	} {
		wantErr(t, call(), errdefs.ErrInvalidArgument, "%s", name)
	}
	e.wantLease(t, l)
}
