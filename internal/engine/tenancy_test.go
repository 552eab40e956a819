package engine_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/stores/sqlmeta"
)

// TestTenancyKeys: a key's secret is returned once and only its hash is
// stored (the store finds the key by the secret's hash; the lists show no
// hash); scopes and expiry are checked before anything is written; the
// operator's key is not revoked; a revoked key lists with its time.
func TestTenancyKeys(t *testing.T) {
	ctx := context.Background()
	fc := clock.NewFake(time.Unix(1700000000, 0))
	m, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{Clock: fc})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tn := engine.NewTenancy(m, fc)
	if _, err := tn.CreateTenant(ctx, "Bad_ID", ""); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("invalid tenant id: %v", err)
	}
	if tt, err := tn.CreateTenant(ctx, "acme", ""); err != nil || tt.Name != "acme" || tt.State != metadata.TenantActive {
		t.Fatalf("create tenant: %+v %v", tt, err)
	}
	if _, _, err := tn.CreateKey(ctx, "acme", "ci", []string{"root"}, nil); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad scope: %v", err)
	}
	past := fc.Now().Add(-time.Second)
	if _, _, err := tn.CreateKey(ctx, "acme", "ci", []string{"read"}, &past); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("expiry in the past: %v", err)
	}
	if l, _ := tn.Keys(ctx, "acme"); len(l) != 0 {
		t.Fatalf("refused keys were stored: %+v", l)
	}
	k, secret, err := tn.CreateKey(ctx, "acme", "ci", []string{"write", "read"}, nil)
	if err != nil || k.Prefix != metadata.KeyPrefix(secret) || len(k.Scopes) != 2 || k.Scopes[0] != metadata.ScopeRead {
		t.Fatalf("create key: %+v %q %v", k, secret, err)
	}
	if row, err := m.KeyByHash(ctx, metadata.HashKey(secret)); err != nil || row.Name != "ci" || row.Tenant != "acme" {
		t.Fatalf("the store by the secret's hash: %+v %v", row, err)
	}
	if _, err := tn.RevokeKey(ctx, metadata.DefaultTenant, metadata.OperatorKeyName); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("revoke the operator's key: %v", err)
	}
	if r, err := tn.RevokeKey(ctx, "acme", "ci"); err != nil || r.Revoked.IsZero() {
		t.Fatalf("revoke: %+v %v", r, err)
	}
	if l, err := tn.Keys(ctx, "acme"); err != nil || len(l) != 1 || l[0].Revoked.IsZero() {
		t.Fatalf("keys: %+v %v", l, err)
	}
}

// TestTenancyDrain: a node that is down is not drained; a live node with
// sandboxes and no other node with room is refused and stays live; with
// room it drains, and undrains back to live.
func TestTenancyDrain(t *testing.T) {
	ctx := context.Background()
	fc := clock.NewFake(time.Unix(1700000000, 0))
	m, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{Clock: fc})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tn := engine.NewTenancy(m, fc)
	if _, err := tn.Node(ctx, "n1"); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown node: %v", err)
	}
	n1, err := m.RegisterNode(ctx, metadata.Node{ID: "n1", Addr: "127.0.0.1:1"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Insert(ctx, metadata.Sandbox{ID: "sbx-1", Template: "minimal", Driver: "gvisor", Tenant: metadata.DefaultTenant, Node: "n1", State: metadata.StateRunning}); err != nil {
		t.Fatal(err)
	}
	if _, err := tn.Drain(ctx, n1); err == nil {
		t.Fatal("drained with nowhere for its sandbox to go")
	}
	if n, _ := tn.Node(ctx, "n1"); n.State != metadata.NodeLive {
		t.Fatalf("refused drain left the node %s", n.State)
	}
	if _, err := m.RegisterNode(ctx, metadata.Node{ID: "n2", Addr: "127.0.0.1:2"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if held, err := tn.Drain(ctx, n1); err != nil || held != 1 {
		t.Fatalf("drain: %d %v", held, err)
	}
	n, _ := tn.Node(ctx, "n1")
	if n.State != metadata.NodeDraining {
		t.Fatalf("drained node is %s", n.State)
	}
	if err := tn.Undrain(ctx, n); err != nil {
		t.Fatal(err)
	}
	if n, _ := tn.Node(ctx, "n1"); n.State != metadata.NodeLive {
		t.Fatalf("undrained node is %s", n.State)
	}
	fc.Advance(2 * time.Minute)
	if _, err := tn.Drain(ctx, n); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("drain of a node whose lease expired: %v", err)
	}
}
