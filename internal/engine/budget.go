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
	"github.com/amber-run/amber/internal/meta"
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
// Month-to-date sums are kept per tenant in memory and read on from the
// usage stream's last position at each check (the first check of a tenant
// reads its whole stream once).

// budgetReason is the stop reason of a sandbox stopped for its tenant's
// used-up budget.
const budgetReason = "usage budget used up: checkpointed and stopped; the next call once the budget allows resumes it"

func budgetStopped(sb meta.Sandbox) bool {
	return sb.State == meta.StateStopped && sb.Reason == budgetReason
}

type budgetState struct {
	mu      sync.Mutex
	tenants map[string]*monthSums
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
func (e *Engine) MonthToDate(ctx context.Context, tenant string) (map[string]float64, error) {
	now := e.clock.Now()
	month := monthStart(now)
	key := month.Format("2006-01")
	e.budget.mu.Lock()
	defer e.budget.mu.Unlock()
	if e.budget.tenants == nil {
		e.budget.tenants = map[string]*monthSums{}
	}
	ms := e.budget.tenants[tenant]
	if ms == nil {
		ms = &monthSums{sums: map[string]map[string]float64{}}
		e.budget.tenants[tenant] = ms
	}
	stream := UsageStream(tenant)
	for {
		evs, err := e.log.Read(ctx, stream, ms.through+1, usageReadPage)
		if errdefs.IsCompacted(err) {
			b, berr := e.log.Bounds(ctx, stream)
			if berr != nil {
				return nil, berr
			}
			ms.through = b.First - 1
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("month to date of %s: %w", tenant, err)
		}
		for _, ev := range evs {
			ms.through = ev.Seq
			var r UsageRecord
			if ev.Type != EventUsageRecorded || json.Unmarshal(ev.Payload, &r) != nil {
				continue
			}
			k := r.Start.UTC().Format("2006-01")
			if ms.sums[k] == nil {
				ms.sums[k] = map[string]float64{}
			}
			ms.sums[k][r.Meter] += r.Quantity
		}
		if len(evs) < usageReadPage {
			break
		}
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
// up (see the comment at the top).
func (e *Engine) checkBudgets(ctx context.Context, tenant string) error {
	q, err := e.meta.TenantQuota(ctx, tenant)
	if err != nil || len(q.Budgets) == 0 {
		return err
	}
	over, used, limit, err := e.overBudget(ctx, tenant, q)
	if err != nil || over == "" {
		return err
	}
	next := monthStart(e.clock.Now()).AddDate(0, 1, 0)
	return e.refuse(tenant, "budget_"+over, "usage budget %s of tenant %s used up: %.6g of %.6g this month (it renews %s; the operator may raise it with `amber tenant quota %s --budget %s=N`)",
		over, tenant, used, limit, next.Format("2006-01-02"), tenant, over)
}

// overBudget names the first of q's budgets (by meter order) that tenant
// has used up this month ("" if none).
func (e *Engine) overBudget(ctx context.Context, tenant string, q meta.TenantQuota) (meter string, used, limit float64, err error) {
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

// enforceBudgets checkpoints and stops the running sandboxes of every
// tenant that has used up a budget (called after each metering interval).
func (e *Engine) enforceBudgets(ctx context.Context) {
	tenants, err := e.meta.ListTenants(ctx)
	if err != nil {
		e.lg.Warn("budgets: list tenants", "err", err)
		return
	}
	for _, t := range tenants {
		q, err := e.meta.TenantQuota(ctx, t.ID)
		if err != nil || len(q.Budgets) == 0 {
			continue
		}
		over, used, limit, err := e.overBudget(ctx, t.ID, q)
		if err != nil {
			e.lg.Warn("budgets: month to date", "tenant_id", t.ID, "err", err)
			continue
		}
		if over == "" {
			continue
		}
		tenant := t.ID
		rows, err := e.meta.List(ctx, e.mine(meta.Filter{Tenant: &tenant, States: []meta.State{meta.StateRunning}}))
		if err != nil {
			continue
		}
		for _, sb := range rows {
			if sb.Pooled || sb.Driver != e.drv.Name() {
				continue
			}
			ck, err := e.Checkpoint(ctx, CheckpointRequest{Tenant: sb.Tenant, Sandbox: sb.ID, Stop: true, stopReason: budgetReason})
			if err == nil || !errors.Is(err, errdefs.ErrFailedPrecondition) {
				e.auditSystem(ctx, sb.Tenant, "sandbox.budget_stop", sb.ID+" "+ck.ID+" "+over, err)
			}
			if err != nil {
				e.lg.Warn("budget: stop sandbox", "sandbox_id", sb.ID, "err", err)
				continue
			}
			e.lg.Info("budget used up: sandbox checkpointed and stopped", "sandbox_id", sb.ID, "tenant_id", sb.Tenant,
				"budget", over, "used", used, "limit", limit, "checkpoint_id", ck.ID)
		}
	}
}
