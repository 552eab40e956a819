package engine

import (
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
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
func (e *checkpointer) collect(tenant string) {
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

func (e *checkpointer) collectOnce(tenant string) {
	for attempt := 0; attempt < 120 && e.bg.ctx.Err() == nil; attempt++ {
		res, err := e.ck.store.GC(e.bg.ctx, tenant)
		switch {
		case err == nil && !res.Deferred:
			if res.DeletedChunks > 0 || res.DeletedPacks > 0 || res.DeletedManifests > 0 {
				e.lg.Info("checkpoint garbage collected", "tenant_id", tenant, "chunks", res.DeletedChunks, "packs", res.DeletedPacks,
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
