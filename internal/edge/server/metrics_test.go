package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/edge/server"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/obs/metrics"
	"github.com/amber-run/amber/internal/state/meta"
)

// TestMetricsAndReady: /readyz answers 200 with a working engine; /metrics
// (the operator's key only) counts the sandboxes by state, the checkpoints
// and the API requests that just happened.
func TestMetricsAndReady(t *testing.T) {
	ctx := context.Background()
	mx := metrics.New(nil)
	env := enginetest.New(t, engine.Options{Observer: mx})
	mx.Sandboxes(env.Meta)
	if err := env.Meta.PutKey(ctx, meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(testKey), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(server.New(server.Options{Engine: env.Engine, Meta: env.Meta, Logger: enginetest.Logger(t), Metrics: mx}))
	t.Cleanup(ts.Close)
	get := func(path, key string) (int, string) {
		req, _ := http.NewRequest("GET", ts.URL+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/readyz", ""); code != 200 {
		t.Fatalf("readyz: %d %s", code, body)
	}
	c, _ := client.New(ts.URL, testKey)
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Checkpoint(ctx, sb.ID, api.CreateCheckpointRequest{}, nil); err != nil {
		t.Fatal(err)
	}
	wants := []string{
		`amber_sandboxes{state="running"} 1`,
		`amber_http_requests_total{code="201",route="POST /v1/sandboxes"} 1`,
		`amber_http_requests_total{code="200",route="POST /v1/sandboxes/{id}/checkpoints"} 1`,
		`amber_http_request_seconds_count{route="POST /v1/sandboxes"} 1`,
		`amber_checkpoints_total{driver="gvisor",outcome="ok"} 1`,
		`amber_checkpoint_frozen_seconds_count{driver="gvisor"} 1`,
		`amber_checkpoint_stored_bytes_total{tenant="default"}`,
	}
	// A request is counted once its handler returned, which may be just
	// after the client read the answer: poll briefly.
	var missing []string
	for deadline := time.Now().Add(10 * time.Second); ; {
		code, body := get("/metrics", testKey)
		if code != 200 {
			t.Fatalf("metrics: %d %s", code, body)
		}
		missing = missing[:0]
		for _, w := range wants {
			if !strings.Contains(body, w) {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, w := range missing {
		t.Errorf("metrics lack %s", w)
	}
	// A tenant's own admin key does not see every tenant's figures.
	if _, err := env.Meta.CreateTenant(ctx, meta.Tenant{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	if err := env.Meta.PutKey(ctx, meta.APIKey{Tenant: "acme", Name: "admin", Hash: meta.HashKey("amber_acme_admin_key_for_tests"), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	if code, _ := get("/metrics", "amber_acme_admin_key_for_tests"); code != 403 {
		t.Errorf("metrics with a tenant's admin key: %d, want 403", code)
	}
}

// TestQuotaRejectionsCounted: every call a tenant quota refuses (429) is
// counted in amber_quota_rejections_total by tenant and quota, whether the
// engine refused it (max_sandboxes) or the middleware (requests_per_second).
func TestQuotaRejectionsCounted(t *testing.T) {
	ctx := ctxT(t)
	mx := metrics.New(nil)
	env := enginetest.New(t, engine.Options{Observer: mx})
	if err := env.Meta.PutKey(ctx, meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(testKey), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(server.New(server.Options{Engine: env.Engine, Meta: env.Meta, Logger: enginetest.Logger(t), Metrics: mx}))
	t.Cleanup(ts.Close)
	op, _ := client.New(ts.URL, testKey)

	// The operator's tenant may hold one sandbox: the second create is refused.
	if _, err := op.SetTenantQuota(ctx, "default", api.TenantQuota{MaxSandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := op.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal", Cold: true}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := op.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal", Cold: true}); !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Fatalf("create over max_sandboxes: %v", err)
		}
	}

	// Tenant acme may make one call every two seconds: of a quick burst,
	// all but the first are refused.
	if _, err := op.CreateTenant(ctx, api.CreateTenantRequest{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	k, err := op.CreateKey(ctx, "acme", api.CreateKeyRequest{Name: "agent", Scopes: []string{"read"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.SetTenantQuota(ctx, "acme", api.TenantQuota{RequestsPerSecond: 0.5}); err != nil {
		t.Fatal(err)
	}
	acme, _ := client.New(ts.URL, k.Key)
	refused := 0
	for range 5 {
		if _, err := acme.ListSandboxes(ctx); errors.Is(err, errdefs.ErrResourceExhausted) {
			refused++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if refused < 3 {
		t.Fatalf("%d of 5 quick calls at 0.5/s refused", refused)
	}

	req, _ := http.NewRequest("GET", ts.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`amber_quota_rejections_total{quota="max_sandboxes",tenant="default"} 2`,
		fmt.Sprintf(`amber_quota_rejections_total{quota="requests_per_second",tenant="acme"} %d`, refused),
	} {
		if !strings.Contains(string(b), want+"\n") {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(string(b), "amber_quota"))
		}
	}
	if strings.Contains(string(b), `amber_quota_rejections_total{quota="requests_per_second",tenant="default"}`) {
		t.Errorf("the operator's calls were counted as refused:\n%s", grepLines(string(b), "amber_quota"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
