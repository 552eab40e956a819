package sqlmeta

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
)

func TestPutKeyReplacesByTenantAndName(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	h1, h2 := HashKey("one"), HashKey("two")
	admin := APIKey{Tenant: DefaultTenant, Name: "admin", Hash: h1, Scopes: AllScopes}
	if err := s.PutKey(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if k, err := s.KeyByHash(ctx, h1); err != nil || k.Tenant != DefaultTenant || !k.Has(ScopeAdmin) || !k.Has(ScopeRead) {
		t.Fatalf("lookup: %+v %v", k, err)
	}
	// A revoked operator key comes back to life when `amber up` puts it again.
	if _, err := s.RevokeKey(ctx, DefaultTenant, "admin"); err != nil {
		t.Fatal(err)
	}
	admin.Hash = h2
	if err := s.PutKey(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if _, err := s.KeyByHash(ctx, h1); !errdefs.IsNotFound(err) {
		t.Fatalf("replaced key still accepted: %v", err)
	}
	k, err := s.KeyByName(ctx, DefaultTenant, "admin")
	if err != nil || k.Hash != h2 || !k.Revoked.IsZero() {
		t.Fatalf("by name: %+v %v", k, err)
	}
	if err := s.PutKey(ctx, APIKey{Tenant: DefaultTenant, Name: "x", Hash: h1}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("key without scopes: %v", err)
	}
}

func TestTenantsAndKeys(t *testing.T) {
	ctx := context.Background()
	fc := clock.NewFake(time.Unix(1700000000, 0))
	s, err := Open(newSpec(t), Options{Clock: fc})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if tl, err := s.ListTenants(ctx); err != nil || len(tl) != 1 || tl[0].ID != DefaultTenant || tl[0].State != TenantActive {
		t.Fatalf("a new store's tenants: %+v %v", tl, err)
	}
	acme, err := s.CreateTenant(ctx, Tenant{ID: "acme", Name: "Acme Corp"})
	if err != nil || acme.Name != "Acme Corp" || acme.State != TenantActive || !acme.Created.Equal(fc.Now()) {
		t.Fatalf("create: %+v %v", acme, err)
	}
	if _, err := s.CreateTenant(ctx, Tenant{ID: "acme"}); !isAlreadyExists(err) {
		t.Fatalf("second create: %v", err)
	}
	for _, bad := range []string{"", "-x", "Acme", "a/b", strings.Repeat("a", 41)} {
		if _, err := s.CreateTenant(ctx, Tenant{ID: bad}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("tenant id %q: %v", bad, err)
		}
	}
	if g, err := s.GetTenant(ctx, "globex"); !errdefs.IsNotFound(err) {
		t.Fatalf("get missing tenant: %+v %v", g, err)
	}

	k := APIKey{Tenant: "acme", Name: "ci", Hash: HashKey("s1"), Prefix: "amber_abcdef", Scopes: []Scope{ScopeWrite, ScopeRead, ScopeRead},
		Expires: fc.Now().Add(time.Hour)}
	got, err := s.CreateKey(ctx, k)
	if err != nil || strings.Join(scopeNames(got.Scopes), ",") != "read,write" {
		t.Fatalf("create key: %+v %v", got, err)
	}
	if _, err := s.CreateKey(ctx, APIKey{Tenant: "acme", Name: "ci", Hash: HashKey("s2"), Scopes: AllScopes}); !isAlreadyExists(err) {
		t.Fatalf("same name twice: %v", err)
	}
	if _, err := s.CreateKey(ctx, APIKey{Tenant: "globex", Name: "ci", Hash: HashKey("s3"), Scopes: AllScopes}); !errdefs.IsNotFound(err) {
		t.Fatalf("key of a missing tenant: %v", err)
	}
	if _, err := s.CreateKey(ctx, APIKey{Tenant: "acme", Name: "bad name", Hash: HashKey("s4"), Scopes: AllScopes}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad name: %v", err)
	}

	// Usable: fine until the expiry, refused from it on.
	byHash, err := s.KeyByHash(ctx, HashKey("s1"))
	if err != nil || byHash.Name != "ci" || byHash.Prefix != "amber_abcdef" || !byHash.Expires.Equal(k.Expires) {
		t.Fatalf("by hash: %+v %v", byHash, err)
	}
	if err := byHash.Usable(fc.Now()); err != nil {
		t.Fatalf("fresh key: %v", err)
	}
	if err := byHash.Usable(k.Expires); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("at expiry: %v", err)
	}

	fc.Advance(time.Minute)
	rk, err := s.RevokeKey(ctx, "acme", "ci")
	if err != nil || !rk.Revoked.Equal(fc.Now()) {
		t.Fatalf("revoke: %+v %v", rk, err)
	}
	fc.Advance(time.Minute)
	if again, err := s.RevokeKey(ctx, "acme", "ci"); err != nil || !again.Revoked.Equal(rk.Revoked) {
		t.Fatalf("revoke twice: %+v %v", again, err)
	}
	byHash, _ = s.KeyByHash(ctx, HashKey("s1"))
	if err := byHash.Usable(fc.Now()); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("revoked key: %v", err)
	}
	if _, err := s.RevokeKey(ctx, "default", "ci"); !errdefs.IsNotFound(err) {
		t.Fatalf("revoke another tenant's key by name: %v", err)
	}
	if l, err := s.ListKeys(ctx, "acme"); err != nil || len(l) != 1 || l[0].Revoked.IsZero() {
		t.Fatalf("list: %+v %v", l, err)
	}
	if l, err := s.ListKeys(ctx, DefaultTenant); err != nil || len(l) != 0 {
		t.Fatalf("another tenant's list: %+v %v", l, err)
	}
}

