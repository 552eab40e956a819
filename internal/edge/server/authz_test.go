package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/amber-run/amber/internal/state/secretstore"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/edge/server"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/session"
	"github.com/amber-run/amber/internal/state/meta"
)

// modelProviders are the operator's model providers of the table: one
// granted to tenant acme only.
var modelProviders = map[string]session.Provider{"acme-llm": {Name: "acme-llm", URL: "http://127.0.0.1:9/", Adapter: "anthropic",
	Key: "operator-key-for-acme", Tenants: []string{"acme"}}}

// routeRequest is what a call to one route sends besides its path: the
// query and body a well-formed call has, so that a refusal can only come
// from authentication or authorization, never from a malformed request.
type routeRequest struct {
	query string
	ctype string
	body  string
}

// requests holds the query and body of the routes that need one. A route
// missing here is called with neither; if it validates its input before it
// authorizes, the table below fails for it and the route belongs here.
var requests = map[string]routeRequest{
	"POST /v1/sandboxes":                             {ctype: "application/json", body: `{"template":"minimal"}`},
	"POST /v1/sandboxes/{id}/exec":                   {ctype: "application/json", body: `{"args":["true"]}`},
	"POST /v1/sandboxes/{id}/processes":              {ctype: "application/json", body: `{"args":["true"]}`},
	"POST /v1/sandboxes/{id}/processes/{pid}/signal": {ctype: "application/json", body: `{"signal":"CONT"}`},
	"GET /v1/sandboxes/{id}/files":                   {query: "path=/etc"},
	"PUT /v1/sandboxes/{id}/files":                   {query: "path=/tmp/authz.txt", ctype: "application/octet-stream", body: "x"},
	"DELETE /v1/sandboxes/{id}/files":                {query: "path=/tmp/authz.txt"},
	"POST /v1/sandboxes/{id}/files/mkdir":            {query: "path=/tmp/authz-dir"},
	"POST /v1/sandboxes/{id}/files/rename":           {ctype: "application/json", body: `{"from":"/tmp","to":"/tmp"}`},
	"GET /v1/sandboxes/{id}/files/tar":               {query: "path=/tmp"},
	"GET /v1/sandboxes/{id}/files/watch":             {query: "path=/tmp"},
	"PUT /v1/sandboxes/{id}/files/tar":               {query: "path=/tmp", ctype: "application/x-tar", body: string(make([]byte, 1024))},
	"POST /v1/sandboxes/{id}/ports":                  {ctype: "application/json", body: `{"port":8080}`},
	"POST /v1/sandboxes/{id}/checkpoints":            {ctype: "application/json", body: `{}`},
	"POST /v1/sandboxes/{id}/recover":                {ctype: "application/json", body: `{}`},
	"POST /v1/checkpoints/{id}/restore":              {ctype: "application/json", body: `{}`},
	"POST /v1/tenants":                               {ctype: "application/json", body: `{"id":"initech"}`},
	"POST /v1/tenants/{tenant}/keys":                 {ctype: "application/json", body: `{"name":"new","scopes":["read"]}`},
	"GET /v1/sandboxes/{id}/events":                  {query: "from=1"},
	"GET /v1/sandboxes/{id}/checkpoints":             {query: "all=true"},
	"DELETE /v1/tenants/{tenant}/keys/{name}":        {},
	"POST /v1/sandboxes/{id}/processes/{pid}/wait":   {},
	"GET /v1/sandboxes/{id}/processes/{pid}/output":  {query: "offset=0"},
	"DELETE /v1/sandboxes/{id}/ports/{port}":         {},
	"GET /v1/sandboxes/{id}/ports":                   {},
	"GET /v1/checkpoints/{id}":                       {},
	"DELETE /v1/checkpoints/{id}":                    {},
	"POST /v1/sessions":                              {ctype: "application/json", body: `{"model":{"adapter":"scripted"},"template":"minimal"}`},
	"POST /v1/sessions/{id}/events":                  {ctype: "application/json", body: `{"type":"user_message","payload":{"text":"hi"}}`},
	"GET /v1/sessions/{id}/events":                   {query: "after=0"},
	"POST /v1/sandboxes/{id}/upgrade":                {ctype: "application/json", body: `{"template":"minimal"}`},
	"POST /v1/templates/{name}/import":               {ctype: "application/x-tar", body: string(make([]byte, 1024))},
	"PUT /v1/templates/{name}/tag":                   {ctype: "application/json", body: `{"version":"minimal"}`},
}

