package engine

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/audit"
)

// Garbage collection of checkpoint chunks. A checkpoint that fails before
// its pointer leaves chunks and maybe a manifest nothing references; the
// engine asks the chunk store to collect the tenant's garbage after every
// failed checkpoint (and after a restart settles failed ones). The chunk
// store's GC is safe against concurrent checkpoints: while a writer of the
// tenant is live it deletes nothing and says Deferred, and the engine tries
// again a second later. Requests for a tenant whose collection runs are
// folded into one more run after it.

type gcState struct {
	mu      sync.Mutex
	running bool
	again   bool
}

// gcRetry is how long a deferred collection waits before trying again.
var gcRetry = time.Second

// collect schedules a garbage collection of tenant's chunks.
func (e *Engine) collect(tenant string) {
	if e.ck.store == nil || e.bg.ctx == nil {
		return
	}
	v, _ := e.ck.gcs.LoadOrStore(tenant, &gcState{})
	st := v.(*gcState)
	st.mu.Lock()
	if st.running {
		st.again = true
		st.mu.Unlock()
		return
	}
	st.running = true
	st.mu.Unlock()
	e.bg.wg.Add(1)
	go func() {
		defer e.bg.wg.Done()
		for {
			e.collectOnce(tenant)
			st.mu.Lock()
			if !st.again || e.bg.ctx.Err() != nil {
				st.running = false
				st.mu.Unlock()
				return
			}
			st.again = false
			st.mu.Unlock()
		}
	}()
}

func (e *Engine) collectOnce(tenant string) {
	for attempt := 0; attempt < 120 && e.bg.ctx.Err() == nil; attempt++ {
		res, err := e.ck.store.GC(e.bg.ctx, tenant)
		switch {
		case err == nil && !res.Deferred:
			if res.DeletedChunks > 0 || res.DeletedManifests > 0 {
				e.lg.Info("checkpoint garbage collected", "tenant_id", tenant, "chunks", res.DeletedChunks,
					"bytes", res.DeletedBytes, "manifests", res.DeletedManifests, "kept_checkpoints", res.Checkpoints)
			}
			return
		case err != nil && !errdefs.IsConflict(err):
			e.lg.Warn("checkpoint garbage collection", "tenant_id", tenant, "err", err)
			return
		}
		select { // deferred by a live writer, or another collector: later
		case <-e.bg.ctx.Done():
			return
		case <-time.After(gcRetry):
		}
	}
}

// auditSystem records an action the engine took on its own for tenant.
func (e *Engine) auditSystem(ctx context.Context, tenant, action, resource string, err error) {
	if e.audit == nil || tenant == "" {
		return
	}
	r := audit.Record{Actor: "system", Action: action, Resource: resource, Outcome: "ok"}
	if err != nil {
		r.Outcome, r.Detail = errdefs.Kind(err), err.Error()
		if errdefs.HTTPStatus(err) == http.StatusInternalServerError {
			// The tenant reads its trail: an internal error's text (stores,
			// paths) is the operator's, in the log.
			r.Detail = "internal error"
			e.lg.Error("system action failed", "action", action, "resource", resource, "tenant", tenant, "err", err)
		}
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, aerr := e.audit.Append(actx, tenant, r); aerr != nil {
		e.lg.Error("audit record not written", "action", action, "err", aerr)
	}
}
