package metatest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
)

// testTenantsAndKeys: a new store holds the operator's tenant; tenant ids
// are unique and checked; keys belong to an existing tenant, their names are
// unique within it for good, and a revoked or expired key is found but not
// usable.
func testTenantsAndKeys(t *testing.T, open Opener) {
	ctx := ctxT(t)
	fc := clock.NewFake(epoch)
	s := mustOpen(t, open, fc)
	if tl, err := s.ListTenants(ctx); err != nil || len(tl) != 1 || tl[0].ID != metadata.DefaultTenant || tl[0].State != metadata.TenantActive {
		t.Fatalf("a new store's tenants: %+v %v", tl, err)
	}
	acme, err := s.CreateTenant(ctx, metadata.Tenant{ID: "acme", Name: "Acme Corp"})
	if err != nil || acme.Name != "Acme Corp" || acme.State != metadata.TenantActive || !acme.Created.Equal(fc.Now()) {
		t.Fatalf("create: %+v %v", acme, err)
	}
	if _, err := s.CreateTenant(ctx, metadata.Tenant{ID: "acme"}); !isAlreadyExists(err) {
		t.Fatalf("second create: %v", err)
	}
	for _, bad := range []string{"", "-x", "Acme", "a/b", strings.Repeat("a", 41)} {
		if _, err := s.CreateTenant(ctx, metadata.Tenant{ID: bad}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("tenant id %q: %v", bad, err)
		}
	}
	if g, err := s.GetTenant(ctx, "globex"); !errdefs.IsNotFound(err) {
		t.Fatalf("get missing tenant: %+v %v", g, err)
	}
	if g, err := s.GetTenant(ctx, "acme"); err != nil || g.Name != "Acme Corp" {
		t.Fatalf("get tenant: %+v %v", g, err)
	}

	all := []metadata.Scope{metadata.ScopeRead, metadata.ScopeWrite, metadata.ScopeAdmin}
	k := metadata.APIKey{Tenant: "acme", Name: "ci", Hash: hashOf("s1"), Prefix: "amber_abcdef",
		Scopes: []metadata.Scope{metadata.ScopeWrite, metadata.ScopeRead, metadata.ScopeRead}, Expires: fc.Now().Add(time.Hour)}
	got, err := s.CreateKey(ctx, k)
	if err != nil || len(got.Scopes) != 2 || got.Scopes[0] != metadata.ScopeRead || got.Scopes[1] != metadata.ScopeWrite {
		t.Fatalf("create key: %+v %v", got, err)
	}
	if _, err := s.CreateKey(ctx, metadata.APIKey{Tenant: "acme", Name: "ci", Hash: hashOf("s2"), Scopes: all}); !isAlreadyExists(err) {
		t.Fatalf("same name twice: %v", err)
	}
	if _, err := s.CreateKey(ctx, metadata.APIKey{Tenant: "globex", Name: "ci", Hash: hashOf("s3"), Scopes: all}); !errdefs.IsNotFound(err) {
		t.Fatalf("key of a missing tenant: %v", err)
	}
	if _, err := s.CreateKey(ctx, metadata.APIKey{Tenant: "acme", Name: "bad name", Hash: hashOf("s4"), Scopes: all}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad name: %v", err)
	}
	byHash, err := s.KeyByHash(ctx, hashOf("s1"))
	if err != nil || byHash.Name != "ci" || byHash.Prefix != "amber_abcdef" || !byHash.Expires.Equal(k.Expires) {
		t.Fatalf("by hash: %+v %v", byHash, err)
	}
	if err := byHash.Usable(fc.Now()); err != nil {
		t.Fatalf("fresh key: %v", err)
	}
	if err := byHash.Usable(k.Expires); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("at expiry: %v", err)
	}
	if byName, err := s.KeyByName(ctx, "acme", "ci"); err != nil || byName.Hash != hashOf("s1") {
		t.Fatalf("by name: %+v %v", byName, err)
	}
	if _, err := s.KeyByName(ctx, metadata.DefaultTenant, "ci"); !errdefs.IsNotFound(err) {
		t.Fatalf("another tenant's key by name: %v", err)
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
	byHash, _ = s.KeyByHash(ctx, hashOf("s1"))
	if err := byHash.Usable(fc.Now()); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("revoked key: %v", err)
	}
	if _, err := s.RevokeKey(ctx, metadata.DefaultTenant, "ci"); !errdefs.IsNotFound(err) {
		t.Fatalf("revoke another tenant's key by name: %v", err)
	}
	if l, err := s.ListKeys(ctx, "acme"); err != nil || len(l) != 1 || l[0].Revoked.IsZero() {
		t.Fatalf("list: %+v %v", l, err)
	}
	if l, err := s.ListKeys(ctx, metadata.DefaultTenant); err != nil || len(l) != 0 {
		t.Fatalf("another tenant's list: %+v %v", l, err)
	}

	// PutKey replaces the key of the same tenant and name: the old hash
	// stops being found at once.
	op := metadata.APIKey{Tenant: metadata.DefaultTenant, Name: "admin", Hash: hashOf("op1"), Scopes: all}
	if err := s.PutKey(ctx, op); err != nil {
		t.Fatal(err)
	}
	op.Hash = hashOf("op2")
	if err := s.PutKey(ctx, op); err != nil {
		t.Fatal(err)
	}
	if _, err := s.KeyByHash(ctx, hashOf("op1")); !errdefs.IsNotFound(err) {
		t.Fatalf("a replaced key is still found: %v", err)
	}
	if got, err := s.KeyByHash(ctx, hashOf("op2")); err != nil || !got.Has(metadata.ScopeAdmin) {
		t.Fatalf("the replacing key: %+v %v", got, err)
	}
}

