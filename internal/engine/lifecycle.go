package engine

import (
	"context"

	"github.com/amber-run/amber/internal/state/meta"
)

// lifecycleObserver is a capability that watches the sandbox lifecycle from
// outside it: metering (metering.go) and budgets (budget.go) register one in
// New, so the lifecycle, checkpoint and restore code calls these hooks and
// names nothing of billing.
type lifecycleObserver interface {
	// stopping is told before sandbox id's cgroup goes (a kill, a destroy,
	// a cut that leaves it stopped): the last chance to read it.
	stopping(ctx context.Context, id string)
	// admit is asked before new work of tenant (a sandbox created,
	// restored or resumed, an exec); an error refuses it.
	admit(ctx context.Context, tenant string) error
	// suspends says whether the observer stopped sb itself: it is
	// suspended, and the next call into it resumes it (idle.go).
	suspends(sb meta.Sandbox) bool
	// keepFrom is the lowest sequence of sandbox id's stream the observer
	// still needs (0: no need); retention truncates no higher.
	keepFrom(ctx context.Context, tenant, id string) (uint64, error)
}

// observe registers o.
func (e *core) observe(o lifecycleObserver) { e.life = append(e.life, o) }

// stopping tells the observers that sandbox id is about to stop.
func (e *core) stopping(ctx context.Context, id string) {
	for _, o := range e.life {
		o.stopping(ctx, id)
	}
}

// admit asks the observers whether tenant may start new work.
func (e *core) admit(ctx context.Context, tenant string) error {
	for _, o := range e.life {
		if err := o.admit(ctx, tenant); err != nil {
			return err
		}
	}
	return nil
}

// keepFrom is the lowest stream sequence of sandbox id an observer still
// needs (0: none does).
func (e *core) keepFrom(ctx context.Context, tenant, id string) (uint64, error) {
	var from uint64
	for _, o := range e.life {
		n, err := o.keepFrom(ctx, tenant, id)
		if err != nil {
			return 0, err
		}
		if n > 0 && (from == 0 || n < from) {
			from = n
		}
	}
	return from, nil
}