// schemaV2 is the metadata schema as version 2 left it (sandboxes and the
// api_keys table without scopes), for the migration test.
const schemaV2 = `
CREATE TABLE sandboxes (
	id TEXT PRIMARY KEY, tenant TEXT NOT NULL, template TEXT NOT NULL, template_version TEXT NOT NULL,
	driver TEXT NOT NULL, limits TEXT NOT NULL, env TEXT NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL,
	pooled INTEGER NOT NULL, from_pool INTEGER NOT NULL, created_ns INTEGER NOT NULL, updated_ns INTEGER NOT NULL,
	generation INTEGER NOT NULL DEFAULT 0, origin TEXT NOT NULL DEFAULT '', policy TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE TABLE api_keys (
	hash TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, tenant TEXT NOT NULL, created_ns INTEGER NOT NULL
) STRICT;
INSERT INTO sandboxes VALUES ('sbx-old', 'team-x', 'minimal', 'v1', 'gvisor', '{}', '[]', 'running', '', 0, 0, 5, 5, 0, '', '');
INSERT INTO sandboxes VALUES ('sbx-pool', '', 'minimal', 'v1', 'gvisor', '{}', '[]', 'running', '', 1, 0, 6, 6, 0, '', '');
INSERT INTO api_keys VALUES ('` + "aa" + `', 'admin', 'default', 7);
PRAGMA user_version = 2;`

// TestMigrateFromV2 opens a version-2 database: its key keeps working with
// every scope, its sandboxes are untouched, and their tenants exist.
func TestMigrateFromV2(t *testing.T) {
	onlySQLite(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "meta.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	hash := HashKey("old-admin")
	if _, err := db.Exec(strings.Replace(schemaV2, "'aa'", "'"+hash+"'", 1)); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k, err := s.KeyByHash(ctx, hash)
	if err != nil || k.Tenant != DefaultTenant || k.Name != "admin" || len(k.Scopes) != 3 || k.Usable(time.Now()) != nil || k.Created.UnixNano() != 7 {
		t.Fatalf("migrated key: %+v %v", k, err)
	}
	if sb, err := s.Get(ctx, "sbx-old"); err != nil || sb.Tenant != "team-x" || sb.State != StateRunning {
		t.Fatalf("migrated sandbox: %+v %v", sb, err)
	}
	tl, err := s.ListTenants(ctx)
	var ids []string
	for _, tn := range tl {
		ids = append(ids, tn.ID)
	}
	if err != nil || strings.Join(ids, ",") != "team-x,default" {
		t.Fatalf("tenants after migration: %v %v (want team-x (created 5), default (7))", ids, err)
	}
	var v int
	s.db.QueryRow(`PRAGMA user_version`).Scan(&v)
	if v != schemaVersion {
		t.Fatalf("user_version %d", v)
	}
	// The new uniqueness: the same name in two tenants.
	if _, err := s.CreateKey(ctx, APIKey{Tenant: "team-x", Name: "admin", Hash: HashKey("x"), Scopes: AllScopes}); err != nil {
		t.Fatalf("name reused in another tenant: %v", err)
	}
}
