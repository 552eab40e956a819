package session

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/secretstore"
	"github.com/amber-run/amber/stores/sqlmeta"
)

// TestModelProviderOnlyForGrantedTenants: an operator's provider (here on
// 127.0.0.1: the operator's URL is not deny-listed) gets the operator's key
// only for the tenants the operator allowed; another tenant cannot use it
// (refused on create, with the answer an unknown provider gets); the
// SDKs' own environment defaults (ANTHROPIC_*, OPENAI_*) are never applied;
// a tenant's own secret wins over the operator's key only where it is
// bound to the provider's host.
func TestModelProviderOnlyForGrantedTenants(t *testing.T) {
	setMarkers(t)
	t.Setenv("OPENAI_CUSTOM_HEADERS", "X-Leak: "+markerOpenAI)
	t.Setenv("ANTHROPIC_CUSTOM_HEADERS", "X-Leak: "+markerAnthropic)
	t.Setenv("OPENAI_ORG_ID", markerOpenAI)
	ctx := context.Background()
	for _, adapter := range []string{"anthropic", "openai"} {
		t.Run(adapter, func(t *testing.T) {
			l := newTenantListener(t)
			e := newTestEnv(t, nil)
			e.providers = map[string]Provider{"corp": {Name: "corp", URL: l.srv.URL + "/v1/", Adapter: adapter, Key: "operator-key-corp", Tenants: []string{"acme"}}}
			m := NewManager(wakeHarness(e))
			for _, c := range []struct{ tenant, provider string }{{"globex", "corp"}, {"globex", "nope"}, {"acme", "nope"}} {
				_, err := m.Create(ctx, c.tenant, Definition{Model: ModelConfig{Provider: c.provider, Name: "m"}, Template: "minimal"})
				if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "is not a model provider this daemon offers to tenant "+c.tenant) {
					t.Errorf("tenant %s, provider %s: %v, want refused", c.tenant, c.provider, err)
				}
			}
			// The provider's adapter is taken when the definition names none.
			se, err := m.Create(ctx, "acme", Definition{Model: ModelConfig{Provider: "corp", Name: "m"}, Template: "minimal"})
			if err != nil {
				t.Fatal(err)
			}
			e.post(se.ID, EventUserMessage, UserMessage{Text: "hi"})
			_, _ = wakeHarness(e).Wake(ctx, se.ID) // the listener answers 401
			got := l.requests()
			if len(got) == 0 || !strings.Contains(got[0], "Bearer operator-key-corp") {
				t.Fatalf("the operator's provider got %q, want the operator's key", got)
			}
			for _, r := range got {
				for _, mk := range []string{markerPG, markerAnthropic, markerOpenAI} {
					if strings.Contains(r, mk) {
						t.Errorf("the provider received the environment's %s: %.300s", mk, r)
					}
				}
			}
			other := map[string]string{"anthropic": "openai", "openai": "anthropic"}[adapter]
			if _, err := m.Create(ctx, "acme", Definition{Model: ModelConfig{Adapter: other, Provider: "corp"}}); !errdefs.IsInvalidArgument(err) {
				t.Errorf("a %s definition on a %s provider: %v", other, adapter, err)
			}
		})
	}

	// A tenant's own key, as a secret: used for the provider only where
	// bound to its host; unbound, the session is refused before any dial.
	l := newTenantListener(t)
	e := newTestEnv(t, nil)
	e.providers = map[string]Provider{"corp": {Name: "corp", URL: l.srv.URL, Adapter: "anthropic", Key: "operator-key-corp", Tenants: []string{"*"}}}
	mdb, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mdb.Close()
	st, err := secretstore.New(mdb, bytes.Repeat([]byte{5}, 32))
	if err != nil {
		t.Fatal(err)
	}
	_ = st.Put(ctx, "acme", "mine", []byte("acme-own-key"), []string{strings.TrimPrefix(l.srv.URL, "http://")})
	_ = st.Put(ctx, "acme", "elsewhere", []byte("acme-other-key"), []string{"api.anthropic.com:443"})
	for _, c := range []struct{ secret, want string }{{"mine", "Bearer acme-own-key"}, {"elsewhere", ""}} {
		h := wakeHarness(e)
		h.Secrets = st
		id := e.create(Definition{Model: ModelConfig{Provider: "corp", Name: "m", APIKeySecret: c.secret}, Template: "minimal"})
		e.post(id, EventUserMessage, UserMessage{Text: "hi"})
		before := len(l.requests())
		_, _ = h.Wake(ctx, id)
		got := l.requests()[before:]
		switch {
		case c.want != "" && (len(got) == 0 || !strings.Contains(got[0], c.want) || strings.Contains(got[0], "operator-key-corp")):
			t.Errorf("secret %s: the provider got %q, want %s only", c.secret, got, c.want)
		case c.want == "" && len(got) > 0:
			t.Errorf("secret %s (not bound to the provider): the provider was called: %q", c.secret, got)
		case c.want == "" && !strings.Contains(e.state(id).StatusReason, "not bound"):
			t.Errorf("secret %s: status reason %q, want the refusal", c.secret, e.state(id).StatusReason)
		}
	}
}

// TestParseProvider: the --model-provider syntax, and its errors.
func TestParseProvider(t *testing.T) {
	env := map[string]string{"CORP_KEY": "k1"}
	getenv := func(k string) string { return env[k] }
	p, err := ParseProvider("corp=https://llm.corp.example/anthropic,key-env=CORP_KEY,adapter=anthropic,tenants=acme|globex", getenv)
	if err != nil || p.Name != "corp" || p.URL != "https://llm.corp.example/anthropic" || p.Key != "k1" || p.Adapter != "anthropic" ||
		!p.Allows("acme") || !p.Allows("globex") || p.Allows("initech") || p.Allows("default") {
		t.Fatalf("%+v %v", p, err)
	}
	if p, err := ParseProvider("open=http://127.0.0.1:8000/v1,tenants=*", getenv); err != nil || p.Key != "" || !p.Allows("anyone") {
		t.Fatalf("%+v %v", p, err)
	}
	if p, err := ParseProvider("own=https://x.example", getenv); err != nil || !p.Allows("default") || p.Allows("acme") {
		t.Fatalf("no tenants= is the operator's tenant only: %+v %v", p, err)
	}
	for _, bad := range []string{"", "corp", "=https://x", "c p=https://x", "corp=ftp://x", "corp=https://u:p@x", "corp=https://x,key-env=UNSET",
		"corp=https://x,adapter=gemini", "corp=https://x,tenants=a||b", "corp=https://x,color=red", "corp=https://x,adapter=openai,adapter=openai", "corp=https://x,key-env"} {
		if _, err := ParseProvider(bad, getenv); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "--model-provider") {
			t.Errorf("%q: %v, want refused", bad, err)
		}
	}
}
