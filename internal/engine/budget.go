package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/state/meta"
)

// Usage budgets: quotas enforced from the meters.
//
// A tenant's quota may bound what it consumes per calendar month (UTC), per
// meter (meta.TenantQuota.Budgets, e.g. cpu_seconds: 36000). What counts
// is exactly what the usage records say (metering.go) — the same numbers
// the tenant is billed for — plus, for model tokens, the sessions' logs.
// Usage not yet in a record (the open interval) is not counted, so a
// budget can be passed by at most one interval's consumption.
//
// Once any budget is used up:
//   - new work is refused with errdefs.ErrResourceExhausted (429) naming
//     the budget: creating, forking or restoring a sandbox, exec and
//     process starts (and any call that would resume a stopped sandbox);
//     listing, events, usage, checkpoints and destroy keep working;
//   - at the end of each interval the engine checkpoints and stops the
//     tenant's running sandboxes (stop reason budgetReason): their state
//     is kept exactly, nothing is lost. The first call into one once the
//     budget allows again (a new month, a raised budget) resumes it from
//     that checkpoint, as for an idle stop (idle.go).
//
// Usage only changes when an interval's records are appended, so whether a
// tenant is over a budget is worked out then (meterTick → refreshBudgets)
// and when its quota is set, and kept in memory: the checks on the call
// paths (exec, create…) are a map lookup. Month-to-date sums are read on
// from the usage stream's last position (a tenant's first reading reads
// its whole stream once).

// budgetReason is the stop reason of a sandbox stopped for its tenant's
// used-up budget.
const budgetReason = "usage budget used up: checkpointed and stopped; the next call once the budget allows resumes it"

func budgetStopped(sb meta.Sandbox) bool {
	return sb.State == meta.StateStopped && sb.Reason == budgetReason
}

type budgetState struct {
	mu      sync.Mutex
	tenants map[string]*monthSums
	over    map[string]budgetOver // tenant → its state at the last refresh
}

// budgetOver names the budget a tenant has used up ("" meter: none).
type budgetOver struct {
	meter       string
	used, limit float64
}

// monthSums is a tenant's usage per month ("2006-01") and meter, from its
// usage stream read through seq through.
type monthSums struct {
	through uint64
	sums    map[string]map[string]float64
}

