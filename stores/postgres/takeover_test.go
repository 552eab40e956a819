package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// TestTakeOverFencesTheDeadHolder: nodes racing to take a live (unexpired)
// lease over from a dead holder: exactly one wins, with the next epoch; the
// dead holder's appends and renewals are refused from then on; the winner
// retrying gets its lease back; a stream without a lease is acquired.
func TestTakeOverFencesTheDeadHolder(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, clock.NewFake(t0))
	old, err := s.Acquire(ctx, "sandbox/t", "node-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, "sandbox/t", old.Epoch, eventlog.Any, ev("t1", `{}`)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var wins atomic.Int32
	var won atomic.Value
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := s.TakeOver(ctx, "sandbox/t", "node-a", fmt.Sprintf("node-%d", i), time.Minute)
			switch {
			case err == nil:
				wins.Add(1)
				won.Store(l)
			case !errdefs.IsConflict(err):
				t.Errorf("take over: %v", err)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d winners, want 1", wins.Load())
	}
	l := won.Load().(eventlog.Lease)
	if l.Epoch != old.Epoch+1 {
		t.Fatalf("new epoch %d, want %d", l.Epoch, old.Epoch+1)
	}
	_, err = s.Append(ctx, "sandbox/t", old.Epoch, eventlog.Any, ev("t2", `{}`))
	wantKind(t, err, errdefs.ErrFenced)
	_, err = s.Renew(ctx, old, time.Hour)
	wantKind(t, err, errdefs.ErrFenced)
	if _, err := s.Append(ctx, "sandbox/t", l.Epoch, eventlog.Any, ev("t3", `{}`)); err != nil {
		t.Fatal(err)
	}
	again, err := s.TakeOver(ctx, "sandbox/t", "node-a", l.Holder, time.Minute)
	if err != nil || again.Epoch != l.Epoch {
		t.Fatalf("retry by the winner: %+v %v", again, err)
	}
	fresh, err := s.TakeOver(ctx, "sandbox/never", "node-a", "node-b", time.Minute)
	if err != nil || fresh.Epoch != 1 || fresh.Holder != "node-b" {
		t.Fatalf("stream without a lease: %+v %v", fresh, err)
	}
}
