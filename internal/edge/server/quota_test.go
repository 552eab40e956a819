package server_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"github.com/amber-run/amber/internal/state/meta"
)

// TestQuotaRequestsPerSecond: the operator sets a tenant's quota (the
// tenant's own admin key may not); over its requests-per-second quota a
// tenant gets 429 naming the quota, and other tenants are not slowed.
func TestQuotaRequestsPerSecond(t *testing.T) {
	_, env, base := newAPI(t)
	ctx := context.Background()
	if _, err := env.Meta.CreateTenant(ctx, meta.Tenant{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	const acmeKey = "amber_acme_key_for_quota_tests_0123"
	if err := env.Meta.PutKey(ctx, meta.APIKey{Tenant: "acme", Name: "admin", Hash: meta.HashKey(acmeKey), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	call := func(method, path, key, body string) int {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, bytes.NewBufferString(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := call("PUT", "/v1/tenants/acme/quota", acmeKey, `{"requests_per_second":100}`); code != 403 {
		t.Errorf("a tenant setting its own quota: %d, want 403", code)
	}
	if code := call("PUT", "/v1/tenants/acme/quota", testKey, `{"requests_per_second":2}`); code != 200 {
		t.Fatalf("operator sets the quota: %d", code)
	}
	limited := 0
	for i := 0; i < 20; i++ {
		if call("GET", "/v1/sandboxes", acmeKey, "") == 429 {
			limited++
		}
	}
	if limited < 10 {
		t.Errorf("%d of 20 rapid requests refused at 2/s (burst 4), want most", limited)
	}
	for i := 0; i < 10; i++ {
		if code := call("GET", "/v1/sandboxes", testKey, ""); code != 200 {
			t.Fatalf("the operator's tenant was slowed by acme's quota: %d", code)
		}
	}
}
