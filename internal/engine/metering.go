package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/internal/state/meta"
)

// Metering: what each tenant consumed, recorded per interval in the event
// log, exactly once.
//
// # Vocabulary
//
// A meter is one kind of consumption (the Meter* constants). Every interval
// (Options.MeterInterval, default 10 s, boundaries aligned to the wall
// clock) the engine samples each running sandbox — never a stopped or
// checkpointed one — and appends one usage.recorded event per (sandbox,
// meter) to the tenant's stream usage/<tenant>. The event id is derived
// from (sandbox, meter, interval start), so an append that is retried, or
// repeated by a daemon that did not see its answer, never counts an
// interval twice (the log refuses a second event with that id).
//
// # Counters and baselines
//
// CPU comes from the driver (sandbox.UsageReporter) as a counter that
// grows while the sandbox's cgroup lives and starts again from zero with a
// new cgroup (a restore in place, a fork). The cpu_seconds record carries
// the counter at its end (Counter) and the incarnation (Generation). A
// delta is counter − the last counter of the same incarnation; a new
// incarnation, or a counter lower than the last (a new cgroup), starts a
// new baseline at zero, so there is never a negative delta and the new
// cgroup's whole usage is counted once. memory_gib_seconds is the sampled
// memory × the time since the previous sample.
//
// Before the engine kills a sandbox (kill, restore over a running one,
// checkpoint-and-stop, destroy) it samples it one last time: the usage
// between the last record and the kill goes into the next interval's
// record, not lost with the old cgroup.
//
// # Durability order
//
//  1. Sample, add the deltas to the sandbox's pending amounts.
//  2. Build the tenant's records for the interval (ids fixed now) and move
//     the pending amounts into them.
//  3. Append the batch (one atomic append per tenant). Only after it is
//     acknowledged are the records done (and the Prometheus counters
//     told). A failed append keeps the very same batch and appends it
//     again first at the next tick: if the failed call had in fact
//     committed, the retry is a no-op (same ids, same content); if not, it
//     lands now. Amounts are never re-derived for an interval already built.
//
// After a daemon restart, the first sample of a sandbox finds the last
// cpu_seconds record of that sandbox in the tenant's stream (read backwards)
// and continues from its Counter and End: the CPU and memory time between
// the last closed interval and the crash are counted in the next record,
// none twice.
//
// # Counts come from the durable facts, behind cursors
//
// Checkpoints, restores and journaled egress are not counted in memory:
// at each interval the engine reads what was appended since its cursors to
// the sandbox's stream (sandbox.checkpointed, sandbox.restored) and to its
// effect journal (effect.outcome, which carries the bytes of the forward)
// and counts those events. The cursors (SandboxSeq, EffectsSeq) are saved in
// the sandbox's cpu_seconds record of the same atomic batch as the counts,
// so after a crash the next interval reads on from the last recorded
// cursor: every event that was acknowledged before the crash is counted
// once, in the interval after the one recorded last. Retention never
// truncates a sandbox stream past the events metering has not read yet
// (meterKeepFrom). Only what the journal does not hold is counted in
// memory: proxied non-HTTP streams (counted when they close) and forwards
// made with the journal turned off; those of the open interval are lost
// if the daemon dies (and the daemon's death cut the streams themselves).

// Meters.
const (
	MeterCPUSeconds       = "cpu_seconds"
	MeterMemoryGiBSeconds = "memory_gib_seconds"
	MeterEgressRequests   = "egress_requests"
	MeterEgressBytes      = "egress_bytes"
	MeterCheckpoints      = "checkpoints"
	MeterRestores         = "restores"
	MeterStorageGiBHours  = "checkpoint_storage_gib_hours"
	// Model tokens are not sampled: they are read from the sessions' logs,
	// where each model answer is recorded once (SetModelUsage).
	MeterModelInputTokens  = "model_input_tokens"
	MeterModelOutputTokens = "model_output_tokens"
	EventUsageRecorded     = "usage.recorded"
	defaultMeterInterval   = 10 * time.Second
	gib                    = float64(1 << 30)
	usageReadPage          = 512
	usageTenantWideSandbox = "" // records of tenant-wide meters (storage) name no sandbox
)

