package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// startRetryFor bounds how long `amber up` retries one start-up step: far
// past a store's transient error (a read or a write refused, a database
// restarting), short enough that a misconfiguration still ends the start
// with its error.
var startRetryFor = 2 * time.Minute

// startRetry runs fn, a start-up step's store calls, again with backoff
// (100 ms doubling to 5 s) while it fails with an error a retry may cure,
// for up to startRetryFor or until ctx ends: a daemon heals from a
// transient store fault at start instead of exiting 1 (issue 23: a
// metadata write refused once at the admin key's registration, or a read
// at the sessions' wake, ended `amber up`). A lasting error (fenced, data
// loss, invalid, denied, failed precondition) ends the start at once. fn
// must be safe to run again (the steps wrapped are: each converges).
func startRetry(ctx context.Context, lg *slog.Logger, what string, fn func(context.Context) error) error {
	wait := 100 * time.Millisecond
	start := time.Now()
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil || lastingStart(err) || ctx.Err() != nil {
			return err
		}
		if time.Since(start) >= startRetryFor {
			return fmt.Errorf("%s: %w (gave up after %d attempts in %v)", what, err, attempt, startRetryFor)
		}
		lg.Warn("start: a step failed; trying it again", "step", what, "attempt", attempt, "retry_in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w (gave up after %d attempts: %v)", what, err, attempt, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// lastingStart reports whether err is of a kind a retry cannot cure.
func lastingStart(err error) bool {
	return errdefs.IsFenced(err) || errdefs.IsDataLoss(err) || errdefs.IsInvalidArgument(err) ||
		errors.Is(err, errdefs.ErrPermissionDenied) || errors.Is(err, errdefs.ErrFailedPrecondition)
}