// answer is one HTTP exchange of the table.
type answer struct {
	status  int
	kind    string
	body    string
	blocked bool // no answer within the timeout: the handler was running
}

func send(t *testing.T, base, token string, rt server.Route, path string, timeout time.Duration) answer {
	t.Helper()
	rq := requests[rt.Method+" "+rt.Path]
	u := base + path
	if rq.query != "" {
		u += "?" + rq.query
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, rt.Method, u, strings.NewReader(rq.body))
	if err != nil {
		t.Fatal(err)
	}
	if rq.ctype != "" {
		req.Header.Set("Content-Type", rq.ctype)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if errors.Is(err, context.DeadlineExceeded) {
		return answer{blocked: true}
	}
	if err != nil {
		t.Fatalf("%s %s: %v", rt.Method, u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var e api.Error
	if resp.StatusCode >= 400 {
		_ = json.Unmarshal(b, &e)
	}
	return answer{status: resp.StatusCode, kind: e.Error.Kind, body: string(b)}
}

// TestAuthorizationTable walks every route of the API (the list comes from
// routes(), so a new route is in the table without anyone adding it) with
// no key, a revoked key, an expired key, a read-only key, and a key of
// another tenant, against a real sandbox and a real checkpoint of tenant
// acme made through a real engine.
func TestAuthorizationTable(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx := ctxT(t)
	fc := clock.NewFake(time.Now())
	const opKey = testKey
	if err := env.Meta.PutKey(ctx, meta.APIKey{Tenant: meta.DefaultTenant, Name: meta.OperatorKeyName, Hash: meta.HashKey(opKey), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	secrets, err := secretstore.New(env.Meta, bytes.Repeat([]byte{1}, 32))
	if err != nil {
		t.Fatal(err)
	}

	reg := eventlog.NewRegistry()
	sessions := session.NewManager(&session.Harness{Log: env.Log, Registry: reg, Meta: env.Meta,
		Boxes: session.EngineSandboxes{E: env.Engine}, Logger: enginetest.Logger(t), Providers: modelProviders})
	t.Cleanup(sessions.Close)
	srv := server.New(server.Options{Engine: env.Engine, Meta: env.Meta, Clock: fc, Logger: enginetest.Logger(t), Version: "test", Sessions: sessions, Secrets: secrets})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	op, _ := client.New(ts.URL, opKey)

	// Two tenants and their keys, made by the operator over the API.
	for _, id := range []string{"acme", "globex"} {
		if _, err := op.CreateTenant(ctx, api.CreateTenantRequest{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	mk := func(tenant, name string, expires *time.Time, scopes ...string) string {
		k, err := op.CreateKey(ctx, tenant, api.CreateKeyRequest{Name: name, Scopes: scopes, ExpiresAt: expires})
		if err != nil {
			t.Fatalf("create key %s/%s: %v", tenant, name, err)
		}
		return k.Key
	}
	soon := fc.Now().Add(time.Hour)
	keyA := mk("acme", "owner", nil, "read", "write", "admin")
	readA := mk("acme", "reader", nil, "read")
	revokedA := mk("acme", "revoked", nil, "read", "write", "admin")
	expiredA := mk("acme", "expiring", &soon, "read", "write", "admin")
	keyB := mk("globex", "owner", nil, "read", "write", "admin")
	if err := op.RevokeKey(ctx, "acme", "revoked"); err != nil {
		t.Fatal(err)
	}
	fc.Advance(2 * time.Hour)

	// acme's resources, once for the whole table.
	a, _ := client.New(ts.URL, keyA)
	sb, err := a.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	pid, err := a.StartProcess(ctx, sb.ID, api.StartProcessRequest{Args: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.ExposePort(ctx, sb.ID, 8080); err != nil && !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Fatal(err)
	}
	if err := secrets.Put(ctx, "acme", "reader", []byte("acme-secret-value-1"), []string{"api.example.com:443"}); err != nil {
		t.Fatal(err)
	}
	ck, err := a.Checkpoint(ctx, sb.ID, api.CreateCheckpointRequest{Tag: "authz"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	se, err := a.CreateSession(ctx, map[string]any{"model": map[string]any{"adapter": "scripted"}, "template": "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	fill := func(rt server.Route) string {
		id := sb.ID
		if strings.HasPrefix(rt.Path, "/v1/checkpoints/") {
			id = ck.ID
		}
		if strings.HasPrefix(rt.Path, "/v1/sessions/") {
			id = se.ID
		}
		return strings.NewReplacer("{id}", url.PathEscape(id), "{pid}", fmt.Sprint(pid), "{port}", "8080",
			"{tenant}", "acme", "{name}", "reader", "{ref}", "minimal").Replace(rt.Path)
	}
	// What tenant globex must never see in an answer.
	unseen := []string{sb.ID, ck.ID, se.ID, `"acme"`, "acme-secret-value-1"}

	routes := srv.Routes()
	if len(routes) < 30 {
		t.Fatalf("only %d routes", len(routes))
	}
	for _, rt := range routes {
		name := rt.Method + " " + rt.Path
		path := fill(rt)
		if strings.Contains(path, "{") {
			t.Errorf("%s: path parameter without a value in the table (%s); add it to fill", name, path)
			continue
		}
		switch rt.Scope {
		case server.Public:
			if got := send(t, ts.URL, "", rt, path, 10*time.Second); got.status != 200 {
				t.Errorf("%s (public) without a key = %d", name, got.status)
			}
			continue
		case meta.ScopeRead, meta.ScopeWrite, meta.ScopeAdmin:
		default:
			t.Errorf("%s declares no scope (%q)", name, rt.Scope)
			continue
		}

		for _, c := range []struct{ what, token, says string }{
			{"no key", "", "missing Authorization"},
			{"a revoked key", revokedA, "revoked"},
			{"an expired key", expiredA, "expired"},
			{"an unknown key", "amber_not_a_key_of_anyone_000000000000", "not valid"},
		} {
			got := send(t, ts.URL, c.token, rt, path, 10*time.Second)
			if got.status != 401 || got.kind != "unauthenticated" || !strings.Contains(got.body, c.says) {
				t.Errorf("%s with %s = %d %s, want 401 saying %q", name, c.what, got.status, got.body, c.says)
			}
		}

		// The read-only key: 403 naming the scope where it needs more; let
		// through where read is enough (an answer other than 401/403/404,
		// or a handler still running, as a wait for a live process is).
		got := send(t, ts.URL, readA, rt, path, 3*time.Second)
		if rt.Scope != meta.ScopeRead {
			if got.status != 403 || got.kind != "permission denied" || !strings.Contains(got.body, "scope "+string(rt.Scope)) {
				t.Errorf("%s with a read-only key = %d %s, want 403 naming scope %s", name, got.status, got.body, rt.Scope)
			}
		} else if !got.blocked && (got.status == 401 || got.status == 403 || got.status == 404) {
			t.Errorf("%s with acme's read-only key on acme's resources = %d %s", name, got.status, got.body)
		}

		// Tenant globex's key (every scope): acme's resources do not exist.
		// Templates are shared: any tenant reads them (without seeing
		// acme's sandboxes among a version's references); changing them
		// is the operator's alone.
		shared := strings.HasPrefix(rt.Path, "/v1/templates")
		// Nodes are the operator's: another tenant's key is refused (403),
		// whatever the node.
		nodes := strings.HasPrefix(rt.Path, "/v1/nodes")
		resource := strings.Contains(rt.Path, "{") && !shared && !nodes
		switch {
		case nodes || shared && rt.Scope == meta.ScopeAdmin:
			got := send(t, ts.URL, keyB, rt, path, 10*time.Second)
			if got.status != 403 || got.kind != "permission denied" || !strings.Contains(got.body, "operator") {
				t.Errorf("%s with tenant globex's admin key = %d %s, want 403 naming the operator", name, got.status, got.body)
			}
		case resource:
			got := send(t, ts.URL, keyB, rt, path, 10*time.Second)
			if got.status != 404 || got.kind != "not found" {
				t.Errorf("%s with tenant globex's key on acme's %s = %d %s (blocked %v), want 404", name, path, got.status, got.body, got.blocked)
			}
		case rt.Method == "GET":
			got := send(t, ts.URL, keyB, rt, path, 10*time.Second)
			for _, s := range unseen {
				if strings.Contains(got.body, s) {
					t.Errorf("%s with tenant globex's key shows acme's %s: %s", name, s, got.body)
				}
			}
		}
	}

	// Port origins (cross-tenant rows): tenant globex's key opens nothing
	// on acme's port host, and a port host of acme's sandbox answers
	// globex exactly as one of no sandbox at all (no oracle of existence).
	if _, err := a.ExposePort(ctx, sb.ID, 8080); err == nil {
		portAnswer := func(host, token string) (int, string) {
			req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/", nil)
			req.Host = host
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e api.Error
			_ = json.NewDecoder(resp.Body).Decode(&e)
			return resp.StatusCode, e.Error.Kind + ": " + e.Error.Message
		}
		host := "8080-" + sb.ID + "." + server.DefaultPortDomain
		code, msg := portAnswer(host, keyB)
		if code != 404 {
			t.Errorf("acme's port host with tenant globex's key = %d %s, want 404", code, msg)
		}
		for _, other := range []string{"8080-sbx-aaaaaaaaaaaaaaaa." + server.DefaultPortDomain, "8081-" + sb.ID + "." + server.DefaultPortDomain} {
			if c2, m2 := portAnswer(other, keyB); c2 != code || m2 != msg {
				t.Errorf("port host %s = %d %q, acme's = %d %q: the answers tell them apart", other, c2, m2, code, msg)
			}
		}
		if c2, m2 := portAnswer(host, keyA); c2 != 404 || m2 != msg {
			t.Errorf("acme's port host with acme's own API key = %d %q, want the same 404 (the exposure's token opens it, never an API key)", c2, m2)
		}
	}

	// Model providers: an operator's provider granted to acme alone is
	// refused to globex with the answer an unknown one gets (its existence
	// and key never shown); acme uses it.
	{
		create := func(token, provider string) answer {
			body := `{"model":{"provider":"` + provider + `","name":"m"},"template":"minimal"}`
			req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/sessions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var e api.Error
			_ = json.Unmarshal(b, &e)
			return answer{status: resp.StatusCode, kind: e.Error.Kind, body: string(b)}
		}
		got := create(keyB, "acme-llm")
		if got.status != 400 || got.kind != "invalid argument" || strings.Contains(got.body, "operator-key-for-acme") || strings.Contains(got.body, "127.0.0.1") {
			t.Errorf("tenant globex on acme's model provider = %d %s, want 400 showing nothing of it", got.status, got.body)
		}
		if unknown := create(keyB, "acme-llx"); unknown.status != got.status || strings.Replace(unknown.body, "acme-llx", "acme-llm", 1) != got.body {
			t.Errorf("a provider granted to acme and an unknown one answer globex differently: %s / %s", got.body, unknown.body)
		}
		if own := create(keyA, "acme-llm"); own.status != 201 {
			t.Errorf("tenant acme on its model provider = %d %s, want 201", own.status, own.body)
		}
	}

	// Nothing of acme's was touched by the refused calls.
	if got, err := a.GetSandbox(ctx, sb.ID); err != nil || got.State != "running" {
		t.Errorf("acme's sandbox after the table: %+v %v", got, err)
	}
	if got, err := a.GetCheckpoint(ctx, ck.ID); err != nil || got.State != "committed" {
		t.Errorf("acme's checkpoint after the table: %+v %v", got, err)
	}
	keys, err := a.Keys(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.Name == "reader" && k.RevokedAt != nil {
			t.Errorf("tenant globex revoked acme's key reader")
		}
		if k.Name == "new" {
			t.Errorf("a refused call made acme a key: %+v", k)
		}
	}
	if tl, _ := op.Tenants(ctx); len(tl) != 3 {
		t.Errorf("tenants after the table: %+v (a refused call made one?)", tl)
	}
	var buf bytes.Buffer
	if err := a.ReadFile(ctx, sb.ID, "/tmp/authz.txt", &buf); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a refused PUT wrote acme's file: %q %v", buf.String(), err)
	}
}