// Meters lists every meter, in the order reports use.
var Meters = []string{MeterCPUSeconds, MeterMemoryGiBSeconds, MeterEgressRequests, MeterEgressBytes,
	MeterCheckpoints, MeterRestores, MeterStorageGiBHours, MeterModelInputTokens, MeterModelOutputTokens}

// UsageStream is tenant's usage stream.
func UsageStream(tenant string) string { return "usage/" + tenant }

// UsageRecord is the payload of usage.recorded: the quantity of one meter
// used by one sandbox (none for tenant-wide meters) in the interval
// [Start, End) — including what the sandbox used since its previous record
// that no record holds yet (before a kill, while the daemon was down).
// Start is the interval's start, part of the event id; End its end.
//
// A record counts in the day and the calendar month (UTC) of its last
// instant (At), never of its start: the counter behind it is read at End,
// so what it holds was used by then, and an interval that spans midnight
// of the 1st (a 24 h interval, the first record after a restart) charges
// the month it ended in. Charging it to the month it began in would let
// usage recorded after the month closed escape the new month's budget.
type UsageRecord struct {
	Sandbox  string    `json:"sandbox,omitempty"`
	Meter    string    `json:"meter"`
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Quantity float64   `json:"quantity"`
	// Counter (cpu_seconds only) is the driver's cumulative CPU counter in
	// nanoseconds at End, of incarnation Generation.
	Counter    uint64 `json:"counter,omitempty"`
	Generation int    `json:"generation,omitempty"`
	// Cursors (cpu_seconds only) says SandboxSeq and EffectsSeq are set:
	// the positions in the sandbox's stream and effect journal through
	// which checkpoints, restores and egress are counted in this batch.
	Cursors    bool   `json:"cursors,omitempty"`
	SandboxSeq uint64 `json:"sandbox_seq,omitempty"`
	EffectsSeq uint64 `json:"effects_seq,omitempty"`
}

// At is the instant a record is attributed to: the last instant of
// [Start, End), or Start for a record of an instant (model tokens).
func (r UsageRecord) At() time.Time {
	if r.End.After(r.Start) {
		return r.End.Add(-time.Nanosecond).UTC()
	}
	return r.Start.UTC()
}

// UsageObserver is an Observer that also counts recorded usage per tenant
// and meter (found by type assertion; internal/obs/metrics is one).
type UsageObserver interface {
	UsageRecorded(tenant, meter string, quantity float64)
}

type sbxMeter struct {
	tenant     string
	gen        int
	cpuRaw     uint64    // the last counter reading of incarnation gen
	lastSample time.Time // the end of the memory time already counted
	readAt     time.Time // when the reading in cpuRaw was taken
	// pending amounts, not yet in a record
	cpuNS                  uint64
	memGiBs                float64
	egressReq, egressBytes int64
	checkpoints, restores  int64
	// cursors: how far the sandbox stream and the effect journal are
	// counted (in a record, or in the pending amounts above); valid once
	// cursors is set (meterCursors).
	cursors        bool
	sbxSeq, effSeq uint64
	moved          bool // the cursors moved since the last record
}

func (m *sbxMeter) idle() bool {
	return !m.moved && m.cpuNS == 0 && m.memGiBs == 0 && m.egressReq == 0 && m.egressBytes == 0 && m.checkpoints == 0 && m.restores == 0
}

type metering struct {
	mu     sync.Mutex
	sbx    map[string]*sbxMeter
	unsent map[string][]eventlog.Event // tenant → a built batch whose append failed
	// lastEnd is the end of the last interval built: an interval is never
	// built twice by one engine (a tick late or repeated waits for the next).
	lastEnd time.Time
}

