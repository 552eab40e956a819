package logtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/eventlog"
)

// collect takes n events from sub.
func collect(ctx context.Context, sub *eventlog.Subscription, n int) ([]eventlog.Event, error) {
	out := make([]eventlog.Event, 0, n)
	for len(out) < n {
		x, err := sub.Next(ctx)
		if err != nil {
			return out, fmt.Errorf("after %d events: %w", len(out), err)
		}
		out = append(out, x)
	}
	return out, nil
}

// wantQuiet checks that sub has nothing more to deliver.
func wantQuiet(t *testing.T, ctx context.Context, sub *eventlog.Subscription) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 3*eventlog.PollInterval)
	defer cancel()
	if x, err := sub.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("subscription delivered more: event %d (%s), %v", x.Seq, x.ID, err)
	}
}

// sameIDs checks that got and want are the same events in the same order.
func sameIDs(t *testing.T, what string, got, want []eventlog.Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d events %s, want %d %s", what, len(got), seqList(got), len(want), seqList(want))
	}
	for i := range got {
		if got[i].Seq != want[i].Seq || got[i].ID != want[i].ID {
			t.Fatalf("%s: event %d is %d/%s, want %d/%s", what, i, got[i].Seq, got[i].ID, want[i].Seq, want[i].ID)
		}
	}
}

// testSubscribeLive: a subscriber started before concurrent appends gets
// every event exactly once, in order.
func testSubscribeLive(t *testing.T, e *env) {
	s := e.stream("sub-live")
	const appenders, each = 4, 40
	sub := eventlog.Subscribe(e.store, s, 1)
	type result struct {
		evs []eventlog.Event
		err error
	}
	got := make(chan result, 1)
	go func() {
		evs, err := collect(e.ctx, sub, appenders*each)
		got <- result{evs, err}
	}()
	var wg sync.WaitGroup
	for a := range appenders {
		wg.Go(func() {
			for i := range each {
				x := ev(s, fmt.Sprintf("a%d-%d", a, i), i)
				if _, err := e.store.Append(e.ctx, s, 0, eventlog.Any, x); err != nil {
					t.Errorf("append: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	r := <-got
	if r.err != nil {
		t.Fatalf("subscription: %v", r.err)
	}
	wantSeqs(t, "subscription", r.evs, 1, appenders*each)
	sameIDs(t, "subscription vs Read", r.evs, e.readAll(t, s, 1))
	wantQuiet(t, e.ctx, sub)
	if sub.Position() != appenders*each+1 {
		t.Fatalf("Position() = %d, want %d", sub.Position(), appenders*each+1)
	}
}

// testSubscribeReconnect: a subscriber that drops after k events and comes
// back from last+1 sees the rest exactly once, including what was appended
// while it was away.
func testSubscribeReconnect(t *testing.T, e *env) {
	s := e.stream("sub-reconnect")
	e.append(t, s, 0, 0, evs(s, "a", 30)...)
	first, err := collect(e.ctx, eventlog.Subscribe(e.store, s, 1), 12)
	if err != nil {
		t.Fatal(err)
	}
	last := first[len(first)-1].Seq // the client remembers this; the subscription is dropped
	e.append(t, s, 0, 30, evs(s, "b", 10)...)
	sub := eventlog.Subscribe(e.store, s, last+1)
	var wg sync.WaitGroup
	wg.Go(func() { // more arrive while it catches up
		for i := range 5 {
			if _, err := e.store.Append(e.ctx, s, 0, eventlog.Any, ev(s, fmt.Sprintf("c%d", i), i)); err != nil {
				t.Errorf("append: %v", err)
			}
		}
	})
	rest, err := collect(e.ctx, sub, 45-12)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	sameIDs(t, "before and after the reconnect", append(first, rest...), e.readAll(t, s, 1))
	wantQuiet(t, e.ctx, sub)
}

// testSubscribeWakes: a subscriber waiting at the head gets an append made
// after it started waiting, promptly.
func testSubscribeWakes(t *testing.T, e *env) {
	s := e.stream("sub-wake")
	sub := eventlog.Subscribe(e.store, s, 0) // 0 means from the beginning
	got := make(chan eventlog.Event, 1)
	errc := make(chan error, 1)
	go func() {
		x, err := sub.Next(e.ctx)
		if err != nil {
			errc <- err
			return
		}
		got <- x
	}()
	time.Sleep(2 * eventlog.PollInterval) // let it reach the wait
	e.append(t, s, 0, 0, ev(s, "wake", 1))
	select {
	case x := <-got:
		if x.Seq != 1 || x.ID != s+"#wake" {
			t.Fatalf("woke with %d/%s", x.Seq, x.ID)
		}
	case err := <-errc:
		t.Fatalf("Next: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("subscriber did not see the append within 10s")
	}
}
