package engine

// Sandboxes' metadata and deadlines (timeouts).
//
// Metadata are the owner's labels, string to string, given at create and
// kept in the sandbox's row; List selects by them (every pair given must
// match) and by state. Keys beginning "amber." are Amber's own: a
// caller's create may not set them (labels.go).
//
// A deadline (meta.Sandbox.Expires) is given at create as a timeout from
// then and moved by SetTimeout (a new timeout from now; 0 removes it). It
// is kept in the sandbox's row, so it survives a daemon restart. Past it
// the expiry loop (expiryLoop) acts on the sandbox once:
//
//   - OnExpire kill (the default): a running sandbox is killed (stopped,
//     reason expiredReason, its files kept until destroyed); one the engine
//     had stopped itself (idle, paused, budget) is marked so too, and the
//     next call no longer resumes it.
//   - OnExpire destroy: the sandbox is destroyed, whatever its state
//     (E2B's kill at a timeout: nothing is left).
//   - OnExpire pause: a running sandbox is checkpointed and stopped with
//     reason pauseReason; the next call (or Resume) resumes it from that
//     checkpoint, as an idle one. An idle-stopped one is left as it is
//     (it is paused already).
//
// Either way the deadline is then cleared: it acts once. An idle stop
// before the deadline does not clear it, and a resumed sandbox keeps it.
// Pause (the API's) clears the deadline as well: a paused sandbox waits
// for its resume, however long.

import (
	"context"
	"errors"
	"maps"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/meta"
)

// The bounds of a sandbox's metadata and timeout.
const (
	MaxMetadataPairs = 64
	MaxMetadataKey   = 128
	MaxMetadataValue = 1024
	MaxTimeout       = 30 * 24 * time.Hour
)

// pauseReason is the reason of a sandbox paused (checkpointed and stopped)
// on request or at its deadline; the next call resumes it, as idle ones.
const pauseReason = "paused: checkpointed and stopped; the next call resumes it"

// expiredReason is the reason of a sandbox killed at its deadline.
const expiredReason = "timed out: killed at its deadline"

// expiryEvery is how often the expiry loop looks for sandboxes past their
// deadline.
const expiryEvery = 250 * time.Millisecond

// ValidateMetadata checks a caller's metadata for a new sandbox: at most
// MaxMetadataPairs pairs, no key of Amber's own (ReservedLabel, labels.go),
// keys of 1 to MaxMetadataKey printable characters without '=' or ','
// (a filter names a pair as key=value), values of at most
// MaxMetadataValue bytes of UTF-8 without NUL.
func ValidateMetadata(md map[string]string) error { return validateMetadata(md, false) }

// validateMetadata is ValidateMetadata; reservedOK lets the keys of
// Amber's own labels through (Amber's own creates).
func validateMetadata(md map[string]string, reservedOK bool) error {
	if len(md) > MaxMetadataPairs {
		return errdefs.InvalidArgumentf("metadata has %d pairs; at most %d", len(md), MaxMetadataPairs)
	}
	if !reservedOK {
		if err := checkReservedLabels(md); err != nil {
			return err
		}
	}
	for k, v := range md {
		if err := ValidateMetadataKey(k); err != nil {
			return err
		}
		if len(v) > MaxMetadataValue || !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
			return errdefs.InvalidArgumentf("metadata %.40q: the value must be UTF-8 without NUL, at most %d bytes", k, MaxMetadataValue)
		}
	}
	return nil
}

// ValidateMetadataKey checks one metadata key (ValidateMetadata).
func ValidateMetadataKey(k string) error {
	if k == "" || len(k) > MaxMetadataKey {
		return errdefs.InvalidArgumentf("metadata key %.40q: want 1 to %d characters", k, MaxMetadataKey)
	}
	for _, c := range k {
		if c <= ' ' || c == 0x7f || c == '=' || c == ',' || c == utf8.RuneError {
			return errdefs.InvalidArgumentf("metadata key %.40q: no spaces, control characters, '=' or ','", k)
		}
	}
	return nil
}

// ValidateTimeout checks a sandbox's timeout (0: none) and what happens
// at its end ("" or "kill", "pause").
func ValidateTimeout(d time.Duration, onExpire string) error {
	if d < 0 || d > MaxTimeout {
		return errdefs.InvalidArgumentf("timeout %v: want 0 (none) to %v", d, MaxTimeout)
	}
	switch onExpire {
	case meta.ExpireKill, "kill", meta.ExpirePause, meta.ExpireDestroy:
		return nil
	}
	return errdefs.InvalidArgumentf("on_timeout %.40q: want kill, pause or destroy", onExpire)
}

