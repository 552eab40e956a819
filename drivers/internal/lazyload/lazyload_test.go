package lazyload

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// WaitForCut: no load, an ended one, a failed one, one still running
// (Unavailable after max) and a caller that gives up.
func TestWaitForCut(t *testing.T) {
	ctx := context.Background()
	var none *Load
	if err := none.WaitForCut(ctx, "s", time.Millisecond); err != nil {
		t.Errorf("no load: %v", err)
	}
	ok := New()
	ok.End(nil)
	if err := ok.WaitForCut(ctx, "s", time.Second); err != nil {
		t.Errorf("an ended load: %v", err)
	}
	bad := New()
	bad.End(errors.New("lazy-pages died"))
	if err := bad.WaitForCut(ctx, "s", time.Second); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a failed load: %v, want FailedPrecondition", err)
	}
	running := New()
	if err := running.WaitForCut(ctx, "s", 20*time.Millisecond); !errdefs.IsUnavailable(err) {
		t.Errorf("a load still running: %v, want Unavailable", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := running.WaitForCut(cctx, "s", time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("a caller that gave up: %v, want context.Canceled", err)
	}
	go func() { time.Sleep(20 * time.Millisecond); running.End(nil) }()
	if err := running.WaitForCut(ctx, "s", time.Minute); err != nil {
		t.Errorf("a load that ends while the cut waits: %v", err)
	}
}
