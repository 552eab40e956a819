package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

// Egress policy precedence: the operator's ceiling caps what a tenant
// admin may set, the tenant's policy caps what a write key may set at
// create or later; a widening attempt is refused naming the ceiling, and
// the policy in force is the intersection (also when a ceiling narrows
// after a policy was set).
func TestEgressCeiling(t *testing.T) {
	ceiling := &meta.EgressPolicy{Allow: []string{"*.example.com:443", "pypi.org:443"}, RequestsPerSecond: 50}
	env := enginetest.New(t, engine.Options{Egress: engine.EgressOptions{Ceiling: ceiling}})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const tenant = "default"
	refused := func(err error, whose string) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), whose) {
			t.Fatalf("got %v, want a permission-denied naming %s", err, whose)
		}
	}

	// The tenant admin cannot widen the operator's ceiling.
	for _, p := range []meta.EgressPolicy{
		{Allow: []string{"*:*"}, RequestsPerSecond: 10},
		{Allow: []string{"*.example.com:*"}, RequestsPerSecond: 10},
		{Allow: []string{"evil.test:443"}, RequestsPerSecond: 10},
		{Allow: []string{"api.example.com:443"}}, // rate 0: unlimited, above 50/s
		{Allow: []string{"api.example.com:443"}, RequestsPerSecond: 51},
	} {
		refused(e.SetTenantPolicy(ctx, tenant, meta.TenantPolicy{Egress: &p}), "the operator's egress ceiling")
	}
	tp := meta.EgressPolicy{Allow: []string{"*.api.example.com:443", "pypi.org:443"}, RequestsPerSecond: 20}
	if err := e.SetTenantPolicy(ctx, tenant, meta.TenantPolicy{Egress: &tp}); err != nil {
		t.Fatal(err)
	}

	// A write key cannot widen the tenant's, at create or later.
	for _, p := range []meta.EgressPolicy{
		{Allow: []string{"*.example.com:443"}, RequestsPerSecond: 5}, // inside the operator's, not the tenant's
		{Allow: []string{"www.example.com:443"}, RequestsPerSecond: 5},
		{Allow: []string{"pypi.org:443"}, RequestsPerSecond: 21},
	} {
		_, err := e.Create(ctx, engine.CreateRequest{Tenant: tenant, Template: "minimal", Cold: true, Egress: &p})
		refused(err, "tenant default's egress ceiling")
	}
	own := meta.EgressPolicy{Allow: []string{"v1.api.example.com:443"}, RequestsPerSecond: 5}
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: tenant, Template: "minimal", Cold: true, Egress: &own})
	if err != nil {
		t.Fatal(err)
	}
	refused(e.SetEgress(ctx, tenant, sb.ID, &meta.EgressPolicy{Allow: []string{"*:*"}}), "egress ceiling")
	_, eff, _, err := e.Egress(ctx, tenant, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(eff.Allow, eff.RequestsPerSecond); got != "[v1.api.example.com:443] 5" {
		t.Fatalf("effective policy %s, want [v1.api.example.com:443] 5", got)
	}

	// A ceiling narrowed afterwards narrows what is in force: the tenant's
	// policy cut to a narrower operator ceiling (as after a restart with
	// another --egress-ceiling).
	env.SetOptions(func(o *engine.Options) {
		o.Egress.Ceiling = &meta.EgressPolicy{Allow: []string{"pypi.org:443", "*.example.com:8443"}, RequestsPerSecond: 10}
	})
	env.Restart(t)
	e = env.Engine
	sb2, err := e.Create(ctx, engine.CreateRequest{Tenant: tenant, Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	_, eff, _, err = e.Egress(ctx, tenant, sb2.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(eff.Allow, eff.RequestsPerSecond); got != "[pypi.org:443] 10" {
		t.Fatalf("effective policy under a narrower ceiling %s, want [pypi.org:443] 10", got)
	}
	for _, id := range []string{sb.ID, sb2.ID} {
		e.Destroy(ctx, tenant, id)
	}
}

// TestTenantEgressAllows: the allowlist a tenant's own model endpoint
// meets is what a sandbox of the tenant without a policy of its own gets:
// the daemon's default until the tenant sets one, cut to the operator's
// ceiling.
func TestTenantEgressAllows(t *testing.T) {
	ceiling := &meta.EgressPolicy{Allow: []string{"*.example.com:443", "api.anthropic.com:443"}}
	env := enginetest.New(t, engine.Options{Egress: engine.EgressOptions{Ceiling: ceiling, Default: meta.EgressPolicy{Allow: []string{"api.anthropic.com:443"}}}})
	e := env.Engine
	ctx := context.Background()
	check := func(tenant, host string, port uint16, want bool) {
		t.Helper()
		got, err := e.TenantEgressAllows(ctx, tenant, host, port)
		if err != nil || got != want {
			t.Errorf("%s → %s:%d: %v %v, want %v", tenant, host, port, got, err, want)
		}
	}
	check("default", "api.anthropic.com", 443, true) // the daemon's default
	check("default", "llm.example.com", 443, false)
	tp := meta.EgressPolicy{Allow: []string{"llm.example.com:443"}}
	if err := e.SetTenantPolicy(ctx, "default", meta.TenantPolicy{Egress: &tp}); err != nil {
		t.Fatal(err)
	}
	check("default", "llm.example.com", 443, true) // the tenant's own, within the ceiling
	check("default", "api.anthropic.com", 443, false)
	check("default", "127.0.0.1", 80, false)
}
