package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// TestCutLockWaitsHaveDeadlines: both sides of a sandbox's cut lock wait
// with a deadline (cutLocks): a cut behind a call, a call behind a cut,
// each fails Unavailable saying retry; a waiting cut holds new calls back
// (writers first, as sync.RWMutex), and a cut that gave up lets them on.
func TestCutLockWaitsHaveDeadlines(t *testing.T) {
	const wait = 100 * time.Millisecond
	c := &cutLocks{cutWait: wait, callWait: wait}
	ctx := context.Background()
	call, err := c.call(ctx, "sbx-a")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.cut(ctx, "sbx-a", "checkpoint"); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "sbx-a") || !strings.Contains(err.Error(), "retry") {
		t.Fatalf("a cut behind a call: %v", err)
	}
	if d := time.Since(start); d < wait || d > 5*time.Second {
		t.Fatalf("the cut waited %v, want %v", d, wait)
	}
	// A writer waiting (longer) holds a new reader back; once it gives up
	// the reader gets in.
	m := c.get("sbx-a")
	wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- m.lock(wctx) }()
	for m.tryRLock() {
		m.runlock()
		time.Sleep(time.Millisecond)
	}
	second := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		second <- m.rlock(rctx)
	}()
	select {
	case err := <-second:
		t.Fatalf("a reader passed a waiting writer: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := <-gaveUp; err == nil {
		t.Fatal("the writer got the lock while a reader held it")
	}
	if err := <-second; err != nil {
		t.Fatalf("the reader behind a writer that gave up: %v", err)
	}
	m.runlock()
	call()
	// A call behind a cut.
	cut, err := c.cut(ctx, "sbx-a", "checkpoint")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.call(ctx, "sbx-a"); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "retry") {
		t.Fatalf("a call behind a cut: %v", err)
	}
	// The caller's own end is its error, not Unavailable.
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if _, err := c.call(cctx, "sbx-a"); err != context.Canceled {
		t.Fatalf("a cancelled call behind a cut: %v", err)
	}
	cut()
	release, err := c.call(ctx, "sbx-a")
	if err != nil {
		t.Fatalf("a call after the cut: %v", err)
	}
	release()
}
