package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

// TestUsageBudget: a monthly budget on a meter is enforced from the usage
// records. Under the budget everything works; once the recorded CPU passes
// it, exec and create are refused with 429 naming the budget, the tenant's
// running sandbox is checkpointed and stopped (its state kept), a call
// into it is refused rather than resuming it; raising the budget lets the
// next call resume it from that checkpoint with its files.
//
// It runs on several calendars (the wall clock moved, running at its pace,
// never today's date): mid-month, seconds after midnight of the 1st (the 24 h interval closed by hand
// began in the previous month: its CPU is still this month's), a leap day
// and the night of a DST change (UTC has none; a local zone must not leak in).
func TestUsageBudget(t *testing.T) {
	for _, c := range []struct {
		name string
		at   time.Time
	}{
		{"mid-month", time.Date(2027, 6, 15, 12, 0, 0, 0, time.UTC)},
		{"first-of-month", time.Date(2027, 1, 1, 0, 0, 3, 0, time.UTC)},
		// Mid-day: at 23:59:58 the metering loop's own 24 h boundary would
		// close Feb 29's interval during the burn and rightly charge that
		// part to February.
		{"leap-day", time.Date(2028, 2, 29, 12, 0, 0, 0, time.UTC)},
		{"dst-change", time.Date(2027, 3, 28, 0, 59, 58, 0, time.UTC)}, // 01:00 UTC: Europe springs forward
	} {
		t.Run(c.name, func(t *testing.T) { testUsageBudget(t, clock.NewShifted(c.at)) })
	}
}