func normExpire(s string) string {
	if s == "kill" {
		return meta.ExpireKill
	}
	return s
}

// checkAnnotations refuses r's bad metadata or timeout before anything is
// made.
func (e *Engine) checkAnnotations(r CreateRequest) error {
	if err := validateMetadata(r.Metadata, r.ReservedLabels); err != nil {
		return err
	}
	if err := ValidateTimeout(r.Timeout, r.OnTimeout); err != nil {
		return err
	}
	if normExpire(r.OnTimeout) == meta.ExpirePause {
		if _, err := e.checkpointStore(); err != nil {
			return errdefs.InvalidArgumentf("on_timeout pause: %v", err)
		}
	}
	return nil
}

// annotate records r's metadata (when the create did not: it is in the
// row of a sandbox made or claimed for r) and deadline on new sandbox sb,
// before the caller gets it.
func (e *Engine) annotate(ctx context.Context, sb meta.Sandbox, r CreateRequest) (meta.Sandbox, error) {
	var err error
	if len(r.Metadata) > 0 && !maps.Equal(sb.Metadata, r.Metadata) {
		if sb, err = e.meta.SetMetadata(ctx, sb.ID, r.Metadata); err != nil {
			return sb, err
		}
	}
	if r.Timeout > 0 || r.OnTimeout != "" {
		var at time.Time
		if r.Timeout > 0 {
			at = e.clock.Now().Add(r.Timeout)
		}
		sb, err = e.meta.SetExpiry(ctx, sb.ID, at, normExpire(r.OnTimeout))
	}
	return sb, err
}

// ListFilter selects sandboxes for Find.
type ListFilter struct {
	States   []meta.State      // empty: every state but destroyed
	Metadata map[string]string // every pair must match
}

// Find returns tenant's sandboxes matching f, oldest first.
func (e *Engine) Find(ctx context.Context, tenant string, f ListFilter) ([]meta.Sandbox, error) {
	for _, st := range f.States {
		switch st {
		case meta.StateCreating, meta.StateRestoring, meta.StateRunning, meta.StateStopped, meta.StateCrashed, meta.StateDestroyed:
		default:
			return nil, errdefs.InvalidArgumentf("state %.40q: want creating, restoring, running, stopped, crashed or destroyed", st)
		}
	}
	for k := range f.Metadata {
		if err := ValidateMetadataKey(k); err != nil {
			return nil, err
		}
	}
	return e.meta.List(ctx, meta.Filter{Tenant: &tenant, States: f.States, Metadata: f.Metadata})
}

// SetTimeout gives sandbox id a new deadline, d from now (0: none). The
// sandbox must be running or stopped by the engine (idle, paused).
func (e *Engine) SetTimeout(ctx context.Context, tenant, id string, d time.Duration) (meta.Sandbox, error) {
	if err := ValidateTimeout(d, ""); err != nil {
		return meta.Sandbox{}, err
	}
	sb, err := e.Get(ctx, tenant, id)
	if err != nil {
		return sb, err
	}
	defer e.lock(id)()
	if sb, err = e.meta.Get(ctx, id); err != nil {
		return sb, err
	}
	if err := e.ownedHere(sb); err != nil {
		return sb, err
	}
	if sb.State != meta.StateRunning && !e.suspended(sb) {
		return sb, errdefs.FailedPreconditionf("sandbox %s is %s (%s): only a running or paused sandbox takes a timeout", id, sb.State, sb.Reason)
	}
	var at time.Time
	if d > 0 {
		at = e.clock.Now().Add(d)
	}
	return e.meta.SetExpiry(ctx, id, at, sb.OnExpire)
}

// Paused reports whether sb is stopped by Pause or its deadline, or for
// being idle: resumed by the next call, or by Resume.
func Paused(sb meta.Sandbox) bool { return idleStopped(sb) }