// testSessions: session rows are unique, updated in place, survive a
// reopen and list by tenant and status.
func testSessions(t *testing.T, open Opener) {
	ctx := ctxT(t)
	s, err := open(clock.NewFake(epoch))
	if err != nil {
		t.Fatal(err)
	}
	for _, se := range []metadata.Session{
		{ID: "ses-a", Tenant: "acme", Definition: `{"x":1}`, Status: "idle"},
		{ID: "ses-b", Tenant: "globex", Definition: `{}`, Status: "running"},
	} {
		if _, err := s.InsertSession(ctx, se); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.InsertSession(ctx, metadata.Session{ID: "ses-a", Tenant: "acme", Status: "idle"}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second insert of ses-a: %v", err)
	}
	if err := s.SetSessionStatus(ctx, "ses-a", "running", "user message"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSessionSandbox(ctx, "ses-a", "sbx-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSessionStatus(ctx, "ses-nope", "running", ""); !errdefs.IsNotFound(err) {
		t.Fatalf("status of a missing session: %v", err)
	}
	s.Close()
	s = mustOpen(t, open, clock.Real{})
	got, err := s.GetSession(ctx, "ses-a")
	if err != nil || got.Tenant != "acme" || got.Status != "running" || got.Reason != "user message" || got.SandboxID != "sbx-1" || got.Definition != `{"x":1}` {
		t.Fatalf("ses-a after reopen: %+v %v", got, err)
	}
	if l, err := s.ListSessions(ctx, "acme"); err != nil || len(l) != 1 || l[0].ID != "ses-a" {
		t.Fatalf("acme's sessions: %+v %v", l, err)
	}
	if l, err := s.ListSessions(ctx, "", "running"); err != nil || len(l) != 2 {
		t.Fatalf("running sessions: %+v %v", l, err)
	}
	if l, err := s.SandboxSessions(ctx, "sbx-1", "running"); err != nil || len(l) != 1 || l[0].ID != "ses-a" {
		t.Fatalf("sbx-1's sessions: %+v %v", l, err)
	}
	if _, err := s.GetSession(ctx, "ses-c"); !errdefs.IsNotFound(err) {
		t.Fatalf("missing session: %v", err)
	}
}
