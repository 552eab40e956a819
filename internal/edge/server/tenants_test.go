package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/stores/sqlmeta"
)

// TestEveryRouteDeclaresScope: each route names the scope it needs, and no
// GET route needs more than read unless it manages tenants (admin).
func TestEveryRouteDeclaresScope(t *testing.T) {
	for _, rt := range (&Server{}).routes() {
		switch rt.Scope {
		case Public, read, write, admin:
		default:
			t.Errorf("%s %s declares scope %q; want Public, read, write or admin", rt.Method, rt.Path, rt.Scope)
		}
		if rt.Method == "GET" && rt.Scope == write {
			t.Errorf("GET %s needs write; a GET changes nothing", rt.Path)
		}
	}
}

// TestRouteWithoutScopeIsRefused: a route that forgot its scope is closed
// to every key, the operator's too, and its handler never runs.
func TestRouteWithoutScopeIsRefused(t *testing.T) {
	m := newMeta(t, clock.Real{})
	s := New(Options{Meta: m, Logger: discard()})
	ran := false
	h := s.wrap(Route{Method: "GET", Path: "/v1/forgotten", h: func(w http.ResponseWriter, r *http.Request, c *call) error {
		ran = true
		return nil
	}})
	req := httptest.NewRequest("GET", "/v1/forgotten", nil)
	req.Header.Set("Authorization", "Bearer "+operatorKey)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusForbidden || ran || !strings.Contains(w.Body.String(), "declares no scope") {
		t.Fatalf("got %d %s (handler ran: %v)", w.Code, w.Body, ran)
	}
}

const operatorKey = "amber_test_operator_key_0123456789"