// Pause checkpoints running sandbox id and stops it (reason pauseReason);
// the next call resumes it, or Resume. Its deadline is cleared.
func (e *Engine) Pause(ctx context.Context, tenant, id string) (meta.Checkpoint, error) {
	ck, err := e.Checkpoint(ctx, CheckpointRequest{Tenant: tenant, Sandbox: id, Stop: true, stopReason: pauseReason})
	if err != nil {
		return ck, err
	}
	if sb, err := e.meta.Get(ctx, id); err == nil && !sb.Expires.IsZero() {
		_, err = e.meta.SetExpiry(ctx, id, time.Time{}, sb.OnExpire)
		return ck, err
	}
	return ck, nil
}

// Resume brings back sandbox id if the engine stopped it (paused, idle,
// budget) from its latest checkpoint, exact memory and all; a running
// sandbox is returned as it is.
func (e *Engine) Resume(ctx context.Context, tenant, id string) (meta.Sandbox, error) {
	sb, err := e.Get(ctx, tenant, id)
	if err != nil {
		return sb, err
	}
	if sb.State == meta.StateRestoring {
		e.lock(id)() // another call resumes it: wait for that
		if sb, err = e.meta.Get(ctx, id); err != nil {
			return sb, err
		}
	}
	switch {
	case sb.State == meta.StateRunning:
		e.touch(id)
		return sb, nil
	case e.suspended(sb):
		return e.resume(ctx, sb)
	}
	return sb, errdefs.FailedPreconditionf("sandbox %s is %s (%s): it cannot be resumed", id, sb.State, sb.Reason)
}

// expiryLoop acts on the sandboxes of this node past their deadline.
func (e *Engine) expiryLoop(ctx context.Context) {
	t := time.NewTicker(expiryEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rows, err := e.meta.List(ctx, e.mine(meta.Filter{ExpiredBy: e.clock.Now()}))
		if err != nil {
			continue
		}
		for _, sb := range rows {
			if sb.Pooled || sb.Driver != e.drv.Name() || sb.State == meta.StateCreating || sb.State == meta.StateRestoring {
				continue
			}
			err := e.expire(ctx, sb)
			if errors.Is(err, errdefs.ErrFailedPrecondition) {
				continue // moved meanwhile: looked at again next tick
			}
			e.auditSystem(ctx, sb.Tenant, "sandbox.expired", sb.ID, err)
			if err != nil && ctx.Err() == nil {
				e.lg.Warn("act on a sandbox past its deadline", "sandbox_id", sb.ID, "err", err)
			}
		}
	}
}

// expire acts on sb past its deadline (see the file's comment), then
// clears the deadline. A sandbox another call moved meanwhile (a
// FailedPrecondition) is left for the next tick, in its new state.
func (e *Engine) expire(ctx context.Context, sb meta.Sandbox) error {
	var err error
	switch {
	case sb.OnExpire == meta.ExpireDestroy:
		unlock := e.lock(sb.ID)
		cur, gerr := e.meta.Get(ctx, sb.ID)
		if err = gerr; err == nil && cur.State != meta.StateDestroyed {
			err = e.destroy(ctx, cur, "timed out: destroyed at its deadline")
		}
		unlock()
		if err == nil {
			e.lg.Info("sandbox destroyed at its deadline", "sandbox_id", sb.ID)
			return nil // its row is history: nothing to clear
		}
	case sb.State == meta.StateRunning && sb.OnExpire == meta.ExpirePause:
		if _, err = e.Checkpoint(ctx, CheckpointRequest{Tenant: sb.Tenant, Sandbox: sb.ID, Stop: true, stopReason: pauseReason}); err == nil {
			e.lg.Info("sandbox paused at its deadline", "sandbox_id", sb.ID)
		}
	case sb.State == meta.StateRunning:
		if _, err = e.kill(ctx, sb.Tenant, sb.ID, expiredReason); err == nil {
			e.lg.Info("sandbox killed at its deadline", "sandbox_id", sb.ID)
		}
	case e.suspended(sb) && sb.OnExpire != meta.ExpirePause:
		unlock := e.lock(sb.ID)
		_, err = e.meta.SetState(ctx, sb.ID, meta.StateStopped, expiredReason, meta.StateStopped)
		unlock()
	}
	if err != nil {
		return err
	}
	unlock := e.lock(sb.ID)
	defer unlock()
	cur, err := e.meta.Get(ctx, sb.ID)
	if err != nil || !cur.Expires.Equal(sb.Expires) {
		return err // moved meanwhile (SetTimeout): the new deadline stands
	}
	_, err = e.meta.SetExpiry(ctx, sb.ID, time.Time{}, sb.OnExpire)
	return err
}
