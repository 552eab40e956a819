package engine

// Idle sandboxes are checkpointed and stopped after Options.Recovery.IdleTimeout
// without a call into them (exec, start, ps, signal, wait, files, a port
// request), and resumed from that checkpoint by the next such call, which
// waits for the restore and then proceeds: the caller sees a slower call,
// nothing else. A stopped idle sandbox holds no memory or CPU on the node;
// its state is in the checkpoint store.
//
// The stop is a checkpoint with Stop (committed before the sandbox stops;
// see checkpoint.go) whose sandbox.killed event and row carry the reason
// idleReason; a resume is an in-place restore from the sandbox's latest
// checkpoint (sandbox.restored), done once even when many calls arrive
// together (they wait on the sandbox's lock and find it running).
//
// Only a call allowed to change the sandbox resumes it: a call whose
// context is WithoutResume (the API server marks every read-scope call so)
// never does — a resume runs the tenant's processes again and spends its
// budget. Its file reads are served from the stopped sandbox's layer when
// it is on this node (Files), anything else is a Conflict saying that a
// write-scope call would resume the sandbox.

import (
	"context"
	"errors"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/meta"
)

// idleReason is the reason of a sandbox the engine stopped for being idle.
const idleReason = "idle: checkpointed and stopped; the next call resumes it"

// idleStopped: stopped for being idle, or paused (ttl.go); both resume
// at the next call.
func idleStopped(sb meta.Sandbox) bool {
	return sb.State == meta.StateStopped && (sb.Reason == idleReason || sb.Reason == pauseReason)
}

// touch records activity in sandbox id.
func (e *policyRunner) touch(id string) { e.pol.activity.Store(id, time.Now()) }

// idleTimeout is how long a sandbox of tenant may be idle (0: forever): the
// tenant's policy, else the daemon's.
func (e *policyRunner) idleTimeout(ctx context.Context, tenant string) time.Duration {
	if p := e.tenantPolicy(ctx, tenant); p.IdleTimeout > 0 {
		return p.IdleTimeout
	}
	return e.pol.idle
}

// idleLoop stops sandboxes idle for longer than their idle timeout.
func (e *policyRunner) idleLoop(ctx context.Context) {
	every := time.Second
	if e.pol.idle > 0 {
		every = min(max(e.pol.idle/4, 100*time.Millisecond), time.Second)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rows, err := e.meta.List(ctx, e.mine(meta.Filter{States: []meta.State{meta.StateRunning}}))
		if err != nil {
			continue
		}
		idleOf := map[string]time.Duration{} // each tenant's policy read once a tick
		for _, sb := range rows {
			if sb.Pooled || sb.Driver != e.drv.Name() {
				continue
			}
			last, ok := e.pol.activity.Load(sb.ID)
			if !ok {
				// First sight (e.g. after a restart): idle from now.
				e.touch(sb.ID)
				continue
			}
			idle, seen := idleOf[sb.Tenant]
			if !seen {
				idle = e.idleTimeout(ctx, sb.Tenant)
				idleOf[sb.Tenant] = idle
			}
			if idle <= 0 || time.Since(last.(time.Time)) < idle {
				continue
			}
			ck, err := e.ckr.Checkpoint(ctx, CheckpointRequest{Tenant: sb.Tenant, Sandbox: sb.ID, Stop: true, stopReason: idleReason})
			if err == nil || !errors.Is(err, errdefs.ErrFailedPrecondition) {
				e.auditSystem(ctx, sb.Tenant, "sandbox.idle_stop", sb.ID+" "+ck.ID, err)
			}
			switch {
			case err == nil:
				e.lg.Info("idle sandbox checkpointed and stopped", "sandbox_id", sb.ID, "idle_for", idle)
			case ctx.Err() == nil && !errors.Is(err, errdefs.ErrFailedPrecondition):
				e.lg.Warn("stop idle sandbox", "sandbox_id", sb.ID, "err", err)
				e.touch(sb.ID) // try again after another idle period
			}
		}
	}
}

type noResumeKey struct{}

// WithoutResume marks ctx as a call that may look at a sandbox but not
// resume it (a read-scope API call): see the package comment above.
func WithoutResume(ctx context.Context) context.Context {
	return context.WithValue(ctx, noResumeKey{}, true)
}

func resumeForbidden(ctx context.Context) bool { v, _ := ctx.Value(noResumeKey{}).(bool); return v }

// errNotResumed is the Conflict of a call that would have to resume sb.
func errNotResumed(sb meta.Sandbox) error {
	return errdefs.Conflictf("sandbox %s is stopped (%s): a read-scope key does not resume it; a call with a write-scope key would", sb.ID, sb.Reason)
}

// resume restores suspended sb in place from its latest checkpoint, unless
// another call did already — if its tenant's budgets allow, and never for
// a call WithoutResume.
func (e *policyRunner) resume(ctx context.Context, sb meta.Sandbox) (meta.Sandbox, error) {
	if resumeForbidden(ctx) {
		return sb, errNotResumed(sb)
	}
	if err := e.admit(ctx, sb.Tenant); err != nil {
		return sb, err
	}
	ck, err := e.latestCheckpoint(ctx, sb.ID)
	if err != nil {
		return sb, err
	}
	e.lg.Info("resuming idle sandbox", "sandbox_id", sb.ID, "checkpoint_id", ck.ID)
	e.touch(sb.ID)
	return e.ckr.restoreWith(ctx, ck, sb.ID, nil, true)
}