func newMeta(t *testing.T, c clock.Clock) metadata.Store {
	t.Helper()
	m, err := sqlmeta.Open(filepath.Join(t.TempDir(), "meta.db"), sqlmeta.Options{Clock: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.PutKey(context.Background(), meta.APIKey{Tenant: meta.DefaultTenant, Name: meta.OperatorKeyName,
		Hash: meta.HashKey(operatorKey), Prefix: meta.KeyPrefix(operatorKey), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestTenantsAndKeysOverTheAPI walks the life of a tenant's keys: the
// operator makes a tenant and its admin key; that key makes and revokes
// its own tenant's keys and sees no other tenant; a key stops working when
// it expires or is revoked, with a message that says so.
func TestTenantsAndKeysOverTheAPI(t *testing.T) {
	ctx := context.Background()
	fc := clock.NewFake(time.Now())
	m := newMeta(t, fc)
	ts := httptest.NewServer(New(Options{Meta: m, Clock: fc, Logger: discard()}))
	t.Cleanup(ts.Close)
	op, _ := client.New(ts.URL, operatorKey)
	as := func(key string) *client.Client { c, _ := client.New(ts.URL, key); return c }

	acme, err := op.CreateTenant(ctx, api.CreateTenantRequest{ID: "acme", Name: "Acme Corp"})
	if err != nil || acme.ID != "acme" || acme.State != "active" {
		t.Fatalf("create tenant: %+v %v", acme, err)
	}
	if _, err := op.CreateTenant(ctx, api.CreateTenantRequest{ID: "acme"}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("create it again: %v", err)
	}
	if _, err := op.CreateTenant(ctx, api.CreateTenantRequest{ID: "Not Valid"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad tenant id: %v", err)
	}
	op.CreateTenant(ctx, api.CreateTenantRequest{ID: "globex"})

	acmeAdmin, err := op.CreateKey(ctx, "acme", api.CreateKeyRequest{Name: "admin", Scopes: []string{"admin", "read", "write"}})
	if err != nil || !strings.HasPrefix(acmeAdmin.Key, acmeAdmin.Prefix) || len(acmeAdmin.Prefix) != 12 || strings.Join(acmeAdmin.Scopes, ",") != "read,write,admin" {
		t.Fatalf("operator creates acme's admin key: %+v %v", acmeAdmin, err)
	}
	if _, err := op.CreateKey(ctx, "nope", api.CreateKeyRequest{Name: "k", Scopes: []string{"read"}}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("key for a missing tenant: %v", err)
	}
	ta := as(acmeAdmin.Key)

	// acme's admin manages acme only.
	if _, err := ta.CreateTenant(ctx, api.CreateTenantRequest{ID: "evil"}); !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "operator") {
		t.Fatalf("tenant admin creates a tenant: %v", err)
	}
	if tl, err := ta.Tenants(ctx); err != nil || len(tl) != 1 || tl[0].ID != "acme" {
		t.Fatalf("tenant admin lists tenants: %+v %v", tl, err)
	}
	if tl, err := op.Tenants(ctx); err != nil || len(tl) != 3 {
		t.Fatalf("operator lists tenants: %+v %v", tl, err)
	}
	for _, other := range []string{"globex", "default", "nope"} {
		if _, err := ta.Keys(ctx, other); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("acme admin lists %s's keys: %v", other, err)
		}
		if _, err := ta.CreateKey(ctx, other, api.CreateKeyRequest{Name: "x", Scopes: []string{"admin"}}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("acme admin creates a key of %s: %v", other, err)
		}
		if err := ta.RevokeKey(ctx, other, "admin"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("acme admin revokes %s's admin key: %v", other, err)
		}
	}

	exp := fc.Now().Add(time.Hour)
	ci, err := ta.CreateKey(ctx, "acme", api.CreateKeyRequest{Name: "ci", Scopes: []string{"read"}, ExpiresAt: &exp})
	if err != nil || ci.Key == "" || ci.ExpiresAt == nil || !ci.ExpiresAt.Equal(exp) || ci.Tenant != "acme" {
		t.Fatalf("acme admin creates a read key: %+v %v", ci, err)
	}
	past := fc.Now().Add(-time.Second)
	for _, bad := range []api.CreateKeyRequest{
		{Name: "old", Scopes: []string{"read"}, ExpiresAt: &past},
		{Name: "root", Scopes: []string{"root"}},
		{Name: "none"},
		{Name: "", Scopes: []string{"read"}},
	} {
		if _, err := ta.CreateKey(ctx, "acme", bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("create %+v: %v", bad, err)
		}
	}
	if _, err := ta.CreateKey(ctx, "acme", api.CreateKeyRequest{Name: "ci", Scopes: []string{"read"}}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("a second key named ci: %v", err)
	}

	// Keys are never shown again.
	keys, err := op.Keys(ctx, "acme")
	if err != nil || len(keys) != 2 {
		t.Fatalf("list acme's keys: %+v %v", keys, err)
	}
	for _, k := range keys {
		if k.Key != "" || k.Prefix == "" || k.Tenant != "acme" {
			t.Errorf("listed key %+v", k)
		}
	}

	// A read key lacks admin: 403 naming the scope.
	if _, err := as(ci.Key).Keys(ctx, "acme"); !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "scope admin") {
		t.Fatalf("read key lists keys: %v", err)
	}
	// Expiry: the same key is 401 once its time has come.
	fc.Advance(time.Hour)
	if _, err := as(ci.Key).Keys(ctx, "acme"); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired key: %v", err)
	}

	// Revocation, by acme's own admin; the operator's key cannot be revoked here.
	if err := ta.RevokeKey(ctx, "acme", "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("revoke a missing key: %v", err)
	}
	if err := op.RevokeKey(ctx, "default", "admin"); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "admin.key") {
		t.Fatalf("revoke the operator key: %v", err)
	}
	if err := ta.RevokeKey(ctx, "acme", "admin"); err != nil {
		t.Fatalf("acme admin revokes itself: %v", err)
	}
	if _, err := ta.Tenants(ctx); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("revoked key: %v", err)
	}
	if err := op.RevokeKey(ctx, "acme", "admin"); err != nil {
		t.Fatalf("revoke twice: %v", err)
	}
	keys, _ = op.Keys(ctx, "acme")
	if len(keys) != 2 || keys[0].Name != "admin" || keys[0].RevokedAt == nil || keys[1].RevokedAt != nil {
		t.Fatalf("keys after revoke: %+v", keys)
	}
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
