package server_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/amber-run/amber/internal/edge/e2b/envd"
	"github.com/amber-run/amber/internal/edge/server"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

// TestEnvdMounted: the daemon's server hands E2B's envd the requests for
// 49983-<id>.<port domain> and those naming a sandbox in E2b-Sandbox-Id
// outside /v1/, and nothing else: the API and other ports' origins stay
// as they were.
func TestEnvdMounted(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx := ctxT(t)
	if err := env.Meta.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(testKey), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	sb, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	h := envd.Handler(envd.Options{Engine: env.Engine, Auth: envd.KeyAuthorizer(env.Meta, nil)})
	ts := httptest.NewServer(server.New(server.Options{Engine: env.Engine, Meta: env.Meta, Logger: enginetest.Logger(t), Envd: h}))
	t.Cleanup(ts.Close)
	get := func(host, path string, hdr map[string]string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", ts.URL+path, nil)
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	tok := map[string]string{"X-Access-Token": testKey}
	if got := get("49983-"+sb.ID+"."+server.DefaultPortDomain, "/health", tok); got != 204 {
		t.Errorf("health on envd's origin: %d", got)
	}
	if got := get("127.0.0.1", "/health", map[string]string{"X-Access-Token": testKey, "E2b-Sandbox-Id": sb.ID}); got != 204 {
		t.Errorf("health by E2b-Sandbox-Id: %d", got)
	}
	if got := get("127.0.0.1", "/health", map[string]string{"E2b-Sandbox-Id": sb.ID}); got != 401 {
		t.Errorf("health without a token: %d", got)
	}
	// Another port's origin is the port proxy's (not exposed: 404), the
	// API is the API even with the header.
	if got := get("3000-"+sb.ID+"."+server.DefaultPortDomain, "/health", tok); got != 404 {
		t.Errorf("port 3000's origin: %d", got)
	}
	if got := get("127.0.0.1", "/v1/sandboxes", map[string]string{"Authorization": "Bearer " + testKey, "E2b-Sandbox-Id": sb.ID}); got != 200 {
		t.Errorf("the API with an E2b-Sandbox-Id header: %d", got)
	}
}
