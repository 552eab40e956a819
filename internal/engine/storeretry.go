package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/lib/failpoint"
)

// storeRetryFor bounds how long a checkpoint's commit step is retried
// while a store fails: past a store error or full-disk window (the chaos
// harness's last 0.3–4 s), so the cut already made is not thrown away
// and made again by the session's next attempt.
var storeRetryFor = 10 * time.Second

// storeRetry runs fn (a store call of step what) again with backoff (100 ms
// doubling to 1 s) while it fails with an error a retry may cure, for up
// to storeRetryFor after the first failure or until ctx ends. A lasting
// error — fenced, data loss, invalid, denied, a failed precondition, a
// conflict (the row moved on), not found — is returned at once. fn must
// be idempotent: the log's appends are (by event id), a row's commit is
// (from pending to the same state).
func (e *core) storeRetry(ctx context.Context, what string, fn func(context.Context) error) error {
	wait := 100 * time.Millisecond
	var first time.Time
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil || !retryableStoreError(err) || ctx.Err() != nil {
			return err
		}
		if first.IsZero() {
			first = time.Now()
		}
		if time.Since(first) >= storeRetryFor {
			return fmt.Errorf("%w (%s: gave up after %d attempts in %v)", err, what, attempt, storeRetryFor)
		}
		e.lg.Warn("store call failed; trying again", "step", what, "attempt", attempt, "retry_in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// retryableStoreError reports whether err may pass by itself (a store down,
// full or slow for a while). A simulated crash (failpoint.ErrCrash) is not.
func retryableStoreError(err error) bool {
	return !lastingStartError(err) && !errdefs.IsConflict(err) && !errdefs.IsNotFound(err) &&
		!errors.Is(err, errdefs.ErrAlreadyExists) && !errors.Is(err, context.Canceled) && !errors.Is(err, failpoint.ErrCrash)
}

// commitRow is the metadata store's CommitCheckpoint of ck, retried
// through a store error window (storeRetry).
//
// An attempt whose update was applied but whose answer was lost (the read
// after it failed) is not applied twice: a retry first reads the row, and
// one already committed with ck's log position is the commit.
func (e *core) commitRow(ctx context.Context, ck meta.Checkpoint) (meta.Checkpoint, error) {
	out, tried := ck, false
	err := e.storeRetry(ctx, "commit the checkpoint's row", func(ctx context.Context) error {
		if tried {
			cur, err := e.meta.Checkpoint(ctx, ck.ID)
			if err != nil {
				return err
			}
			if cur.State == meta.CheckpointCommitted && cur.EventSeq == ck.EventSeq {
				out = cur
				return nil
			}
		}
		tried = true
		var err error
		out, err = e.meta.CommitCheckpoint(ctx, ck)
		return err
	})
	return out, err
}

// failRow marks pending checkpoint id failed (why), retried through a
// store error window (storeRetry; even once ctx ended): a row left
// pending waited for the next start to be settled.
func (e *core) failRow(ctx context.Context, id string, why error) error {
	tried := false
	return e.storeRetry(context.WithoutCancel(ctx), "record a failed checkpoint", func(ctx context.Context) error {
		if tried { // applied, its answer lost?
			if cur, err := e.meta.Checkpoint(ctx, id); err == nil && cur.State == meta.CheckpointFailed {
				return nil
			}
		}
		tried = true
		_, err := e.meta.SetCheckpointState(ctx, id, meta.CheckpointFailed, why.Error(), meta.CheckpointPending)
		return err
	})
}
