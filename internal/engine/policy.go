package engine

// Recovery policies: when the engine checkpoints a sandbox on its own.
//
//   - "" (none): only on request.
//   - strict: after every exec, before the exec is acknowledged. An exec
//     whose answer the client saw is in a checkpoint: a crash loses
//     nothing acknowledged. The cost is a checkpoint per exec; on a node
//     whose stores are its own, only the cut and the durable local copy
//     come before the ack, the upload after (upload.go); in a cluster the
//     upload comes before it too (another node must be able to restore).
//     Every exec counts as a change (a command may change memory of
//     running processes as well as files; there is no cheap way to tell).
//   - fast: in the background, after every FastEvery execs, when the
//     execs since the last checkpoint ran FastReplayBudget in all (the
//     adaptive cut: what a crash would make the session replay is bounded
//     by the work's cost, not only by its count of steps), or when an exec
//     comes FastInterval after the last checkpoint, and from a ticker every
//     FastInterval for a sandbox that ran execs since; never two at once
//     for one sandbox (a due checkpoint while one runs is skipped). A crash
//     loses at most the work since the last checkpoint. A due checkpoint
//     waits for a quiet moment — no call into the sandbox for fastQuiet,
//     at most fastMaxDefer — so that a burst of tool calls is not stopped
//     by its own cut (an exec that comes while the sandbox is frozen waits
//     for the thaw): an agent's next call comes after it has thought, and
//     the cut fits in that gap.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/meta"
)

// policyRunner is recovery policies and idle stops (policy.go, idle.go):
// it checkpoints through ckr (fast and strict policies, idle stops, and
// the restore of a resumed sandbox) and checks tenants' egress policies
// against the ceiling through eg.
type policyRunner struct {
	*core
	pol policies
	ckr *checkpointer
	eg  *egressRunner
}

// policies is the per-sandbox state of recovery policies (policy.go) and
// idle stops (idle.go).
type policies struct {
	states       sync.Map // sandbox id → *policyState
	fastEvery    int
	fastInterval time.Duration
	replayBudget time.Duration
	idle         time.Duration
	activity     sync.Map // sandbox id → time.Time of the last call into it
	// uploadFirst keeps the upload before the ack on local stores too
	// (tests: the benchmark of both orders in one run).
	uploadFirst bool
}

// The recovery policies.
const (
	PolicyNone   = ""
	PolicyFast   = "fast"
	PolicyStrict = "strict"
)

// ValidatePolicy checks a policy name.
func ValidatePolicy(p string) error {
	switch p {
	case PolicyNone, PolicyFast, PolicyStrict:
		return nil
	case "none":
		return nil
	}
	return errdefs.InvalidArgumentf("recovery policy %.40q: want none, fast or strict", p)
}

func normPolicy(p string) string {
	if p == "none" {
		return PolicyNone
	}
	return p
}

// fastParams are the fast policy's thresholds for tenant.
type fastParams struct {
	every    int
	interval time.Duration
	budget   time.Duration
}

func (e *policyRunner) fastParams(ctx context.Context, tenant string) fastParams {
	f := fastParams{every: e.pol.fastEvery, interval: e.pol.fastInterval, budget: e.pol.replayBudget}
	p := e.tenantPolicy(ctx, tenant)
	if p.FastEvery > 0 {
		f.every = p.FastEvery
	}
	if p.FastInterval > 0 {
		f.interval = p.FastInterval
	}
	if p.FastReplayBudget > 0 {
		f.budget = p.FastReplayBudget
	}
	return f
}

// policyState is a fast-policy sandbox's execs since its last
// checkpoint: their count and their summed run time (replay).
type policyState struct {
	mu      sync.Mutex
	execs   int
	replay  time.Duration
	last    time.Time
	running bool
}

func (e *policyRunner) policyState(id string) *policyState {
	st, _ := e.pol.states.LoadOrStore(id, &policyState{last: time.Now()})
	return st.(*policyState)
}

// afterExec applies sb's recovery policy once an exec that ran for took
// finished.
func (e *policyRunner) afterExec(ctx context.Context, sb meta.Sandbox, took time.Duration) error {
	switch sb.Policy {
	case PolicyStrict:
		if _, err := e.ckr.Checkpoint(ctx, CheckpointRequest{Tenant: sb.Tenant, Sandbox: sb.ID, uploadBehind: !e.lease.shared && !e.pol.uploadFirst}); err != nil {
			return fmt.Errorf("the command ran, but the checkpoint the strict policy takes after it failed: %w", err)
		}
	case PolicyFast:
		f := e.fastParams(ctx, sb.Tenant)
		st := e.policyState(sb.ID)
		st.mu.Lock()
		st.execs++
		st.replay += took
		due := st.execs >= f.every || st.replay >= f.budget || time.Since(st.last) >= f.interval
		st.mu.Unlock()
		if due {
			e.fastCheckpoint(sb)
		}
	}
	return nil
}