func monthStart(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// checkBudgetNames refuses budgets on meters that do not exist.
func checkBudgetNames(q meta.TenantQuota) error {
	for m := range q.Budgets {
		if !slices.Contains(Meters, m) {
			return errdefs.InvalidArgumentf("budget on unknown meter %q: want one of %s", m, strings.Join(Meters, ", "))
		}
	}
	return nil
}

// MonthToDate returns what tenant consumed this calendar month (UTC), per
// meter, as its budgets count it.
func (e *billing) MonthToDate(ctx context.Context, tenant string) (map[string]float64, error) {
	now := e.clock.Now()
	month := monthStart(now)
	key := month.Format("2006-01")
	e.mtr.budget.mu.Lock()
	defer e.mtr.budget.mu.Unlock()
	if e.mtr.budget.tenants == nil {
		e.mtr.budget.tenants = map[string]*monthSums{}
	}
	ms := e.mtr.budget.tenants[tenant]
	if ms == nil {
		ms = &monthSums{sums: map[string]map[string]float64{}}
		e.mtr.budget.tenants[tenant] = ms
	}
	err := e.readAfter(ctx, UsageStream(tenant), &ms.through, func(ev eventlog.Event) error {
		var r UsageRecord
		if ev.Type != EventUsageRecorded || json.Unmarshal(ev.Payload, &r) != nil {
			return nil
		}
		k := r.At().Format("2006-01") // the month it ended in (UsageRecord)
		if ms.sums[k] == nil {
			ms.sums[k] = map[string]float64{}
		}
		ms.sums[k][r.Meter] += r.Quantity
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("month to date of %s: %w", tenant, err)
	}
	for k := range ms.sums {
		if k < month.AddDate(0, -1, 0).Format("2006-01") {
			delete(ms.sums, k) // older months are never asked again
		}
	}
	out := map[string]float64{}
	for m, v := range ms.sums[key] {
		out[m] = v
	}
	// Model tokens are not in the usage stream: the sessions' logs hold them.
	model, err := e.modelUsage(ctx, tenant, month, now.Add(time.Nanosecond))
	if err != nil {
		return nil, err
	}
	for _, r := range model {
		out[r.Meter] += r.Quantity
	}
	return out, nil
}

// checkBudgets refuses new work of tenant when one of its budgets is used
// up (see the comment at the top): the state of the last refresh, or a
// refresh for a tenant not seen yet.
func (e *billing) checkBudgets(ctx context.Context, tenant string) error {
	e.mtr.budget.mu.Lock()
	o, ok := e.mtr.budget.over[tenant]
	e.mtr.budget.mu.Unlock()
	if !ok {
		var err error
		if o, err = e.refreshBudget(ctx, tenant); err != nil {
			return err
		}
	}
	if o.meter == "" {
		return nil
	}
	next := monthStart(e.clock.Now()).AddDate(0, 1, 0)
	return e.refuse(tenant, "budget_"+o.meter, "usage budget %s of tenant %s used up: %.6g of %.6g this month (it renews %s; the operator may raise it with `amber tenant quota %s --budget %s=N`)",
		o.meter, tenant, o.used, o.limit, next.Format("2006-01-02"), tenant, o.meter)
}

// refreshBudget works out and keeps whether tenant is over a budget now.
func (e *billing) refreshBudget(ctx context.Context, tenant string) (budgetOver, error) {
	var o budgetOver
	q, err := e.meta.TenantQuota(ctx, tenant)
	if err != nil {
		return o, err
	}
	if len(q.Budgets) > 0 {
		if o.meter, o.used, o.limit, err = e.overBudget(ctx, tenant, q); err != nil {
			return o, err
		}
	}
	e.mtr.budget.mu.Lock()
	if e.mtr.budget.over == nil {
		e.mtr.budget.over = map[string]budgetOver{}
	}
	e.mtr.budget.over[tenant] = o
	e.mtr.budget.mu.Unlock()
	return o, nil
}

// refreshBudgets refreshes every tenant's budget state (after an
// interval's records were appended); errors keep the previous state.
func (e *billing) refreshBudgets(ctx context.Context, tenants []meta.Tenant) {
	for _, t := range tenants {
		if _, err := e.refreshBudget(ctx, t.ID); err != nil && ctx.Err() == nil {
			e.lg.Warn("budgets: month to date", "tenant_id", t.ID, "err", err)
		}
	}
}

// overBudget names the first of q's budgets (by meter order) that tenant
// has used up this month ("" if none).
func (e *billing) overBudget(ctx context.Context, tenant string, q meta.TenantQuota) (meter string, used, limit float64, err error) {
	mtd, err := e.MonthToDate(ctx, tenant)
	if err != nil {
		return "", 0, 0, err
	}
	names := make([]string, 0, len(q.Budgets))
	for m := range q.Budgets {
		names = append(names, m)
	}
	rank := map[string]int{}
	for i, m := range Meters {
		rank[m] = i
	}
	sort.Slice(names, func(i, j int) bool { return rank[names[i]] < rank[names[j]] })
	for _, m := range names {
		if mtd[m] >= q.Budgets[m] {
			return m, mtd[m], q.Budgets[m], nil
		}
	}
	return "", 0, 0, nil
}

// enforceBudgets checkpoints and stops this node's running sandboxes of
// every tenant that has used up a budget (called after each metering
// interval, which refreshed the states).
func (e *billing) enforceBudgets(ctx context.Context) {
	e.mtr.budget.mu.Lock()
	over := map[string]budgetOver{}
	for t, o := range e.mtr.budget.over {
		if o.meter != "" {
			over[t] = o
		}
	}
	e.mtr.budget.mu.Unlock()
	for tenant, o := range over {
		rows, err := e.meta.List(ctx, e.mine(meta.Filter{Tenant: &tenant, States: []meta.State{meta.StateRunning}}))
		if err != nil {
			continue
		}
		for _, sb := range rows {
			if sb.Pooled || sb.Driver != e.drv.Name() {
				continue
			}
			ck, err := e.ckr.Checkpoint(ctx, CheckpointRequest{Tenant: sb.Tenant, Sandbox: sb.ID, Stop: true, stopReason: budgetReason})
			if err == nil || !errors.Is(err, errdefs.ErrFailedPrecondition) {
				e.auditSystem(ctx, sb.Tenant, "sandbox.budget_stop", sb.ID+" "+ck.ID+" "+o.meter, err)
			}
			if err != nil {
				e.lg.Warn("budget: stop sandbox", "sandbox_id", sb.ID, "err", err)
				continue
			}
			e.lg.Info("budget used up: sandbox checkpointed and stopped", "sandbox_id", sb.ID, "tenant_id", sb.Tenant,
				"budget", o.meter, "used", o.used, "limit", o.limit, "checkpoint_id", ck.ID)
		}
	}
}

// budgetHooks is budgets' lifecycleObserver (lifecycle.go): a tenant whose
// budget is used up starts no new work (no sandbox created, restored or
// resumed, no exec), and a sandbox it stopped is suspended.
type budgetHooks struct{ e *billing }

func (budgetHooks) stopping(context.Context, string) {}

func (h budgetHooks) admit(ctx context.Context, tenant string) error {
	return h.e.checkBudgets(ctx, tenant)
}

func (budgetHooks) suspends(sb meta.Sandbox) bool { return budgetStopped(sb) }

func (budgetHooks) keepFrom(context.Context, string, string) (uint64, error) { return 0, nil }