// meterState returns sb's state, creating it from the log (the last
// cpu_seconds record of sb) when the engine has none. Called with mu held.
func (e *billing) meterState(ctx context.Context, sb meta.Sandbox, now time.Time) *sbxMeter {
	m := e.mtr.state.sbx[sb.ID]
	if m != nil && m.gen >= 0 {
		return m
	}
	if m == nil {
		m = &sbxMeter{}
	}
	// New here (or only counted so far): its baseline is in the log.
	m.tenant, m.gen, m.lastSample = sb.Tenant, sb.Generation, sb.Updated
	if rec, ok, err := e.lastUsage(ctx, sb.Tenant, sb.ID); err != nil {
		e.lg.Warn("metering: read last usage record", "sandbox_id", sb.ID, "err", err)
	} else if ok {
		if rec.Generation == sb.Generation {
			m.cpuRaw, m.lastSample = rec.Counter, rec.End
		}
		e.cursorsFrom(ctx, m, sb.ID, rec)
	} else {
		e.cursorsFrom(ctx, m, sb.ID, UsageRecord{Cursors: true}) // never recorded: count from the start
	}
	if m.lastSample.IsZero() || m.lastSample.After(now) {
		m.lastSample = now
	}
	e.mtr.state.sbx[sb.ID] = m
	return m
}

// lastUsage finds the newest cpu_seconds record of sandbox id in tenant's
// usage stream, reading it backwards a page at a time.
func (e *billing) lastUsage(ctx context.Context, tenant, id string) (UsageRecord, bool, error) {
	b, err := e.log.Bounds(ctx, UsageStream(tenant))
	if err != nil {
		return UsageRecord{}, false, err
	}
	for hi := b.Head; hi >= b.First && hi > 0; {
		lo := b.First
		if hi >= usageReadPage && hi-usageReadPage+1 > lo {
			lo = hi - usageReadPage + 1
		}
		evs, err := e.log.Read(ctx, UsageStream(tenant), lo, int(hi-lo+1))
		if err != nil {
			return UsageRecord{}, false, err
		}
		for i := len(evs) - 1; i >= 0; i-- {
			var r UsageRecord
			if evs[i].Type != EventUsageRecorded || json.Unmarshal(evs[i].Payload, &r) != nil {
				continue
			}
			if r.Sandbox == id && r.Meter == MeterCPUSeconds {
				return r, true, nil
			}
		}
		if lo == b.First {
			break
		}
		hi = lo - 1
	}
	return UsageRecord{}, false, nil
}

// readUsage reads sandbox id's counters from the driver (without the
// metering lock: the gateway's decisions are counted meanwhile).
func (e *billing) readUsage(ctx context.Context, id string) (sandbox.Usage, error) {
	ur, ok := e.drv.(sandbox.UsageReporter)
	if !ok {
		return sandbox.Usage{}, errdefs.FailedPreconditionf("driver %s reports no usage", e.drv.Name())
	}
	return ur.Usage(ctx, id)
}

// applyLocked adds the deltas of reading u of sb, taken at readAt, to sb's
// pending amounts, counting memory time up to now. A reading older than
// the last one applied (the loop's, overtaken by a final sample before a
// kill) is dropped: applied late it would look like a new cgroup and be
// counted twice. Called with mu held.
func (e *billing) applyLocked(ctx context.Context, sb meta.Sandbox, u sandbox.Usage, readAt, now time.Time) {
	m := e.meterState(ctx, sb, now)
	if readAt.Before(m.readAt) {
		return
	}
	m.readAt = readAt
	if sb.Generation != m.gen {
		// A new incarnation: its cgroup counts from zero, and its memory
		// time from the restore (the row's update).
		m.gen, m.cpuRaw = sb.Generation, 0
		if sb.Updated.After(m.lastSample) && !sb.Updated.After(now) {
			m.lastSample = sb.Updated
		}
	}
	if u.CPUNanos < m.cpuRaw {
		m.cpuRaw = 0 // a new cgroup: a new baseline, never a negative delta
	}
	m.cpuNS += u.CPUNanos - m.cpuRaw
	m.cpuRaw = u.CPUNanos
	if d := now.Sub(m.lastSample); d > 0 {
		m.memGiBs += float64(u.MemoryBytes) / gib * d.Seconds()
	}
	m.lastSample = now
}

