package engine

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/state/meta"
)

// The warm pool keeps, per template, N sandboxes created and running before
// anyone asks, so that Create only has to hand one over.
//
//   - A pooled sandbox is created with the template's default limits and no
//     tenant, env or events. Its meta row says pooled.
//   - A claim takes the oldest ready sandbox of the template and, in one
//     conditional meta update, gives it the tenant, its limits and env; only
//     then does the sandbox's stream begin (sandbox.created with from_pool
//     true, sandbox.started). A claimed sandbox never returns to the pool:
//     destroying it destroys it.
//   - Env: the driver saw no env at creation, so the engine adds the claimed
//     env to every Exec and Start of a sandbox that came from the pool.
//   - Limits: a claim whose limits equal the template's defaults always
//     fits. Other limits fit only when the driver can change a running
//     sandbox's limits (LimitUpdater) and the disk limit is the default (a
//     writable layer's size is fixed at creation); otherwise the request
//     is served by a cold create. The pool never hands out a sandbox whose
//     limits differ from what was asked.
//   - The pool refills in the background, one create at a time per template
//     (creating is CPU-heavy; the pool must not starve claimed sandboxes).
//     A claim that finds no ready sandbox while one is being created for
//     the pool waits for that one rather than starting a second, parallel
//     create on a busy host; if the pool create fails, the claim falls back
//     to a cold create.
//   - Paused (PausePool: the node is draining, so it takes no new sandbox),
//     the pool destroys its ready sandboxes and creates none until resumed.
//   - Shutdown (Engine.Close) destroys the pooled sandboxes: they belong to
//     nobody and would hold memory while no daemon can hand them out. After
//     a daemon crash, pooled sandboxes that still run and whose template
//     version is current rejoin the pool (reconcile); the others are
//     destroyed.
type pool struct {
	e      *poolDeps
	want   map[string]int
	paused atomic.Bool

	mu      sync.Mutex
	ready   map[string][]string // template → pooled ids, oldest first
	kicks   map[string]chan struct{}
	filling map[string]bool          // a pool create of the template is in flight
	changed map[string]chan struct{} // closed when a fill of the template ends
}

// LimitUpdater is an optional power of a sandbox.Driver: change the memory,
// CPU and pids limits of a running sandbox. (Proposed for core/sandbox.)
type LimitUpdater interface {
	UpdateLimits(ctx context.Context, id string, l sandbox.Limits) error
}

// poolDeps is what the pool needs: the core, and the lifecycle's create
// and destroy (engine.go) and the egress run's start (egress.go), given as functions so the pool reaches nothing
// else of the Engine.
type poolDeps struct {
	*core
	coldCreate func(ctx context.Context, t sandbox.Template, tenant string, limits sandbox.Limits, env []string, pooled bool, policy string, md map[string]string) (meta.Sandbox, error)
	destroy    func(ctx context.Context, sb meta.Sandbox, reason string) error
	startRun   func(ctx context.Context, sb meta.Sandbox, run string, resume bool) error // egress.go
}

func newPool(e *poolDeps, want map[string]int) *pool {
	p := &pool{e: e, want: map[string]int{}, ready: map[string][]string{}, kicks: map[string]chan struct{}{},
		filling: map[string]bool{}, changed: map[string]chan struct{}{}}
	for name, n := range want {
		if n > 0 {
			p.want[name] = n
			p.kicks[name] = make(chan struct{}, 1)
			p.changed[name] = make(chan struct{})
		}
	}
	return p
}

func (p *pool) start(ctx context.Context) {
	for name := range p.want {
		p.setFilling(name, true, "") // before any claim can look
		p.e.bg.wg.Add(1)
		go func() {
			defer p.e.bg.wg.Done()
			p.fill(ctx, name)
		}()
	}
}

