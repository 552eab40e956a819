package sqlmeta

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fixtureSpec returns a store made by the code of commit ea912ea (before
// the metadata contract moved to core/metadata), on the current backend:
// a copy of testdata/meta-ea912ea.db, or testdata/postgres-ea912ea.sql
// loaded into a schema of its own. Both were made by testdata/mkfixture
// run on that commit's code.
func fixtureSpec(t *testing.T) string {
	t.Helper()
	if backend == "sqlite" {
		b, err := os.ReadFile("testdata/meta-ea912ea.db")
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "meta.db")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	dump, err := os.ReadFile("testdata/postgres-ea912ea.sql")
	if err != nil {
		t.Fatal(err)
	}
	var r [6]byte
	rand.Read(r[:])
	schema := "meta_fx_" + hex.EncodeToString(r[:])
	sqlText := strings.NewReplacer("SCHEMA meta_fixture", "SCHEMA "+schema, "meta_fixture.", schema+".").Replace(string(dump))
	// A pool of its own: the dump sets the session's search_path.
	loader, err := sql.Open("pgx", testPGDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer loader.Close()
	t.Cleanup(func() {
		admin, err := sql.Open("pgx", testPGDSN())
		if err == nil {
			admin.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
			admin.Close()
		}
	})
	if _, err := loader.Exec(sqlText); err != nil {
		t.Fatalf("load the PostgreSQL fixture (run `make setup-test`, or set AMBER_TEST_PG): %v", err)
	}
	sep := "?"
	if strings.Contains(testPGDSN(), "?") {
		sep = "&"
	}
	return testPGDSN() + sep + "search_path=" + schema
}

// TestOpensStoreOfEA912EA: a SQLite data dir's meta.db and a PostgreSQL
// schema made by the code of ea912ea open with today's code and serve
// every kind of row they hold (sandboxes, checkpoints, tenants, keys,
// quotas, policies, egress, ports, secrets, CAs, sessions, nodes,
// idempotent answers), then take new writes.
func TestOpensStoreOfEA912EA(t *testing.T) {
	ctx := context.Background()
	s, err := Open(fixtureSpec(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := time.Unix(1700000001, 0)

	sb, err := s.Get(ctx, "sbx-fixture")
	if err != nil || sb.Tenant != "acme" || sb.Driver != "gvisor" || sb.State != StateRunning || sb.Limits.MemoryBytes != 256<<20 ||
		sb.Limits.MilliCPUs != 500 || sb.Env[0] != "A=1" || sb.Policy != "fast" || sb.Node != "node-a" || !sb.Created.Equal(at) {
		t.Fatalf("sandbox: %+v %v", sb, err)
	}
	acme := "acme"
	if l, err := s.List(ctx, Filter{Tenant: &acme}); err != nil || len(l) != 1 || l[0].ID != "sbx-fixture" {
		t.Fatalf("acme's sandboxes: %+v %v", l, err)
	}
	if l, err := s.List(ctx, Filter{States: []State{StateDestroyed}}); err != nil || len(l) != 1 || l[0].ID != "sbx-gone" || l[0].Reason != "rm" {
		t.Fatalf("destroyed sandboxes: %+v %v", l, err)
	}

	if tl, err := s.ListTenants(ctx); err != nil || len(tl) != 2 {
		t.Fatalf("tenants: %+v %v", tl, err)
	}
	if tn, err := s.GetTenant(ctx, "acme"); err != nil || tn.Name != "Acme Corp" || tn.State != TenantActive {
		t.Fatalf("tenant: %+v %v", tn, err)
	}
	k, err := s.KeyByHash(ctx, HashKey("amber_acme_ci"))
	if err != nil || k.Tenant != "acme" || k.Name != "ci" || !k.Has(ScopeWrite) || k.Has(ScopeAdmin) || k.Usable(at) != nil {
		t.Fatalf("acme's key: %+v %v", k, err)
	}
	if op, err := s.KeyByName(ctx, DefaultTenant, OperatorKeyName); err != nil || op.Hash != HashKey("amber_operator") || !op.Has(ScopeAdmin) {
		t.Fatalf("operator's key: %+v %v", op, err)
	}
	if l, err := s.ListKeys(ctx, "acme"); err != nil || len(l) != 1 {
		t.Fatalf("acme's keys: %+v %v", l, err)
	}
	if q, err := s.TenantQuota(ctx, "acme"); err != nil || q.MaxSandboxes != 7 || q.Budgets["cpu_seconds"] != 1000 {
		t.Fatalf("quota: %+v %v", q, err)
	}
	if p, err := s.TenantPolicy(ctx, "acme"); err != nil || p.Recovery != "fast" || p.KeepCheckpoints != 3 || p.Egress == nil || p.Egress.Allow[0] != "pypi.org:443" {
		t.Fatalf("policy: %+v %v", p, err)
	}

	ck, err := s.Checkpoint(ctx, "ckpt-fixture")
	if err != nil || ck.State != CheckpointCommitted || ck.SandboxID != "sbx-fixture" || ck.Tag != "golden" || ck.Seq != 3 || ck.EventSeq != 4 ||
		ck.ManifestDigest != "sha256:manifest" || ck.Stats.StoredBytes != 4096 {
		t.Fatalf("checkpoint: %+v %v", ck, err)
	}
	if n, err := s.CheckpointBytes(ctx, "acme"); err != nil || n != 4096 {
		t.Fatalf("checkpoint bytes: %d %v", n, err)
	}
	if p, run, err := s.SandboxEgress(ctx, "sbx-fixture"); err != nil || run != "run-1" || p == nil || p.Allow[0] != "example.com:443" || p.Burst != 5 {
		t.Fatalf("sandbox egress: %+v %q %v", p, run, err)
	}
	if e, err := s.ExposureByToken(ctx, "sbx-fixture", 8000, HashKey("port-token")); err != nil || e.Tenant != "acme" {
		t.Fatalf("exposure: %+v %v", e, err)
	}
	if x, err := s.GetSecret(ctx, "acme", "api-token"); err != nil || string(x.Sealed) != "\x01\x02\x03" || x.Hosts[0] != "api.example.com:443" {
		t.Fatalf("secret: %+v %v", x, err)
	}
	if c, key, err := s.TenantCA(ctx, "acme"); err != nil || string(c) != "cert-pem" || string(key) != "sealed-key" {
		t.Fatalf("tenant CA: %q %q %v", c, key, err)
	}
	if se, err := s.GetSession(ctx, "ses-fixture"); err != nil || se.Tenant != "acme" || se.Status != "idle" || se.SandboxID != "sbx-fixture" || se.Definition != `{"model":"m"}` {
		t.Fatalf("session: %+v %v", se, err)
	}
	if n, err := s.GetNode(ctx, "node-a"); err != nil || n.Epoch != 1 || n.Addr != "127.0.0.1:7070" || n.Capacity.MaxSandboxes != 10 {
		t.Fatalf("node: %+v %v", n, err)
	}
	if e, claimed, err := s.BeginIdempotent(ctx, "acme", "idem-1", "req-hash", time.Hour); err != nil || claimed || !e.Done || e.Status != 201 || string(e.Body) != `{"id":"sbx-fixture"}` {
		t.Fatalf("idempotent answer: %+v %v %v", e, claimed, err)
	}

	// And it takes writes.
	if _, err := s.SetState(ctx, "sbx-fixture", StateStopped, "killed", StateRunning); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Insert(ctx, Sandbox{ID: "sbx-new", Tenant: "acme", Template: "minimal", Driver: "gvisor", State: StateRunning}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateTenant(ctx, Tenant{ID: "acme"}); !isAlreadyExists(err) {
		t.Fatalf("a tenant of the fixture created again: %v", err)
	}
}
