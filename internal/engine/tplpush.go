package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/amber-run/amber/internal/state/meta"
)

// Template versions into the blob store (step 0 of a checkpoint's
// durability order, checkpoint.go).
//
// A sandbox's first checkpoint used to push its template version — the
// python template is 132 MB — inside the cut, once: a blob store error
// window during that push failed the checkpoint, and the session's next
// Wake began the push again from the start (the chaos run's longest
// recoveries). Now a version is pushed ahead, in the background, when a
// sandbox that will be checkpointed (a recovery policy other than none)
// is created and, at start, for the node's recorded sandboxes; and every
// push, the cut's too, is tried again while it fails with an error a retry
// may cure (pushTemplate). A cut that comes while the background push is
// on waits for it (the template store runs one push of a version at a
// time) instead of starting its own.

// templatePushFor bounds how long a push is retried after its first
// failure: longer than a blob store error window (the chaos harness's are
// 0.3–4 s) plus one push of the largest template on a loaded machine.
var templatePushFor = 30 * time.Second

// pushTemplate pushes version digest to the blob store, again with backoff
// (100 ms doubling to 1 s) while it fails with an error a retry may cure,
// for up to templatePushFor after the first failure or until ctx ends.
func (e *core) pushTemplate(ctx context.Context, digest string) error {
	wait := 100 * time.Millisecond
	var first time.Time
	for attempt := 1; ; attempt++ {
		err := e.tpl.cat.Store().Push(ctx, digest)
		if err == nil || lastingStartError(err) || ctx.Err() != nil {
			return err
		}
		if first.IsZero() {
			first = time.Now()
		}
		if time.Since(first) >= templatePushFor {
			return fmt.Errorf("%w (gave up after %d attempts in %v)", err, attempt, templatePushFor)
		}
		e.lg.Warn("template push failed; trying again", "version", digest, "attempt", attempt, "retry_in", wait, "err", err)
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

// templatePushed makes sure checkpoint ck's template version is in the
// blob store (pushTemplate): before the checkpoint's own chunks, manifest
// and pointer. A strict checkpoint committed on the node first (upload.go)
// needs it only before its upload — so the first cut of a sandbox does not
// wait for a 132 MB push (or its retries through a store error window, or
// its restart after a daemon kill): the upload behind does.
func (e *core) templatePushed(ctx context.Context, ck meta.Checkpoint) error {
	digest, err := e.tpl.cat.Digest(ctx, ck.Template, ck.TemplateVersion)
	if err == nil {
		err = e.pushTemplate(ctx, digest)
	}
	if err != nil {
		return fmt.Errorf("store template %s version %s: %w", ck.Template, ck.TemplateVersion, err)
	}
	return nil
}

// pushAhead pushes the template versions of sbs (those with a recovery
// policy other than none) in the background, one at a time. Without a
// blob store, or before Start, it does nothing.
func (e *core) pushAhead(sbs ...meta.Sandbox) {
	if !e.tpl.cat.Store().HasBlobs() || e.bg.ctx == nil || e.bg.ctx.Err() != nil {
		return
	}
	seen := map[string]bool{}
	var want []meta.Sandbox
	for _, sb := range sbs {
		k := sb.Template + "@" + sb.TemplateVersion
		if sb.Policy == "" || sb.Policy == PolicyNone || seen[k] {
			continue
		}
		seen[k] = true
		want = append(want, sb)
	}
	if len(want) == 0 {
		return
	}
	ctx := e.bg.ctx
	e.bg.wg.Add(1)
	go func() {
		defer e.bg.wg.Done()
		for _, sb := range want {
			digest, err := e.tpl.cat.Digest(ctx, sb.Template, sb.TemplateVersion)
			if err == nil {
				err = e.pushTemplate(ctx, digest)
			}
			if err != nil && ctx.Err() == nil {
				e.lg.Warn("template push ahead failed; the sandbox's first checkpoint pushes it", "sandbox_id", sb.ID, "template", sb.Template, "err", err)
			}
		}
	}()
}

// pushAheadRecorded is pushAhead for this node's recorded sandboxes that
// run or may come back (at start).
func (e *core) pushAheadRecorded(ctx context.Context) {
	rows, err := e.meta.List(ctx, e.mine(meta.Filter{States: []meta.State{meta.StateRunning, meta.StateStopped, meta.StateCrashed}}))
	if err != nil {
		e.lg.Warn("template push ahead: list sandboxes", "err", err)
		return
	}
	var sbs []meta.Sandbox
	for _, sb := range rows {
		if !sb.Pooled {
			sbs = append(sbs, sb)
		}
	}
	e.pushAhead(sbs...)
}