// meterFinal samples sb one last time before the engine stops its
// processes (see the package comment); errors are logged.
func (e *billing) meterFinal(ctx context.Context, id string) {
	if e.mtr.every <= 0 {
		return
	}
	sb, err := e.meta.Get(ctx, id)
	if err != nil || sb.Tenant == "" || sb.Pooled || sb.State != meta.StateRunning {
		return
	}
	u, err := e.readUsage(ctx, id)
	now := e.clock.Now()
	if err != nil {
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			e.lg.Warn("metering: final sample", "sandbox_id", id, "err", err)
		}
		return
	}
	e.mtr.state.mu.Lock()
	defer e.mtr.state.mu.Unlock()
	e.applyLocked(ctx, sb, u, now, now)
}

// meterCount adds n to one of sandbox id's counting meters.
func (e *billing) meterCount(tenant, id, meter string, n int64) {
	if e.mtr.every <= 0 || tenant == "" || n == 0 {
		return
	}
	e.mtr.state.mu.Lock()
	defer e.mtr.state.mu.Unlock()
	m := e.mtr.state.sbx[id]
	if m == nil {
		// Not sampled yet: its baseline comes from the log at the first
		// sample (gen -1 never matches a row: the first sample resets it).
		m = &sbxMeter{tenant: tenant, gen: -1}
		e.mtr.state.sbx[id] = m
	}
	switch meter {
	case MeterEgressRequests:
		m.egressReq += n
	case MeterEgressBytes:
		m.egressBytes += n
	case MeterCheckpoints:
		m.checkpoints += n
	case MeterRestores:
		m.restores += n
	}
}

// MeterDecision meters one gateway decision (cmd/amber passes every one)
// that the effect journal does not hold: a proxied stream, or a request
// forwarded with the journal off, is one egress request and its bytes both
// ways. Journaled forwards are counted from their effect.outcome events
// (countLogs); replays (answered from the journal) and refusals reached
// nobody and are not egress.
func (e *billing) MeterDecision(d gateway.Decision) {
	if d.Kind != "forward" && d.Kind != "stream" || d.Journaled {
		return // journaled forwards are counted from the journal
	}
	e.meterCount(d.Tenant, d.Sandbox, MeterEgressRequests, 1)
	e.meterCount(d.Tenant, d.Sandbox, MeterEgressBytes, d.BytesIn+d.BytesOut)
}