// fastQuiet and fastMaxDefer bound how long a due fast-policy checkpoint
// waits for a quiet moment (variables: tests shorten them).
var (
	fastQuiet    = 150 * time.Millisecond
	fastMaxDefer = 2 * time.Second
)

// awaitQuiet returns once no call has come into sandbox id for fastQuiet
// (activity: the start and the end of every call), or fastMaxDefer has
// passed, or ctx ended.
func (e *policyRunner) awaitQuiet(ctx context.Context, id string) {
	deadline := time.Now().Add(fastMaxDefer)
	for {
		since := fastQuiet
		if last, ok := e.pol.activity.Load(id); ok {
			since = time.Since(last.(time.Time))
		}
		left := time.Until(deadline)
		if since >= fastQuiet || left <= 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(fastQuiet-since, left)):
		}
	}
}

// fastCheckpoint starts a background checkpoint of sb unless one runs; it
// cuts at the first quiet moment (awaitQuiet).
func (e *policyRunner) fastCheckpoint(sb meta.Sandbox) {
	st := e.policyState(sb.ID)
	st.mu.Lock()
	if st.running || e.bg.ctx == nil {
		st.mu.Unlock()
		return
	}
	st.running, st.execs, st.replay = true, 0, 0
	st.mu.Unlock()
	e.bg.wg.Add(1)
	go func() {
		defer e.bg.wg.Done()
		e.awaitQuiet(e.bg.ctx, sb.ID)
		ck, err := e.ckr.Checkpoint(e.bg.ctx, CheckpointRequest{Tenant: sb.Tenant, Sandbox: sb.ID})
		e.auditSystem(e.bg.ctx, sb.Tenant, "checkpoint.fast_policy", sb.ID+" "+ck.ID, err)
		st.mu.Lock()
		st.running, st.last = false, time.Now()
		st.mu.Unlock()
		if err != nil && e.bg.ctx.Err() == nil {
			e.lg.Warn("fast-policy checkpoint failed", "sandbox_id", sb.ID, "err", err)
		}
	}()
}

// policyLoop checkpoints fast-policy sandboxes that ran execs since their
// last checkpoint and whose last one is FastInterval old.
func (e *policyRunner) policyLoop(ctx context.Context) {
	t := time.NewTicker(min(e.pol.fastInterval, time.Second))
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
		intervalOf := map[string]time.Duration{} // each tenant's policy read once a tick
		for _, sb := range rows {
			if sb.Policy != PolicyFast {
				continue
			}
			interval, seen := intervalOf[sb.Tenant]
			if !seen {
				interval = e.fastParams(ctx, sb.Tenant).interval
				intervalOf[sb.Tenant] = interval
			}
			st := e.policyState(sb.ID)
			st.mu.Lock()
			due := st.execs > 0 && time.Since(st.last) >= interval
			st.mu.Unlock()
			if due {
				e.fastCheckpoint(sb)
			}
		}
	}
}

// TenantPolicy returns tenant's recovery policy as stored.
func (e *policyRunner) TenantPolicy(ctx context.Context, tenant string) (meta.TenantPolicy, error) {
	return e.meta.TenantPolicy(ctx, tenant)
}

// SetTenantPolicy sets tenant's recovery policy; it applies to sandboxes
// created from now on (the recovery name) and at once to the others
// (thresholds, retention, idle timeout).
func (e *policyRunner) SetTenantPolicy(ctx context.Context, tenant string, p meta.TenantPolicy) error {
	if err := ValidatePolicy(p.Recovery); err != nil {
		return err
	}
	p.Recovery = normPolicy(p.Recovery)
	if err := e.eg.checkTenantEgress(ctx, tenant, p.Egress); err != nil {
		return err
	}
	if p.Recovery != PolicyNone || p.IdleTimeout > 0 || p.KeepCheckpoints > 0 {
		if _, err := e.ckr.checkpointStore(); err != nil {
			return fmt.Errorf("tenant policy: %w", err)
		}
	}
	return e.meta.SetTenantPolicy(ctx, tenant, p)
}

// StrictCheckpoint cuts sandbox id as the strict policy does after an
// exec, whatever the sandbox's own policy: on a node whose stores are its
// own it is acknowledged once durable on the node and uploaded after
// (upload.go; its template's push too); in a cluster the upload comes
// first. The session harness's cuts (a strict session's first cut and
// the one after each changing tool call) are these: uploaded before the
// answer, each cut waited for the template's push and for every blob
// store error window.
func (e *policyRunner) StrictCheckpoint(ctx context.Context, tenant, id string) (meta.Checkpoint, error) {
	return e.ckr.Checkpoint(ctx, CheckpointRequest{Tenant: tenant, Sandbox: id, uploadBehind: !e.lease.shared && !e.pol.uploadFirst})
}
