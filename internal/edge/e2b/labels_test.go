package e2b_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/amber-run/amber/internal/edge/e2b"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

// TestE2BRefusesReservedLabels: an E2B create whose metadata hold a key of
// Amber's own labels (amber.session: a session's Wake takes a running
// sandbox so labeled as one it made), in any case or with invisible
// characters, is a 400 naming the key, and nothing is made; a list by
// such a key still selects (reading is open).
func TestE2BRefusesReservedLabels(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	ctx := context.Background()
	if err := env.Meta.PutKey(ctx, meta.APIKey{Tenant: "default", Name: "w", Hash: meta.HashKey(key), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(e2b.Handler(e2b.Options{Engine: env.Engine, Keys: env.Meta, Domain: "ports.localhost", Logger: enginetest.Logger(t)}))
	defer ts.Close()
	call := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		req.Header.Set("X-API-KEY", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, k := range []string{`amber.session`, `amber.session.sandbox`, `AMBER.SESSION`, ` amber.session`, `\ufeffamber.session`} {
		code, body := call("POST", "/v2/sandboxes", `{"templateID":"minimal","metadata":{"`+k+`":"ses-1"}}`)
		if code != 400 || !strings.Contains(body, `"code":400`) || !strings.Contains(body, "reserved") || !strings.Contains(strings.ToLower(body), "amber.session") {
			t.Errorf("create with metadata key %s: %d %s, want 400 naming it as reserved", k, code, body)
		}
	}
	if rows, err := env.Engine.List(ctx, "default"); err != nil || len(rows) != 0 {
		t.Fatalf("refused creates made %d sandboxes (%v)", len(rows), err)
	}
	own, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal",
		Metadata: map[string]string{"amber.session": "ses-1"}, ReservedLabels: true})
	if err != nil {
		t.Fatal(err)
	}
	if code, body := call("GET", "/v2/sandboxes?metadata=amber.session%3Dses-1", ""); code != 200 || !strings.Contains(body, own.ID) {
		t.Fatalf("list by amber.session: %d %s", code, body)
	}
}
