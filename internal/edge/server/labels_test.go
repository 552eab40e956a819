package server_test

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/internal/engine"
)

// TestAPIRefusesReservedLabels: POST /v1/sandboxes with a metadata key
// of Amber's own labels (amber.session: a session's Wake takes a running
// sandbox so labeled as one it made), in any case or with invisible
// characters, is a 400 naming the key, and nothing is made. A tenant may
// still select its sandboxes by those keys: GET ?metadata=amber.session=…
// finds the one the session harness labeled.
func TestAPIRefusesReservedLabels(t *testing.T) {
	c, env, base := newAPI(t)
	ctx := ctxT(t)
	_, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal", Metadata: map[string]string{"amber.session": "ses-1", "amber.session.sandbox": "1"}})
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !strings.Contains(ae.Message, `"amber.session`) || !strings.Contains(ae.Message, "reserved") {
		t.Fatalf("create with amber.session: %v, want 400 naming the key as reserved", err)
	}
	for _, key := range []string{`AMBER.Session`, ` amber.session`, `amber.session `, `\u200bamber.session`, `\uff41mber.session`, `amber.anything`} {
		body := `{"template":"minimal","metadata":{"team":"red","` + key + `":"ses-1"}}`
		code, out := rawCall(t, ctx, "POST", base+"/v1/sandboxes", "Bearer", "application/json", strings.NewReader(body))
		if code != http.StatusBadRequest || !strings.Contains(out, "reserved") {
			t.Errorf("create with metadata key %s: %d %s, want 400 reserved", key, code, out)
		}
	}
	if l, err := c.ListSandboxes(ctx); err != nil || len(l) != 0 {
		t.Fatalf("refused creates made %d sandboxes (%v)", len(l), err)
	}

	own, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal",
		Metadata: map[string]string{"amber.session": "ses-1", "amber.session.sandbox": "1"}, ReservedLabels: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.FindSandboxes(ctx, client.ListFilter{Metadata: map[string]string{"amber.session": "ses-1"}})
	if err != nil || len(got) != 1 || got[0].ID != own.ID || got[0].Metadata["amber.session.sandbox"] != "1" {
		t.Fatalf("list by amber.session: %+v %v", got, err)
	}
}

// TestMCPRefusesReservedLabels: MCP's sandbox_create with a metadata key
// of Amber's own labels, or one that reads as one, is a tool error naming
// the key, and nothing is made.
func TestMCPRefusesReservedLabels(t *testing.T) {
	_, env, url := newAPI(t)
	s := mcpSession(t, url, testKey)
	for _, key := range []string{"amber.session", "Amber.Session.Sandbox", "\u200bamber.session"} {
		var sb struct{ Sandbox string }
		msg := call(t, s, "sandbox_create", map[string]any{"template": "minimal", "metadata": map[string]string{key: "ses-1"}}, &sb)
		if !strings.Contains(msg, "reserved") || !strings.Contains(msg, strings.Trim(strconv.Quote(key), `"`)) {
			t.Errorf("sandbox_create with metadata key %q: %q (sandbox %q), want an error naming it as reserved", key, msg, sb.Sandbox)
		}
	}
	if l, err := env.Engine.List(ctxT(t), "default"); err != nil || len(l) != 0 {
		t.Fatalf("refused creates made %d sandboxes (%v)", len(l), err)
	}
}
