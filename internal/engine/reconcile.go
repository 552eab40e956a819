package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/state/meta"
)

// reconcile makes the metadata agree with the driver after a (re)start,
// never dropping a sandbox silently:
//
//   - running in meta, running in the driver: reattached (nothing to do;
//     pooled ones rejoin the pool if their template is current, else are
//     destroyed);
//   - running in meta, stopped or unknown to the driver: crashed, with a
//     sandbox.crashed event (pooled ones are destroyed);
//   - creating or restoring in meta (the daemon died inside Create or
//     Restore): whatever the driver made is destroyed and the row marked
//     crashed (destroyed if pooled); a crashed sandbox that has a
//     checkpoint can be recovered from it;
//   - destroyed in meta but still known to the driver: destroyed again;
//   - known to the driver without any row: left alone and logged (the engine
//     writes the row first, so this is not one of ours).
func (e *Engine) reconcile(ctx context.Context) error {
	infos, err := e.drv.List(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list %s sandboxes: %w", e.drv.Name(), err)
	}
	live := map[string]sandbox.Info{}
	for _, in := range infos {
		live[in.ID] = in
	}
	rows, err := e.meta.List(ctx, e.mine(meta.Filter{States: []meta.State{
		meta.StateCreating, meta.StateRestoring, meta.StateRunning, meta.StateStopped, meta.StateCrashed, meta.StateDestroyed}}))
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	known := map[string]bool{}
	var reattached, crashed int
	for _, sb := range rows {
		known[sb.ID] = true
		in, exists := live[sb.ID]
		lg := e.lg.With("sandbox_id", sb.ID, "pooled", sb.Pooled)
		switch {
		case sb.Driver != e.drv.Name():
			if sb.State == meta.StateRunning || sb.State == meta.StateCreating {
				lg.Warn("sandbox belongs to another driver; not touched", "driver", sb.Driver)
			}
		case sb.State == meta.StateDestroyed:
			if exists {
				lg.Warn("destroyed sandbox still has driver state; destroying again")
				if err := e.drv.Destroy(ctx, sb.ID); err != nil {
					lg.Error("destroy leftover", "err", err)
				}
			}
		case sb.State == meta.StateCreating || sb.State == meta.StateRestoring:
			reason := "the daemon stopped while creating it"
			if sb.State == meta.StateRestoring {
				// Half restored: the driver's state is torn down; the
				// checkpoint still has everything (sandbox recover).
				reason = "the daemon stopped while restoring it"
			}
			if err := e.drv.Destroy(ctx, sb.ID); err != nil {
				lg.Error("destroy half-created sandbox", "err", err)
				continue
			}
			if sb.Pooled {
				_, err = e.meta.SetState(ctx, sb.ID, meta.StateDestroyed, reason)
			} else {
				err = e.markCrashed(ctx, sb, EventCrashed, reason)
				crashed++
			}
			if err != nil {
				return fmt.Errorf("reconcile %s: %w", sb.ID, err)
			}
		case sb.State == meta.StateRunning && exists && in.State == sandbox.StateRunning:
			if sb.Pooled {
				e.pool.adopt(ctx, sb)
			} else {
				reattached++
				if err := e.reattachEgress(ctx, sb); err != nil {
					lg.Error("egress not reattached: the sandbox's connections out fail until it is restored", "err", err)
				}
				lg.Info("sandbox reattached", "tenant_id", sb.Tenant, "init_pid", in.InitPID)
			}
		case sb.State == meta.StateRunning:
			reason := "lost while the daemon was down: the driver has no state for it"
			if exists {
				reason = fmt.Sprintf("lost while the daemon was down: the driver reports it %s", in.State)
			}
			if sb.Pooled {
				if err := e.destroy(ctx, sb, reason); err != nil {
					lg.Error("destroy lost pooled sandbox", "err", err)
				}
				continue
			}
			if err := e.markCrashed(ctx, sb, EventCrashed, reason); err != nil {
				return fmt.Errorf("reconcile %s: %w", sb.ID, err)
			}
			crashed++
		}
	}
	for id := range live {
		if !known[id] {
			e.unknownSandbox(ctx, id)
		}
	}
	e.lg.Info("reconciled", "driver", e.drv.Name(), "reattached", reattached, "crashed", crashed)
	return nil
}

// markCrashed records that sb stopped without being asked to, and appends
// an event of type typ (sandbox.crashed or sandbox.exited) saying why.
func (e *core) markCrashed(ctx context.Context, sb meta.Sandbox, typ, reason string) error {
	e.resetEgress(sb.ID, reason)
	sb, err := e.meta.SetState(ctx, sb.ID, meta.StateCrashed, reason, sb.State)
	if err != nil {
		return err
	}
	e.lg.Warn("sandbox crashed", "sandbox_id", sb.ID, "tenant_id", sb.Tenant, "reason", reason)
	return e.appendEvents(ctx, sb, lifecycleEvent(sb, typ, StatePayload{State: string(meta.StateCrashed), Reason: reason}))
}

// watchLoop notices sandboxes whose init died while the daemon runs.
func (e *Engine) watchLoop(ctx context.Context) {
	t := time.NewTicker(e.watch)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := e.checkRunning(ctx); err != nil && ctx.Err() == nil {
			e.lg.Warn("watch: check sandboxes", "err", err)
		}
	}
}

// checkRunning marks running sandboxes the driver no longer runs as crashed
// (sandbox.exited); pooled ones are destroyed and leave the pool.
func (e *Engine) checkRunning(ctx context.Context) error {
	infos, err := e.drv.List(ctx)
	if err != nil {
		return err
	}
	live := map[string]sandbox.State{}
	for _, in := range infos {
		live[in.ID] = in.State
	}
	rows, err := e.meta.List(ctx, e.mine(meta.Filter{States: []meta.State{meta.StateRunning}}))
	if err != nil {
		return err
	}
	for _, sb := range rows {
		if sb.Driver != e.drv.Name() || live[sb.ID] == sandbox.StateRunning {
			continue
		}
		e.checkOne(ctx, sb.ID)
	}
	return nil
}

// checkOne re-checks one sandbox under its lock (a Destroy or Kill may have
// been in flight when the list was taken).
func (e *Engine) checkOne(ctx context.Context, id string) {
	defer e.lock(id)()
	sb, err := e.meta.Get(ctx, id)
	if err != nil || sb.State != meta.StateRunning {
		return
	}
	in, err := e.drv.Inspect(ctx, id)
	if err == nil && in.State == sandbox.StateRunning {
		return
	}
	reason := "its init exited"
	if err != nil {
		reason = "the driver lost it: " + err.Error()
	}
	if sb.Pooled {
		e.pool.forget(sb.Template, id)
		if err := e.destroy(ctx, sb, "pooled sandbox died: "+reason); err != nil {
			e.lg.Error("destroy dead pooled sandbox", "sandbox_id", id, "err", err)
		}
		return
	}
	if err := e.markCrashed(ctx, sb, EventExited, reason); err != nil {
		e.lg.Error("record crashed sandbox", "sandbox_id", id, "err", err)
	}
}