func testUsageBudget(t *testing.T, clk clock.Clock) {
	env := enginetest.New(t, engine.Options{MeterInterval: 24 * time.Hour, Clock: clk}) // intervals closed by hand
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const tenant = "default"
	for _, bad := range []meta.TenantQuota{
		{Budgets: map[string]float64{"cpu_hours": 1}},
		{Budgets: map[string]float64{engine.MeterCPUSeconds: -1}},
	} {
		if err := e.SetTenantQuota(ctx, tenant, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("budget %v: %v, want invalid argument", bad.Budgets, err)
		}
	}
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: tenant, Template: "minimal", Cold: true, Limits: sandbox.Limits{MilliCPUs: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	exec := func(cmd string) (sandbox.ExitStatus, error) {
		return e.Exec(ctx, tenant, sb.ID, sandbox.ExecSpec{Args: []string{"sh", "-c", cmd}})
	}
	if err := e.SetTenantQuota(ctx, tenant, meta.TenantQuota{Budgets: map[string]float64{engine.MeterCPUSeconds: 0.1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := exec("echo kept > /root/state; end=$(($(date +%s)+2)); while [ $(date +%s) -lt $end ]; do :; done"); err != nil {
		t.Fatalf("exec under the budget: %v", err)
	}
	end := clk.Now()
	if err := e.MeterTick(ctx, end); err != nil {
		t.Fatal(err)
	}
	mtd, err := e.MonthToDate(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("month to date: %v", mtd)
	if mtd[engine.MeterCPUSeconds] < 0.1 {
		t.Fatalf("the burner recorded %.3f CPU-seconds, want ≥ 0.1 to pass the budget", mtd[engine.MeterCPUSeconds])
	}
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "cpu_seconds") {
			t.Errorf("%s over the budget: %v, want resource exhausted naming cpu_seconds", what, err)
		}
	}
	_, err = exec("true")
	refused("exec", err)
	_, err = e.Create(ctx, engine.CreateRequest{Tenant: tenant, Template: "minimal", Cold: true})
	refused("create", err)

	e.EnforceBudgets(ctx)
	got, err := e.Get(ctx, tenant, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != meta.StateStopped {
		t.Fatalf("over budget: sandbox is %s (%s), want stopped", got.State, got.Reason)
	}
	t.Logf("stopped: %s", got.Reason)
	if cks, err := e.ListCheckpoints(ctx, tenant, sb.ID, false); err != nil || len(cks) == 0 {
		t.Fatalf("no checkpoint kept the stopped sandbox's state: %v %v", cks, err)
	}
	_, err = exec("true")
	refused("a call into the stopped sandbox", err)
	if got, _ := e.Get(ctx, tenant, sb.ID); got.State != meta.StateStopped {
		t.Errorf("a refused call resumed the sandbox: %s", got.State)
	}

	if err := e.SetTenantQuota(ctx, tenant, meta.TenantQuota{Budgets: map[string]float64{engine.MeterCPUSeconds: 1000}}); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	st, err := e.Exec(ctx, tenant, sb.ID, sandbox.ExecSpec{Args: []string{"cat", "/root/state"}, Stdout: &out})
	if err != nil || st.Code != 0 {
		t.Fatalf("exec after raising the budget: %v %+v", err, st)
	}
	if strings.TrimSpace(out.String()) != "kept" {
		t.Errorf("resumed sandbox lost its file: %q", out.String())
	}
	if got, _ := e.Get(ctx, tenant, sb.ID); got.State != meta.StateRunning {
		t.Errorf("after the call: %s, want running (resumed)", got.State)
	}
}

// TestUsageMonthBoundary: a usage record counts in the month (and day) of
// its last instant, in UTC, whatever zone its times were written in: an
// interval that ends after midnight of the 1st charges the new month's
// budget (charged to the month it began in, it escaped it), one that ends
// exactly at midnight is the old month's, and a leap day is a day.
func TestUsageMonthBoundary(t *testing.T) {
	clk := clock.NewFake(time.Date(2027, 3, 1, 0, 0, 30, 0, time.UTC))
	env := enginetest.New(t, engine.Options{MeterInterval: 24 * time.Hour, Clock: clk})
	e := env.Engine
	ctx := context.Background()
	const tenant = "default"
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skipf("no zoneinfo: %v", err) // Debian's tzdata is on every machine of this kind
	}
	mar1 := time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)
	recs := []engine.UsageRecord{
		// Ends exactly at midnight: February's (its last instant is Feb 28 23:59:59.999…).
		{Sandbox: "sbx-a", Meter: engine.MeterCPUSeconds, Start: mar1.Add(-10 * time.Second), End: mar1, Quantity: 1},
		// Spans midnight: March's.
		{Sandbox: "sbx-a", Meter: engine.MeterCPUSeconds, Start: mar1.Add(-23 * time.Hour), End: mar1.Add(time.Hour), Quantity: 2},
		// Written in a zone with DST (the night New York springs forward), still UTC's March.
		{Sandbox: "sbx-b", Meter: engine.MeterCPUSeconds, Start: time.Date(2027, 3, 14, 1, 59, 0, 0, ny), End: time.Date(2027, 3, 14, 3, 1, 0, 0, ny), Quantity: 4},
		// A leap day, a year later.
		{Sandbox: "sbx-c", Meter: engine.MeterCPUSeconds, Start: time.Date(2028, 2, 29, 10, 0, 0, 0, time.UTC), End: time.Date(2028, 2, 29, 10, 0, 10, 0, time.UTC), Quantity: 8},
	}
	var evs []eventlog.Event
	for _, r := range recs {
		evs = append(evs, engine.UsageEvent(tenant, r))
	}
	if _, err := env.Log.Append(ctx, engine.UsageStream(tenant), 0, eventlog.Any, evs...); err != nil {
		t.Fatal(err)
	}
	mtd, err := e.MonthToDate(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	if got := mtd[engine.MeterCPUSeconds]; got != 6 {
		t.Errorf("March 2027 to date: %v CPU-seconds, want 6 (the interval across midnight and the DST night; not the one that ended at midnight)", got)
	}
	rows, err := e.Usage(ctx, engine.UsageQuery{Tenant: tenant, GroupBy: "day"})
	if err != nil {
		t.Fatal(err)
	}
	days := map[string]float64{}
	for _, r := range rows {
		days[r.Day] += r.Quantity
	}
	want := map[string]float64{"2027-02-28": 1, "2027-03-01": 2, "2027-03-14": 4, "2028-02-29": 8}
	for d, q := range want {
		if days[d] != q {
			t.Errorf("day %s: %v, want %v (all days: %v)", d, days[d], q, days)
		}
	}
	feb, err := e.UsageRecords(ctx, tenant, time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC), mar1)
	if err != nil {
		t.Fatal(err)
	}
	if len(feb) != 1 || feb[0].Quantity != 1 {
		t.Errorf("February's records: %+v, want only the one that ended at midnight", feb)
	}
	// A month later the leap day is the month's.
	clk.Advance(time.Date(2028, 2, 29, 12, 0, 0, 0, time.UTC).Sub(clk.Now()))
	if mtd, err = e.MonthToDate(ctx, tenant); err != nil || mtd[engine.MeterCPUSeconds] != 8 {
		t.Errorf("February 2028 to date: %v %v, want 8", mtd, err)
	}
}
