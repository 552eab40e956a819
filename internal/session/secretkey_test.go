package session

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/secretstore"
	"github.com/amber-run/amber/stores/sqlmeta"
)

// TestModelKeyFromSecret: a definition's api_key_secret is resolved from
// the tenant's secret store, only for an endpoint the secret is bound to,
// and never from another tenant.
func TestModelKeyFromSecret(t *testing.T) {
	ctx := context.Background()
	m, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	st, err := secretstore.New(m, bytes.Repeat([]byte{3}, 32))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(ctx, "acme", "anthropic", []byte("sk-ant-real"), []string{"api.anthropic.com:443", "127.0.0.1:*"}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		tenant, base string
		wantKey      string
		wantErr      func(error) bool
	}{
		{"acme", "", "sk-ant-real", nil},                      // the default endpoint
		{"acme", "http://127.0.0.1:8123", "sk-ant-real", nil}, // a bound local endpoint
		{"acme", "https://evil.example.com", "", func(err error) bool { return errors.Is(err, errdefs.ErrPermissionDenied) }}, // not bound
		{"globex", "", "", errdefs.IsNotFound}, // another tenant's
	}
	for _, c := range cases {
		cfg := ModelConfig{Adapter: "anthropic", BaseURL: c.base, APIKeySecret: "anthropic"}
		mc, err := resolveModel(ctx, nil, st, c.tenant, cfg)
		key := mc.ep.key
		switch {
		case c.wantErr == nil && (err != nil || key != c.wantKey):
			t.Errorf("%s %q: key %q, %v; want %q", c.tenant, c.base, key, err, c.wantKey)
		case c.wantErr != nil && (err == nil || !c.wantErr(err) || key != ""):
			t.Errorf("%s %q: key %q, %v; want the error", c.tenant, c.base, key, err)
		}
	}
	if _, err := resolveModel(ctx, nil, nil, "acme", ModelConfig{Adapter: "openai", APIKeySecret: "x"}); err == nil {
		t.Error("a secret was resolved without a secret store")
	}
}
