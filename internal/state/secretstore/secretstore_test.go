package secretstore_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/secretstore"
	"github.com/amber-run/amber/stores/sqlmeta"
)

func TestSecretsSealedAtRest(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "meta.db")
	m, err := sqlmeta.Open(path, sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	key := bytes.Repeat([]byte{7}, 32)
	s, err := secretstore.New(m, key)
	if err != nil {
		t.Fatal(err)
	}
	value := []byte("sk_live_plaintext_never_at_rest_9f8e7d")
	if err := s.Put(ctx, "acme", "stripe", value, []string{"api.stripe.com:443"}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Secret(ctx, "acme", "stripe")
	if err != nil || !bytes.Equal(got.Value, value) || got.Hosts[0] != "api.stripe.com:443" {
		t.Fatalf("Secret = %+v, %v", got, err)
	}
	if _, err := s.Secret(ctx, "globex", "stripe"); !errdefs.IsNotFound(err) {
		t.Fatalf("another tenant's secret: %v", err)
	}
	m.Close()
	for _, f := range []string{path, path + "-wal"} {
		b, _ := os.ReadFile(f)
		if bytes.Contains(b, value) {
			t.Fatalf("%s holds the plaintext value", f)
		}
	}
	m2, err := sqlmeta.Open(path, sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	wrong, _ := secretstore.New(m2, bytes.Repeat([]byte{8}, 32))
	if _, err := wrong.Secret(ctx, "acme", "stripe"); !errdefs.IsDataLoss(err) {
		t.Fatalf("with the wrong master key: %v", err)
	}
	for _, bad := range []struct {
		name  string
		value []byte
		hosts []string
	}{
		{"bad name!", value, []string{"a:1"}},
		{"ok", nil, []string{"a:1"}},
		{"ok", value, nil},
		{"ok", value, []string{"no-port"}},
	} {
		if err := wrong.Put(ctx, "acme", bad.name, bad.value, bad.hosts); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Put(%q, %q, %v) = %v, want invalid argument", bad.name, bad.value, bad.hosts, err)
		}
	}
}

func TestTenantCAPersists(t *testing.T) {
	ctx := context.Background()
	m, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	key := bytes.Repeat([]byte{7}, 32)
	s1, _ := secretstore.New(m, key)
	c1, err := s1.CACert(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := secretstore.New(m, key) // a restarted daemon
	c2, err := s2.CACert(ctx, "acme")
	if err != nil || !bytes.Equal(c1, c2) {
		t.Fatalf("CA changed across restarts (%v)", err)
	}
	other, _ := s2.CACert(ctx, "globex")
	if bytes.Equal(other, c1) {
		t.Fatal("two tenants share a CA")
	}
}
