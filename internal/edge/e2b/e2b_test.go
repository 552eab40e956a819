package e2b_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/edge/e2b"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

func TestMain(m *testing.M) { enginetest.Main(m) }

const key = "amber_e2b-control-plane-test-key"

// TestControlPlaneAnswers: the E2B calls with their E2B answers on a real
// engine — a key as itself or its e2b_ alias, 401 without, a read key
// cannot create (403); create (201, metadata, envs, timeout), get, list
// by metadata and state; pause (204, then 409), connect resumes (201, then
// 200); timeout; kill (204, then 404); bad input is 400 with E2B's
// {code, message}.
func TestControlPlaneAnswers(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx := context.Background()
	if err := env.Meta.PutKey(ctx, meta.APIKey{Tenant: "default", Name: "w", Hash: meta.HashKey(key), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	if err := env.Meta.PutKey(ctx, meta.APIKey{Tenant: "default", Name: "r", Hash: meta.HashKey(key + "-read"), Scopes: []meta.Scope{meta.ScopeRead}}); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(e2b.Handler(e2b.Options{Engine: env.Engine, Keys: env.Meta, Domain: "ports.localhost", Logger: enginetest.Logger(t)}))
	defer ts.Close()
	call := func(k, method, path, body string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		if k != "" {
			req.Header.Set("X-API-KEY", k)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	alias := e2b.Alias(key)
	if !strings.HasPrefix(alias, "e2b_") || strings.Trim(alias[4:], "0123456789abcdef") != "" {
		t.Fatalf("alias %q is not e2b_<hex>", alias)
	}
	if code, body, _ := call("", "GET", "/v2/sandboxes", ""); code != 401 || !strings.Contains(body, `"code":401`) {
		t.Fatalf("no key: %d %s", code, body)
	}
	if code, _, _ := call("e2b_00ff", "GET", "/v2/sandboxes", ""); code != 401 {
		t.Fatalf("an alias of no key: %d", code)
	}
	if code, _, _ := call(key+"-read", "POST", "/v2/sandboxes", `{"templateID":"minimal"}`); code != 403 {
		t.Fatalf("create with a read key: %d", code)
	}

	code, body, _ := call(alias, "POST", "/v2/sandboxes", `{"templateID":"minimal","metadata":{"k":"v"},"envVars":{"A":"1"},"timeout":600,"secure":true}`)
	var sb struct{ SandboxID, EnvdAccessToken, EnvdVersion, Domain string }
	if code != 201 || json.Unmarshal([]byte(body), &sb) != nil || sb.EnvdAccessToken != key || sb.Domain != "ports.localhost" || sb.EnvdVersion == "" {
		t.Fatalf("create: %d %s", code, body)
	}
	row, err := env.Meta.Get(ctx, sb.SandboxID)
	if err != nil || row.Metadata["k"] != "v" || row.Env[0] != "A=1" || time.Until(row.Expires) < 9*time.Minute {
		t.Fatalf("the created row: %+v %v", row, err)
	}
	code, body, _ = call(key, "GET", "/sandboxes/"+sb.SandboxID, "")
	if code != 200 || !strings.Contains(body, `"state":"running"`) || !strings.Contains(body, `"metadata":{"k":"v"}`) {
		t.Fatalf("get: %d %s", code, body)
	}
	for _, c := range []struct{ q, want string }{
		{"?metadata=k%3Dv", sb.SandboxID},
		{"?metadata=k%3Dw", ""},
		{"?state=paused", ""},
		{"?state=running,paused&metadata=k%3Dv", sb.SandboxID},
	} {
		code, body, _ := call(key, "GET", "/v2/sandboxes"+c.q, "")
		if code != 200 || strings.Contains(body, sb.SandboxID) != (c.want != "") {
			t.Errorf("list %s: %d %s", c.q, code, body)
		}
	}
	if code, _, _ := call(key, "POST", "/sandboxes/"+sb.SandboxID+"/pause", `{}`); code != 204 {
		t.Fatalf("pause: %d", code)
	}
	if code, _, _ := call(key, "POST", "/sandboxes/"+sb.SandboxID+"/pause", `{}`); code != 409 {
		t.Fatalf("pause of a paused sandbox: %d", code)
	}
	if code, body, _ := call(key, "GET", "/v2/sandboxes?state=paused", ""); code != 200 || !strings.Contains(body, sb.SandboxID) {
		t.Fatalf("list paused: %d %s", code, body)
	}
	if code, _, _ := call(key, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":60}`); code != 201 {
		t.Fatalf("connect to a paused sandbox: %d", code)
	}
	if code, _, _ := call(key, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":60}`); code != 200 {
		t.Fatalf("connect to a running sandbox: %d", code)
	}
	if row, _ = env.Meta.Get(ctx, sb.SandboxID); row.State != meta.StateRunning || time.Until(row.Expires) > 61*time.Second {
		t.Fatalf("after connect: %s, deadline in %v", row.State, time.Until(row.Expires))
	}
	if code, _, _ := call(key, "POST", "/sandboxes/"+sb.SandboxID+"/timeout", `{"timeout":120}`); code != 204 {
		t.Fatalf("timeout: %d", code)
	}
	for _, bad := range []struct{ method, path, body string }{
		{"POST", "/v2/sandboxes", `{"templateID":"minimal","timeout":-1}`},
		{"POST", "/v2/sandboxes", `{"templateID":"minimal","metadata":{"a=b":"x"}}`},
		{"POST", "/v2/sandboxes", `{"templateID":"minimal","metadata":{"amber/public-ports":"false"}}`},
		{"POST", "/v2/sandboxes", `{"templateID":`},
		{"POST", "/sandboxes/" + sb.SandboxID + "/timeout", `{"timeout":"soon"}`},
		{"POST", "/sandboxes/" + sb.SandboxID + "/timeout", `{}`},
		{"GET", "/v2/sandboxes?state=asleep", ``},
		{"GET", "/v2/sandboxes?limit=0", ``},
	} {
		if code, body, _ := call(key, bad.method, bad.path, bad.body); code != 400 || !strings.Contains(body, `"code":400`) {
			t.Errorf("%s %s %s: %d %s, want 400", bad.method, bad.path, bad.body, code, body)
		}
	}
	if code, _, _ := call(key, "POST", "/v2/sandboxes", `{"templateID":"no-such-template"}`); code != 404 {
		t.Errorf("create from an unknown template: %d", code)
	}
	if code, _, _ := call(key, "DELETE", "/sandboxes/"+sb.SandboxID, ""); code != 204 {
		t.Fatalf("kill: %d", code)
	}
	for _, p := range []string{"/sandboxes/" + sb.SandboxID, "/sandboxes/sbx-nosuchsandbox", "/sandboxes/Not..An..Id"} {
		if code, _, _ := call(key, "GET", p, ""); code != 404 {
			t.Errorf("GET %s: %d, want 404", p, code)
		}
	}
	if code, _, _ := call(key, "DELETE", "/sandboxes/"+sb.SandboxID, ""); code != 404 {
		t.Errorf("a second kill: %d, want 404", code)
	}
}
