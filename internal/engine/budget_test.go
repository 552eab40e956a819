package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/enginetest"
	"github.com/amber-run/amber/internal/meta"
)

// TestUsageBudget: a monthly budget on a meter is enforced from the usage
// records. Under the budget everything works; once the recorded CPU passes
// it, exec and create are refused with 429 naming the budget, the tenant's
// running sandbox is checkpointed and stopped (its state kept), a call
// into it is refused rather than resuming it; raising the budget lets the
// next call resume it from that checkpoint with its files.
func TestUsageBudget(t *testing.T) {
	env := enginetest.New(t, engine.Options{MeterInterval: 24 * time.Hour}) // intervals closed by hand
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
	end := time.Now()
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
