package engine

import (
	"context"
	"time"

	"github.com/amber-run/amber/core/eventlog"
)

// MeterTick closes the metering interval ending at end (tests drive the
// loop by hand).
func (e *Engine) MeterTick(ctx context.Context, end time.Time) error { return e.meterTick(ctx, end) }

// EnforceBudgets runs what the metering loop runs after each interval.
func (e *Engine) EnforceBudgets(ctx context.Context) { e.enforceBudgets(ctx) }

// SetUnsentUsage makes evs the tenant's batch whose append failed, as if
// its answer had been lost.
func (e *Engine) SetUnsentUsage(tenant string, evs []eventlog.Event) {
	e.mtr.state.unsent[tenant] = evs
}

// DropLocal is the stale-copy sweep's destroy of sandbox id (failover.go).
func (e *Engine) DropLocal(ctx context.Context, id string) { e.dropLocal(ctx, id) }

// UsageEvent is the usage.recorded event the metering loop appends for r.
func UsageEvent(tenant string, r UsageRecord) eventlog.Event { return usageEvent(tenant, r) }

// CutHeld reports whether sandbox id's cut lock is held (or wanted) for
// writing: a cut or a restore's driver call runs.
func (e *Engine) CutHeld(id string) bool {
	mu := e.cutLock(id)
	if mu.tryRLock() {
		mu.runlock()
		return false
	}
	return true
}

// WaitHotTier waits for the hot copies being made or verified.
func (e *Engine) WaitHotTier() { e.ck.hot.wait() }

// HotCopy returns the directory of checkpoint id's hot copy and whether
// it is whole.
func (e *Engine) HotCopy(id string) (string, bool) { return e.ck.hot.path(id), e.ck.hot.has(id) }

// DropHotCopy removes checkpoint id's hot copy (the next restore fetches).
func (e *Engine) DropHotCopy(id string) { e.ck.hot.drop(id) }

// SetStrictUploadFirst makes the strict policy upload before the ack on
// local stores too (today's order before upload.go), for benchmarks.
func (e *Engine) SetStrictUploadFirst(on bool) { e.pol.uploadFirst = on }

// WaitUploads waits for the uploads behind local commits queued so far.
func (e *Engine) WaitUploads() { e.waitUploads() }

// SetFastQuiet sets how long a due fast-policy checkpoint waits for a
// quiet moment, and at most; it returns the restore of the old values.
func SetFastQuiet(quiet, maxDefer time.Duration) (restore func()) {
	oq, om := fastQuiet, fastMaxDefer
	fastQuiet, fastMaxDefer = quiet, maxDefer
	return func() { fastQuiet, fastMaxDefer = oq, om }
}
