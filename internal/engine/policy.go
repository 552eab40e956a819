package engine

// Recovery policies: when the engine checkpoints a sandbox on its own.
//
//   - "" (none): only on request.
//   - strict: after every exec, before the exec is acknowledged. An exec
//     whose answer the client saw is in a checkpoint: a crash loses
//     nothing acknowledged. The cost is a full checkpoint per exec. Every
//     exec counts as a change (a command may change memory of running
//     processes as well as files; there is no cheap way to tell).
//   - fast: in the background, after every FastEvery execs or when an exec
//     comes FastInterval after the last checkpoint, and from a ticker every
//     FastInterval for a sandbox that ran execs since; never two at once
//     for one sandbox (a due checkpoint while one runs is skipped). A crash
//     loses at most the work since the last checkpoint.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/meta"
)

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

// policyState is a fast-policy sandbox's count of execs since its last
// checkpoint.
type policyState struct {
	mu      sync.Mutex
	execs   int
	last    time.Time
	running bool
}

func (e *Engine) policyState(id string) *policyState {
	st, _ := e.policies.LoadOrStore(id, &policyState{last: time.Now()})
	return st.(*policyState)
}

// afterExec applies sb's recovery policy once an exec finished.
func (e *Engine) afterExec(ctx context.Context, sb meta.Sandbox) error {
	switch sb.Policy {
	case PolicyStrict:
		if _, err := e.Checkpoint(ctx, CheckpointRequest{Tenant: sb.Tenant, Sandbox: sb.ID}); err != nil {
			return fmt.Errorf("the command ran, but the checkpoint the strict policy takes after it failed: %w", err)
		}
	case PolicyFast:
		st := e.policyState(sb.ID)
		st.mu.Lock()
		st.execs++
		due := st.execs >= e.fastEvery || time.Since(st.last) >= e.fastInterval
		st.mu.Unlock()
		if due {
			e.fastCheckpoint(sb)
		}
	}
	return nil
}

// fastCheckpoint starts a background checkpoint of sb unless one runs.
func (e *Engine) fastCheckpoint(sb meta.Sandbox) {
	st := e.policyState(sb.ID)
	st.mu.Lock()
	if st.running || e.bg == nil {
		st.mu.Unlock()
		return
	}
	st.running, st.execs = true, 0
	st.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		_, err := e.Checkpoint(e.bg, CheckpointRequest{Tenant: sb.Tenant, Sandbox: sb.ID})
		st.mu.Lock()
		st.running, st.last = false, time.Now()
		st.mu.Unlock()
		if err != nil && e.bg.Err() == nil {
			e.lg.Warn("fast-policy checkpoint failed", "sandbox", sb.ID, "err", err)
		}
	}()
}

// policyLoop checkpoints fast-policy sandboxes that ran execs since their
// last checkpoint and whose last one is FastInterval old.
func (e *Engine) policyLoop(ctx context.Context) {
	t := time.NewTicker(e.fastInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rows, err := e.meta.List(ctx, meta.Filter{States: []meta.State{meta.StateRunning}})
		if err != nil {
			continue
		}
		for _, sb := range rows {
			if sb.Policy != PolicyFast {
				continue
			}
			st := e.policyState(sb.ID)
			st.mu.Lock()
			due := st.execs > 0 && time.Since(st.last) >= e.fastInterval
			st.mu.Unlock()
			if due {
				e.fastCheckpoint(sb)
			}
		}
	}
}
