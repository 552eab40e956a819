// Command mkfixture fills a new metadata store with one row of every kind:
// it made meta-ea912ea.db and postgres-ea912ea.sql, run on the code of
// commit ea912ea (see fixture_test.go). Usage: mkfixture PATH-OR-DSN.
package main

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/stores/sqlmeta"

	_ "github.com/jackc/pgx/v5/stdlib"
)

func main() {
	ctx := context.Background()
	fc := clock.NewFake(time.Unix(1700000000, 0))
	s, err := sqlmeta.Open(os.Args[1], sqlmeta.Options{Clock: fc})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	must := func(err error) {
		if err != nil {
			log.Fatal(err)
		}
	}
	_, err = s.CreateTenant(ctx, meta.Tenant{ID: "acme", Name: "Acme Corp"})
	must(err)
	must(s.PutKey(ctx, meta.APIKey{Tenant: meta.DefaultTenant, Name: meta.OperatorKeyName, Hash: meta.HashKey("amber_operator"), Prefix: meta.KeyPrefix("amber_operator"), Scopes: meta.AllScopes}))
	_, err = s.CreateKey(ctx, meta.APIKey{Tenant: "acme", Name: "ci", Hash: meta.HashKey("amber_acme_ci"), Prefix: meta.KeyPrefix("amber_acme_ci"),
		Scopes: []meta.Scope{meta.ScopeRead, meta.ScopeWrite}, Expires: fc.Now().Add(365 * 24 * time.Hour)})
	must(err)
	must(s.SetTenantQuota(ctx, "acme", meta.TenantQuota{MaxSandboxes: 7, Budgets: map[string]float64{"cpu_seconds": 1000}}))
	must(s.SetTenantPolicy(ctx, "acme", meta.TenantPolicy{Recovery: "fast", KeepCheckpoints: 3, Egress: &meta.EgressPolicy{Allow: []string{"pypi.org:443"}}}))
	fc.Advance(time.Second)
	_, err = s.Insert(ctx, meta.Sandbox{ID: "sbx-fixture", Tenant: "acme", Template: "minimal", TemplateVersion: "v1", Driver: "gvisor",
		Limits: sandbox.Limits{MemoryBytes: 256 << 20, MilliCPUs: 500}, Env: []string{"A=1"}, State: meta.StateRunning, Policy: "fast", Node: "node-a"})
	must(err)
	_, err = s.Insert(ctx, meta.Sandbox{ID: "sbx-gone", Tenant: "acme", Template: "minimal", TemplateVersion: "v1", Driver: "criu", State: meta.StateRunning})
	must(err)
	_, err = s.SetState(ctx, "sbx-gone", meta.StateDestroyed, "rm")
	must(err)
	ck, err := s.InsertCheckpoint(ctx, meta.Checkpoint{ID: "ckpt-fixture", Tenant: "acme", SandboxID: "sbx-fixture", State: meta.CheckpointPending,
		Stream: "sandbox/sbx-fixture", Seq: 3, Driver: "gvisor", Template: "minimal", TemplateVersion: "v1", Tag: "golden"})
	must(err)
	ck.EventSeq, ck.ManifestDigest, ck.ImageDigest, ck.Stats.StoredBytes = 4, "sha256:manifest", "sha256:image", 4096
	_, err = s.CommitCheckpoint(ctx, ck)
	must(err)
	must(s.SetSandboxEgress(ctx, "sbx-fixture", &meta.EgressPolicy{Allow: []string{"example.com:443"}, Burst: 5}))
	must(s.SetEgressRun(ctx, "sbx-fixture", "run-1"))
	_, err = s.PutExposure(ctx, meta.Exposure{SandboxID: "sbx-fixture", Port: 8000, Tenant: "acme", TokenHash: meta.HashKey("port-token")})
	must(err)
	must(s.PutSecret(ctx, meta.SealedSecret{Tenant: "acme", Name: "api-token", Sealed: []byte{1, 2, 3}, Hosts: []string{"api.example.com:443"}}))
	_, _, err = s.InsertTenantCA(ctx, "acme", []byte("cert-pem"), []byte("sealed-key"))
	must(err)
	_, err = s.InsertSession(ctx, meta.Session{ID: "ses-fixture", Tenant: "acme", Definition: `{"model":"m"}`, Status: "idle", SandboxID: "sbx-fixture"})
	must(err)
	_, err = s.RegisterNode(ctx, meta.Node{ID: "node-a", Addr: "127.0.0.1:7070", Capacity: meta.NodeCapacity{MaxSandboxes: 10, Driver: "gvisor"}}, time.Minute)
	must(err)
	_, claimed, err := s.BeginIdempotent(ctx, "acme", "idem-1", "req-hash", time.Hour)
	must(err)
	if !claimed {
		log.Fatal("idempotency key not claimed")
	}
	must(s.FinishIdempotent(ctx, "acme", "idem-1", 201, "application/json", []byte(`{"id":"sbx-fixture"}`)))
}
