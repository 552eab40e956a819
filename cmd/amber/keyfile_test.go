package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/meta"
)

func TestAdminKeyLifecycle(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	m, err := meta.Open(filepath.Join(dir, "meta.db"), meta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	path, created, err := ensureAdminKey(ctx, m, dir, false)
	if err != nil || !created {
		t.Fatalf("first start: %v %v", created, err)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin.key mode %v", fi.Mode())
	}
	b, _ := os.ReadFile(path)
	key1 := strings.TrimSpace(string(b))
	if k, err := m.KeyByHash(ctx, meta.HashKey(key1)); err != nil || k.Tenant != "default" || !k.Has(meta.ScopeAdmin) || !k.Has(meta.ScopeWrite) || !k.Has(meta.ScopeRead) || k.Prefix != key1[:12] {
		t.Fatalf("key not accepted: %v", err)
	}
	if _, created, _ := ensureAdminKey(ctx, m, dir, false); created {
		t.Fatal("second start made a new key")
	}
	// Only the hash is stored.
	for _, f := range []string{"meta.db", "meta.db-wal"} {
		raw, _ := os.ReadFile(filepath.Join(dir, f))
		if strings.Contains(string(raw), key1) {
			t.Fatalf("%s holds the key itself", f)
		}
	}
	// A deleted key file gets a new key; the old one stops working.
	os.Remove(path)
	if _, created, err := ensureAdminKey(ctx, m, dir, false); err != nil || !created {
		t.Fatalf("after delete: %v %v", created, err)
	}
	if _, err := m.KeyByHash(ctx, meta.HashKey(key1)); !errdefs.IsNotFound(err) {
		t.Fatalf("old key still accepted: %v", err)
	}
}