func (p *pool) kick(name string) {
	if ch, ok := p.kicks[name]; ok {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Size returns how many sandboxes of template are wanted and ready.
func (p *pool) PoolSize(template string) (want, ready int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.want[template], len(p.ready[template])
}

// fill keeps template name's pool full until ctx ends.
func (p *pool) fill(ctx context.Context, name string) {
	backoff := time.Second
	defer p.setFilling(name, false, "")
	for ctx.Err() == nil {
		p.mu.Lock()
		need := p.want[name] - len(p.ready[name])
		p.mu.Unlock()
		if need <= 0 || p.paused.Load() {
			p.setFilling(name, false, "")
			select {
			case <-ctx.Done():
				return
			case <-p.kicks[name]:
				continue
			}
		}
		t, err := p.e.tpl.cat.Get(name)
		if err == nil {
			p.setFilling(name, true, "")
			var sb meta.Sandbox
			sb, err = p.e.coldCreate(ctx, t, "", t.Limits, nil, true, PolicyNone, nil)
			if err == nil {
				p.setFilling(name, false, sb.ID)
				backoff = time.Second
				continue
			}
			p.setFilling(name, false, "")
		}
		if ctx.Err() != nil {
			return
		}
		p.e.lg.Warn("warm pool: create failed; retrying", "template", name, "in", backoff, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// setFilling records whether a pool create of name is in flight; when one
// ends (with the new sandbox's id, or "" when it failed) waiting claims are
// woken.
func (p *pool) setFilling(name string, on bool, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.filling[name] = on
	if id != "" {
		p.ready[name] = append(p.ready[name], id)
	}
	if !on {
		close(p.changed[name])
		p.changed[name] = make(chan struct{})
	}
}

// popOrWait takes the oldest ready sandbox of name; when there is none but
// one is being created, it waits for that create to end and tries again.
func (p *pool) popOrWait(ctx context.Context, name string) (string, bool) {
	for {
		p.mu.Lock()
		if ids := p.ready[name]; len(ids) > 0 {
			p.ready[name] = ids[1:]
			p.mu.Unlock()
			return ids[0], true
		}
		filling, ch := p.filling[name], p.changed[name]
		p.mu.Unlock()
		if !filling {
			return "", false
		}
		select {
		case <-ctx.Done():
			return "", false
		case <-ch:
		}
		p.mu.Lock()
		empty := len(p.ready[name]) == 0
		p.mu.Unlock()
		if empty {
			return "", false // the create failed (or someone else took it)
		}
	}
}

// claim hands a ready pooled sandbox of t to tenant. ok is false when none
// fits (the caller creates one cold).
func (p *pool) claim(ctx context.Context, t sandbox.Template, tenant string, limits sandbox.Limits, env []string, md map[string]string) (meta.Sandbox, bool, error) {
	if p.want[t.Name] == 0 || p.paused.Load() {
		return meta.Sandbox{}, false, nil
	}
	upd, canUpdate := p.e.drv.(LimitUpdater)
	if limits != t.Limits && (!canUpdate || limits.DiskBytes != t.Limits.DiskBytes) {
		return meta.Sandbox{}, false, nil
	}
	defer p.kick(t.Name)
	for {
		id, ok := p.popOrWait(ctx, t.Name)
		if !ok {
			return meta.Sandbox{}, false, ctx.Err()
		}
		sb, ok, err := p.claimOne(ctx, id, t, tenant, limits, env, md, upd)
		if ok || err != nil {
			return sb, ok, err
		}
	}
}

func (p *pool) claimOne(ctx context.Context, id string, t sandbox.Template, tenant string, limits sandbox.Limits, env []string, md map[string]string, upd LimitUpdater) (meta.Sandbox, bool, error) {
	e := p.e
	defer e.lock(id)()
	sb, err := e.meta.Get(ctx, id)
	if err == nil && sb.Pooled && sb.State == meta.StateRunning && sb.TemplateVersion != t.Version {
		// The template's tag moved since it was made: not reusable.
		if err := e.destroy(context.WithoutCancel(ctx), sb, "pooled sandbox on an older template version"); err != nil {
			e.lg.Error("destroy pooled sandbox", "sandbox", id, "err", err)
		}
		return sb, false, nil
	}
	if err != nil || !sb.Pooled || sb.State != meta.StateRunning {
		return sb, false, nil
	}
	if limits != sb.Limits {
		if err := upd.UpdateLimits(ctx, id, limits); err != nil {
			e.lg.Warn("warm pool: cannot apply limits; discarding", "sandbox_id", id, "err", err)
			if err := e.destroy(context.WithoutCancel(ctx), sb, "pooled sandbox refused new limits"); err != nil {
				e.lg.Error("destroy pooled sandbox", "sandbox_id", id, "err", err)
			}
			return sb, false, nil
		}
	}
	sb, err = e.meta.Claim(ctx, id, tenant, limits, env)
	if errors.Is(err, errdefs.ErrFailedPrecondition) {
		return sb, false, nil
	}
	if err != nil {
		return sb, false, err
	}
	if len(md) > 0 {
		// The labels next, before anything that may fail for a while (the
		// egress run, the log): a caller that gets an error, or dies, finds
		// the claimed sandbox by them (coldCreate has them in its row).
		if err := e.storeRetry(ctx, "label the claimed sandbox", func(ctx context.Context) (err error) {
			sb, err = e.meta.SetMetadata(ctx, id, md)
			return err
		}); err != nil {
			return sb, true, err
		}
	}
	if err := e.startRun(ctx, sb, startRunID(id), false); err != nil {
		return sb, true, err
	}
	if err := e.appendEvents(ctx, sb, createdEvents(sb)...); err != nil {
		return sb, true, err
	}
	e.lg.InfoContext(ctx, "sandbox claimed from warm pool", "sandbox_id", id, "template", t.Name, "tenant_id", tenant)
	return sb, true, nil
}

// forget removes id from the ready list.
func (p *pool) forget(name, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := p.ready[name]
	for i, x := range ids {
		if x == id {
			p.ready[name] = append(ids[:i:i], ids[i+1:]...)
			break
		}
	}
	p.kick(name)
}

// adopt puts a pooled sandbox found running after a restart back in the pool,
// or destroys it when its template changed or the pool is full. A start-up
// reconcile tried again (startStep) adopts it again: once in the pool is
// enough.
func (p *pool) adopt(ctx context.Context, sb meta.Sandbox) {
	t, err := p.e.tpl.cat.Get(sb.Template)
	p.mu.Lock()
	if slices.Contains(p.ready[sb.Template], sb.ID) {
		p.mu.Unlock()
		return
	}
	fits := err == nil && t.Version == sb.TemplateVersion && t.Limits == sb.Limits && len(p.ready[sb.Template]) < p.want[sb.Template]
	if fits {
		p.ready[sb.Template] = append(p.ready[sb.Template], sb.ID)
	}
	p.mu.Unlock()
	if fits {
		p.e.lg.Info("pooled sandbox rejoined the warm pool", "sandbox_id", sb.ID, "template", sb.Template)
		return
	}
	if err := p.e.destroy(ctx, sb, "pooled sandbox not reusable after restart"); err != nil {
		p.e.lg.Error("destroy stale pooled sandbox", "sandbox_id", sb.ID, "err", err)
	}
}

// PausePool pauses (true) or resumes (false) the warm pool. Paused, it
// destroys the pooled sandboxes it holds and creates none: a draining node
// takes no new sandbox, so its pool would only hold memory. The cluster
// calls it at every drain-loop pass (pausing again destroys any sandbox a
// create in flight added since). Resumed, it refills.
func (p *pool) PausePool(ctx context.Context, paused bool) error {
	was := p.paused.Swap(paused)
	if !paused {
		if was {
			p.e.lg.Info("warm pool resumed")
			for name := range p.want {
				p.kick(name)
			}
		}
		return nil
	}
	if !was {
		p.e.lg.Info("warm pool paused: this node is draining")
	}
	p.mu.Lock()
	held := 0
	for _, ids := range p.ready {
		held += len(ids)
	}
	p.mu.Unlock()
	if held == 0 && was {
		return nil
	}
	return p.drain(ctx, "warm pool paused: the node is draining")
}

// drain destroys every pooled sandbox of this node (at shutdown, or when
// the pool is paused), each read again under its lock: a claim may have
// made it a tenant's since the list.
func (p *pool) drain(ctx context.Context, reason string) error {
	p.mu.Lock()
	p.ready = map[string][]string{}
	p.mu.Unlock()
	pooled := true
	rows, err := p.e.meta.List(ctx, p.e.mine(meta.Filter{Pooled: &pooled}))
	if err != nil {
		return err
	}
	var errs []error
	for _, sb := range rows {
		unlock := p.e.lock(sb.ID)
		if cur, err := p.e.meta.Get(ctx, sb.ID); err == nil && cur.Pooled && cur.State != meta.StateDestroyed {
			if err := p.e.destroy(ctx, cur, reason); err != nil {
				errs = append(errs, err)
			}
		}
		unlock()
	}
	return errors.Join(errs...)
}