// meterLoop samples and records at every interval boundary until ctx ends.
func (e *billing) meterLoop(ctx context.Context) {
	for {
		now := e.clock.Now()
		next := now.Truncate(e.mtr.every).Add(e.mtr.every)
		t := time.NewTimer(next.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if err := e.meterTick(ctx, next); err != nil && ctx.Err() == nil {
			e.lg.Warn("metering", "err", err)
		}
		e.enforceBudgets(ctx)
	}
}

// meterTick closes the interval ending at end: sample, build, append (see
// the durability order above).
func (e *billing) meterTick(ctx context.Context, end time.Time) error {
	if !end.After(e.mtr.state.lastEnd) {
		return nil
	}
	e.mtr.state.lastEnd = end
	start := end.Add(-e.mtr.every)
	rows, err := e.meta.List(ctx, e.mine(meta.Filter{States: []meta.State{meta.StateRunning}}))
	if err != nil {
		return err
	}
	tenants, err := e.meta.ListTenants(ctx)
	if err != nil {
		return err
	}
	type reading struct {
		sb meta.Sandbox
		u  sandbox.Usage
		at time.Time
	}
	var readings []reading
	for _, sb := range rows {
		if sb.Pooled || sb.Tenant == "" {
			continue
		}
		u, err := e.readUsage(ctx, sb.ID)
		if err != nil {
			if !errors.Is(err, errdefs.ErrFailedPrecondition) && !errdefs.IsNotFound(err) {
				e.lg.Warn("metering: sample", "sandbox_id", sb.ID, "err", err)
			}
			continue
		}
		readings = append(readings, reading{sb, u, e.clock.Now()})
	}
	e.mtr.state.mu.Lock()
	running := map[string]bool{}
	for _, r := range readings {
		e.applyLocked(ctx, r.sb, r.u, r.at, end)
		running[r.sb.ID] = true
	}
	// Counts from the logs: note the cursors, read without the lock (the
	// gateway's decisions are counted meanwhile), add what was found.
	type cursor struct{ sbx, eff uint64 }
	cursors := map[string]cursor{}
	for id, m := range e.mtr.state.sbx {
		if !m.cursors {
			e.ensureCursors(ctx, id, m)
		}
		if m.cursors {
			cursors[id] = cursor{m.sbxSeq, m.effSeq}
		}
	}
	e.mtr.state.mu.Unlock()
	found := map[string]logCounts{}
	for id, c := range cursors {
		n, err := e.countLogs(ctx, id, c.sbx, c.eff)
		if err != nil {
			e.lg.Warn("metering: count from the logs", "sandbox_id", id, "err", err)
			continue
		}
		found[id] = n
	}
	e.mtr.state.mu.Lock()
	for id, n := range found {
		m := e.mtr.state.sbx[id]
		if m == nil || m.sbxSeq != cursors[id].sbx || m.effSeq != cursors[id].eff {
			continue // only this loop moves cursors; be safe anyway
		}
		m.checkpoints += n.checkpoints
		m.restores += n.restores
		m.egressReq += n.egressReq
		m.egressBytes += n.egressBytes
		if n.sbxSeq != m.sbxSeq || n.effSeq != m.effSeq {
			m.sbxSeq, m.effSeq, m.moved = n.sbxSeq, n.effSeq, true
		}
	}
	batches := map[string][]eventlog.Event{}
	var ids []string
	for id := range e.mtr.state.sbx {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		m := e.mtr.state.sbx[id]
		if !running[id] && m.idle() {
			delete(e.mtr.state.sbx, id) // stopped and fully recorded; the log has its baseline
			continue
		}
		rec := func(meter string, q float64) {
			r := UsageRecord{Sandbox: id, Meter: meter, Start: start, End: end, Quantity: q}
			if meter == MeterCPUSeconds {
				r.Counter, r.Generation = m.cpuRaw, m.gen
				r.Cursors, r.SandboxSeq, r.EffectsSeq = m.cursors, m.sbxSeq, m.effSeq
			}
			batches[m.tenant] = append(batches[m.tenant], usageEvent(m.tenant, r))
		}
		// cpu_seconds always, while running: its Counter is the baseline a
		// restarted daemon continues from; and whenever counts are
		// recorded: its cursors say what they counted (same batch).
		if running[id] || !m.idle() {
			rec(MeterCPUSeconds, float64(m.cpuNS)/1e9)
		}
		m.moved = false
		if m.memGiBs > 0 {
			rec(MeterMemoryGiBSeconds, m.memGiBs)
		}
		for _, c := range []struct {
			meter string
			n     *int64
		}{{MeterEgressRequests, &m.egressReq}, {MeterEgressBytes, &m.egressBytes}, {MeterCheckpoints, &m.checkpoints}, {MeterRestores, &m.restores}} {
			if *c.n > 0 {
				rec(c.meter, float64(*c.n))
			}
			*c.n = 0
		}
		m.cpuNS, m.memGiBs = 0, 0
	}
	e.mtr.state.mu.Unlock()

	// Checkpoint storage: the tenant's committed checkpoints' stored bytes
	// (after deduplication) × the interval.
	for _, t := range tenants {
		n, err := e.meta.CheckpointBytes(ctx, t.ID)
		if err != nil || n <= 0 {
			continue
		}
		batches[t.ID] = append(batches[t.ID], usageEvent(t.ID, UsageRecord{Meter: MeterStorageGiBHours,
			Start: start, End: end, Quantity: float64(n) / gib * e.mtr.every.Hours()}))
	}

	errs := e.sendUsage(ctx, batches)
	e.refreshBudgets(ctx, tenants) // usage changed: budgets are worked out again (budget.go)
	if len(errs) > 0 {
		return fmt.Errorf("append usage: %w (kept for the next interval)", errs[0])
	}
	return nil
}

// sendUsage appends each tenant's batch of usage events, after what an
// earlier interval could not send; what fails is kept for the next one.
func (e *billing) sendUsage(ctx context.Context, batches map[string][]eventlog.Event) []error {
	var errs []error
	names := map[string]bool{}
	for t := range batches {
		names[t] = true
	}
	for t := range e.mtr.state.unsent {
		names[t] = true
	}
	for t := range names {
		if old := e.mtr.state.unsent[t]; len(old) > 0 {
			if err := e.appendUsage(ctx, t, old); err != nil {
				// Keep both: the old batch first, the new one next time.
				e.mtr.state.unsent[t] = append(old, batches[t]...)
				errs = append(errs, err)
				continue
			}
			delete(e.mtr.state.unsent, t)
		}
		if len(batches[t]) == 0 {
			continue
		}
		if err := e.appendUsage(ctx, t, batches[t]); err != nil {
			e.mtr.state.unsent[t] = batches[t]
			errs = append(errs, err)
		}
	}
	return errs
}

func usageEvent(tenant string, r UsageRecord) eventlog.Event {
	p, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	who := r.Sandbox
	if who == usageTenantWideSandbox {
		who = "tenant"
	}
	return eventlog.Event{Tenant: tenant, Stream: UsageStream(tenant), Type: EventUsageRecorded, Version: 1,
		ID: fmt.Sprintf("usage.%s.%s.%d", who, r.Meter, r.Start.UnixNano()), Payload: p}
}

// appendUsage appends one tenant's batch and, once acknowledged (and not a
// duplicate), tells the observer. A Conflict (some ids recorded with other
// content: a clock that went back across a restart) falls back to one
// append per event: the records already there stay as they are (that
// interval was counted), the conflicting new ones are dropped and logged,
// the others land.
func (e *billing) appendUsage(ctx context.Context, tenant string, evs []eventlog.Event) error {
	res, err := e.log.Append(ctx, UsageStream(tenant), 0, eventlog.Any, evs...)
	if errdefs.IsConflict(err) && len(evs) > 1 {
		for _, ev := range evs {
			if err := e.appendUsage(ctx, tenant, []eventlog.Event{ev}); err != nil {
				return err
			}
		}
		return nil
	}
	if errdefs.IsConflict(err) {
		e.lg.Error("metering: usage record already recorded with other content; dropped", "tenant_id", tenant, "event", evs[0].ID, "payload", string(evs[0].Payload))
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", UsageStream(tenant), err)
	}
	if uo, ok := e.obs.(UsageObserver); ok && !res.Duplicate {
		for _, ev := range evs {
			var r UsageRecord
			if json.Unmarshal(ev.Payload, &r) == nil {
				uo.UsageRecorded(tenant, r.Meter, r.Quantity)
			}
		}
	}
	return nil
}

// UsageQuery selects usage records of one tenant.
type UsageQuery struct {
	Tenant   string
	From, To time.Time // records attributed (UsageRecord.At) to [From, To); zero: unbounded
	// GroupBy: "meter" (default), "sandbox" (sandbox and meter) or "day"
	// (UTC day and meter).
	GroupBy string
}

// UsageRow is one line of a usage report.
type UsageRow struct {
	Sandbox  string  `json:"sandbox,omitempty"`
	Day      string  `json:"day,omitempty"`
	Meter    string  `json:"meter"`
	Quantity float64 `json:"quantity"`
	Records  int     `json:"records"`
}

// Usage reads q.Tenant's usage stream and sums the records in range.
func (e *billing) Usage(ctx context.Context, q UsageQuery) ([]UsageRow, error) {
	switch q.GroupBy {
	case "":
		q.GroupBy = "meter"
	case "meter", "sandbox", "day":
	default:
		return nil, errdefs.InvalidArgumentf("group_by %.40q: want sandbox, meter or day", q.GroupBy)
	}
	recs, err := e.UsageRecords(ctx, q.Tenant, q.From, q.To)
	if err != nil {
		return nil, err
	}
	type key struct{ sbx, day, meter string }
	sums := map[key]*UsageRow{}
	var order []key
	for _, r := range recs {
		k := key{meter: r.Meter}
		switch q.GroupBy {
		case "sandbox":
			k.sbx = r.Sandbox
		case "day":
			k.day = r.At().Format("2006-01-02")
		}
		row := sums[k]
		if row == nil {
			row = &UsageRow{Sandbox: k.sbx, Day: k.day, Meter: k.meter}
			sums[k] = row
			order = append(order, k)
		}
		row.Quantity += r.Quantity
		row.Records++
	}
	rank := map[string]int{}
	for i, m := range Meters {
		rank[m] = i
	}
	sort.Slice(order, func(i, j int) bool {
		a, b := order[i], order[j]
		if a.day != b.day {
			return a.day < b.day
		}
		if a.sbx != b.sbx {
			return a.sbx < b.sbx
		}
		return rank[a.meter] < rank[b.meter]
	})
	out := make([]UsageRow, 0, len(order))
	for _, k := range order {
		out = append(out, *sums[k])
	}
	return out, nil
}

// UsageRecords returns tenant's usage records attributed (At) to
// [from, to) (zero bounds: unbounded), in log order.
func (e *billing) UsageRecords(ctx context.Context, tenant string, from, to time.Time) ([]UsageRecord, error) {
	if tenant == "" {
		return nil, errdefs.InvalidArgumentf("usage: tenant is empty")
	}
	out, err := e.modelUsage(ctx, tenant, from, to)
	if err != nil {
		return nil, err
	}
	var pos uint64
	err = e.readAfter(ctx, UsageStream(tenant), &pos, func(ev eventlog.Event) error {
		var r UsageRecord
		if ev.Type != EventUsageRecorded {
			return nil
		}
		if err := json.Unmarshal(ev.Payload, &r); err != nil {
			return errdefs.DataLossf("usage record %s/%d: %v", UsageStream(tenant), ev.Seq, err)
		}
		if at := r.At(); (from.IsZero() || !at.Before(from)) && (to.IsZero() || at.Before(to)) {
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ModelUsage reads a tenant's model token usage in [from, to) from where it
// is recorded once: the sessions' logs (package session provides it; the
// engine cannot import it). Its records carry the session id as Sandbox.
type ModelUsage func(ctx context.Context, tenant string, from, to time.Time) ([]UsageRecord, error)

// SetModelUsage makes usage reports include model tokens.
func (e *billing) SetModelUsage(f ModelUsage) {
	e.mtr.state.mu.Lock()
	e.mtr.modelUsageFn = f
	e.mtr.state.mu.Unlock()
}

func (e *billing) modelUsage(ctx context.Context, tenant string, from, to time.Time) ([]UsageRecord, error) {
	e.mtr.state.mu.Lock()
	f := e.mtr.modelUsageFn
	e.mtr.state.mu.Unlock()
	if f == nil {
		return nil, nil
	}
	return f(ctx, tenant, from, to)
}

// meter is the state of metering (metering.go) and budgets (budget.go).
type meter struct {
	every        time.Duration
	state        metering
	budget       budgetState
	modelUsageFn ModelUsage
}

// billing is metering and budgets: it samples sandboxes' usage, appends
// usage.recorded, and stops or refuses tenants past their budgets. It
// watches the lifecycle through its hooks (meterHooks, budgetHooks:
// lifecycle.go), so nothing of the lifecycle, checkpoint or restore code
// calls into it; it checkpoints through ckr the sandboxes a used-up
// budget stops.
type billing struct {
	*core
	mtr meter
	ckr *checkpointer
}

// init sets the metering interval (0: defaultMeterInterval; negative
// disables metering) and empties the state.
func (m *meter) init(every time.Duration) {
	m.every = every
	if m.every == 0 {
		m.every = defaultMeterInterval
	}
	m.state = metering{sbx: map[string]*sbxMeter{}, unsent: map[string][]eventlog.Event{}}
}

// meterHooks is metering's lifecycleObserver (lifecycle.go): a sandbox is
// sampled one last time before it stops, and retention keeps what metering
// has yet to count.
type meterHooks struct{ e *billing }

func (h meterHooks) stopping(ctx context.Context, id string) { h.e.meterFinal(ctx, id) }

func (meterHooks) admit(context.Context, string) error { return nil }

func (meterHooks) suspends(meta.Sandbox) bool { return false }

func (h meterHooks) keepFrom(ctx context.Context, tenant, id string) (uint64, error) {
	n, err := h.e.meterKeepFrom(ctx, tenant, id)
	if err != nil {
		return 0, fmt.Errorf("metering cursor of %s: %w", id, err)
	}
	return n, nil
}
