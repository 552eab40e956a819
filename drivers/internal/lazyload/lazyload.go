// Package lazyload is the outcome of a lazy restore's background load as
// both drivers keep it (criu: `criu lazy-pages`; gvisor: `runsc restore
// --background`): ended once, with nil when every page is in, and waited
// for by a cut, which must not freeze the sandbox while pages are still
// only in the old image.
package lazyload

import (
	"context"
	"fmt"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// Load is one lazy restore's load.
type Load struct {
	done chan struct{} // closed by End; err is set before
	err  error
}

// New returns a load that has not ended.
func New() *Load { return &Load{done: make(chan struct{})} }

// End records the load's outcome (nil: every page is in; else why not)
// and wakes every waiter. It is called once.
func (l *Load) End(err error) {
	l.err = err
	close(l.done)
}

// WaitForCut waits, up to max or until ctx ends, for l to end: a cut of
// sandbox id begins after it. A load still running after max is
// Unavailable (the sandbox keeps running); one that failed fails the cut.
// A nil l is no load.
func (l *Load) WaitForCut(ctx context.Context, id string, max time.Duration) error {
	if l == nil {
		return nil
	}
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-l.done:
	case <-t.C:
		return errdefs.Unavailablef("checkpoint %s: its lazy restore is still loading memory after %v; the sandbox keeps running", id, max)
	case <-ctx.Done():
		return fmt.Errorf("checkpoint %s: waiting for its lazy restore to load every page: %w", id, ctx.Err())
	}
	if l.err != nil {
		return errdefs.FailedPreconditionf("checkpoint %s: %v", id, l.err)
	}
	return nil
}
