package metatest

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/core/sandbox"
)

// testInsertGetList: rows survive a reopen; a duplicate id is refused;
// List filters by tenant and by pooled.
func testInsertGetList(t *testing.T, open Opener) {
	ctx := ctxT(t)
	s, err := open(clock.NewFake(epoch))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Insert(ctx, row("a", false)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Insert(ctx, row("a", false)); !errdefs.IsConflict(err) && !isAlreadyExists(err) {
		t.Fatalf("duplicate insert: %v", err)
	}
	if _, err := s.Insert(ctx, row("p", true)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Insert(ctx, metadata.Sandbox{ID: "x"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("insert without template, driver and state: %v", err)
	}
	s.Close()
	s = mustOpen(t, open, clock.Real{})
	got, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if got.Limits.MemoryBytes != 256<<20 || got.Env[0] != "A=1" || got.State != metadata.StateRunning || !got.Created.Equal(epoch) {
		t.Fatalf("round trip: %+v", got)
	}
	if _, err := s.Get(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("get missing: %v", err)
	}
	tenant, pooled := metadata.DefaultTenant, true
	if l, err := s.List(ctx, metadata.Filter{Tenant: &tenant}); err != nil || len(l) != 1 || l[0].ID != "a" {
		t.Fatalf("list by tenant: %+v %v", l, err)
	}
	if l, err := s.List(ctx, metadata.Filter{Pooled: &pooled}); err != nil || len(l) != 1 || l[0].ID != "p" {
		t.Fatalf("list pooled: %+v %v", l, err)
	}
}

// testSetStateIsConditional: SetState moves a row only from one of the
// states it names, else fails with ErrFailedPrecondition and the current
// row; destroyed rows stay, hidden from List unless asked for.
func testSetStateIsConditional(t *testing.T, open Opener) {
	ctx := ctxT(t)
	s := mustOpen(t, open, clock.NewFake(epoch))
	if _, err := s.Insert(ctx, row("a", false)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetState(ctx, "a", metadata.StateStopped, "killed", metadata.StateRunning); err != nil {
		t.Fatal(err)
	}
	cur, err := s.SetState(ctx, "a", metadata.StateCrashed, "lost", metadata.StateRunning)
	if errdefs.HTTPStatus(err) != 412 || cur.State != metadata.StateStopped {
		t.Fatalf("conditional set from wrong state: %v %+v", err, cur)
	}
	if _, err := s.SetState(ctx, "a", metadata.StateDestroyed, "rm"); err != nil {
		t.Fatal(err)
	}
	if l, err := s.List(ctx, metadata.Filter{}); err != nil || len(l) != 0 {
		t.Fatalf("destroyed row listed: %+v %v", l, err)
	}
	if l, err := s.List(ctx, metadata.Filter{States: []metadata.State{metadata.StateDestroyed}}); err != nil || len(l) != 1 || l[0].Reason != "rm" {
		t.Fatalf("destroyed rows: %+v %v", l, err)
	}
	if _, err := s.SetState(ctx, "nope", metadata.StateStopped, ""); !errdefs.IsNotFound(err) {
		t.Fatalf("set state of a missing row: %v", err)
	}

	// A restore in place: restoring, then running one generation on.
	if _, err := s.Insert(ctx, row("r", false)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Restored(ctx, "r", "ckpt-1"); err == nil {
		t.Fatal("Restored of a row that is not restoring")
	}
	if _, err := s.SetState(ctx, "r", metadata.StateRestoring, "", metadata.StateRunning); err != nil {
		t.Fatal(err)
	}
	got, err := s.Restored(ctx, "r", "ckpt-1")
	if err != nil || got.State != metadata.StateRunning || got.Generation != 1 || got.Origin != "ckpt-1" {
		t.Fatalf("restored: %+v %v", got, err)
	}
	if got, err := s.SetPolicy(ctx, "r", "fast"); err != nil || got.Policy != "fast" {
		t.Fatalf("set policy: %+v %v", got, err)
	}
}

// testClaimOnlyOnce: of concurrent claims of one pooled sandbox, one wins;
// the claimed row is the tenant's, from the pool, created at the claim.
func testClaimOnlyOnce(t *testing.T, open Opener) {
	ctx := ctxT(t)
	fc := clock.NewFake(epoch)
	s := mustOpen(t, open, fc)
	pooledAt, err := s.Insert(ctx, row("p", true))
	if err != nil {
		t.Fatal(err)
	}
	fc.Advance(time.Minute)
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Claim(ctx, "p", metadata.DefaultTenant, sandbox.Limits{}, []string{"X=1"}); err == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			} else if errdefs.HTTPStatus(err) != 412 {
				t.Errorf("losing claim: %v", err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("%d claims won", wins)
	}
	got, err := s.Get(ctx, "p")
	if err != nil || got.Pooled || !got.FromPool || got.Tenant != metadata.DefaultTenant || got.Env[0] != "X=1" || !got.Created.Equal(pooledAt.Created.Add(time.Minute)) {
		t.Fatalf("claimed row: %+v %v", got, err)
	}
}

// testCheckpointUploadPending: a checkpoint committed locally keeps its
// mark and hot digest across a reopen until FinishUpload clears it, once;
// one that failed keeps the mark.
func testCheckpointUploadPending(t *testing.T, open Opener) {
	ctx := ctxT(t)
	s := mustOpen(t, open, clock.NewFake(epoch))
	if _, err := s.Insert(ctx, row("sbx-1", false)); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"ckpt-1", "ckpt-2", "ckpt-3"} {
		if _, err := s.InsertCheckpoint(ctx, metadata.Checkpoint{ID: id, Tenant: metadata.DefaultTenant, SandboxID: "sbx-1", State: metadata.CheckpointPending,
			Stream: "sandbox/sbx-1", Seq: 3, Driver: "gvisor", Template: "minimal", TemplateVersion: "v1"}); err != nil {
			t.Fatal(err)
		}
	}
	// ckpt-3 is committed the usual way: FinishUpload refuses it.
	if _, err := s.CommitCheckpoint(ctx, metadata.Checkpoint{ID: "ckpt-3", EventSeq: 6, ManifestDigest: "m3"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FinishUpload(ctx, metadata.Checkpoint{ID: "ckpt-3", ManifestDigest: "x"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("finish upload of a checkpoint not pending upload: %v", err)
	}
	for _, id := range []string{"ckpt-1", "ckpt-2"} {
		if _, err := s.FinishUpload(ctx, metadata.Checkpoint{ID: id}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("finish upload of a pending checkpoint: %v", err)
		}
		ck, err := s.CommitCheckpoint(ctx, metadata.Checkpoint{ID: id, EventSeq: 4, UploadPending: true, HotDigest: "sha256:hot-" + id})
		if err != nil || ck.State != metadata.CheckpointCommitted || !ck.UploadPending || ck.HotDigest != "sha256:hot-"+id || ck.ManifestDigest != "" {
			t.Fatalf("local commit: %+v %v", ck, err)
		}
	}
	if _, err := s.SetCheckpointState(ctx, "ckpt-2", metadata.CheckpointFailed, "hot copy lost", metadata.CheckpointCommitted); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = mustOpen(t, open, clock.NewFake(epoch))
	if got, err := s.Checkpoint(ctx, "ckpt-1"); err != nil || !got.UploadPending || got.HotDigest != "sha256:hot-ckpt-1" || got.EventSeq != 4 {
		t.Fatalf("after reopen: %+v %v", got, err)
	}
	if got, err := s.Checkpoint(ctx, "ckpt-2"); err != nil || got.State != metadata.CheckpointFailed || !got.UploadPending {
		t.Fatalf("failed before its upload: %+v %v", got, err)
	}
	if _, err := s.FinishUpload(ctx, metadata.Checkpoint{ID: "ckpt-2", ManifestDigest: "m"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("finish upload of a failed checkpoint: %v", err)
	}
	ck, err := s.FinishUpload(ctx, metadata.Checkpoint{ID: "ckpt-1", ManifestDigest: "m1", ImageDigest: "sha256:i1", Stats: metadata.CheckpointStats{StoredBytes: 77}})
	if err != nil || ck.UploadPending || ck.ManifestDigest != "m1" || ck.ImageDigest != "sha256:i1" || ck.Stats.StoredBytes != 77 ||
		ck.HotDigest != "sha256:hot-ckpt-1" || ck.EventSeq != 4 || ck.State != metadata.CheckpointCommitted {
		t.Fatalf("finish upload: %+v %v", ck, err)
	}
	if _, err := s.FinishUpload(ctx, ck); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("upload finished twice: %v", err)
	}
}

// testStatementsRoundTrip runs checkpoints, idempotency, quotas, secrets,
// egress and ports through their conditional paths.
func testStatementsRoundTrip(t *testing.T, open Opener) {
	ctx := ctxT(t)
	s := mustOpen(t, open, clock.NewFake(epoch))
	if _, err := s.Insert(ctx, row("sbx-1", false)); err != nil {
		t.Fatal(err)
	}
	ck, err := s.InsertCheckpoint(ctx, metadata.Checkpoint{ID: "ckpt-1", Tenant: metadata.DefaultTenant, SandboxID: "sbx-1", State: metadata.CheckpointPending,
		Stream: "sandbox/sbx-1", Seq: 3, Driver: "gvisor", Template: "minimal", TemplateVersion: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.InsertCheckpoint(ctx, ck); !errdefs.IsConflict(err) && !isAlreadyExists(err) {
		t.Fatalf("duplicate checkpoint: %v", err)
	}
	ck.Stats.StoredBytes, ck.EventSeq, ck.ManifestDigest = 1234, 4, "sha256:m"
	if ck, err = s.CommitCheckpoint(ctx, ck); err != nil || ck.State != metadata.CheckpointCommitted || ck.Stats.StoredBytes != 1234 {
		t.Fatalf("commit: %+v %v", ck, err)
	}
	if _, err := s.CommitCheckpoint(ctx, ck); err == nil {
		t.Fatal("a committed checkpoint committed again")
	}
	if n, err := s.CheckpointBytes(ctx, metadata.DefaultTenant); err != nil || n != 1234 {
		t.Fatalf("checkpoint bytes: %d %v", n, err)
	}
	if l, err := s.Checkpoints(ctx, metadata.CheckpointFilter{SandboxID: "sbx-1", States: []metadata.CheckpointState{metadata.CheckpointCommitted}}); err != nil || len(l) != 1 {
		t.Fatalf("checkpoints: %+v %v", l, err)
	}
	if got, err := s.Checkpoint(ctx, "ckpt-1"); err != nil || got.EventSeq != 4 || got.ManifestDigest != "sha256:m" {
		t.Fatalf("checkpoint: %+v %v", got, err)
	}
	if _, err := s.Checkpoint(ctx, "ckpt-nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("missing checkpoint: %v", err)
	}
	if got, err := s.SetCheckpointState(ctx, "ckpt-1", metadata.CheckpointDeleted, "rm", metadata.CheckpointCommitted); err != nil || got.State != metadata.CheckpointDeleted {
		t.Fatalf("delete checkpoint: %+v %v", got, err)
	}
	if _, err := s.SetCheckpointState(ctx, "ckpt-1", metadata.CheckpointFailed, "", metadata.CheckpointPending); err == nil {
		t.Fatal("checkpoint state moved from a state it is not in")
	}

	e, claimed, err := s.BeginIdempotent(ctx, metadata.DefaultTenant, "k1", "h1", time.Hour)
	if err != nil || !claimed {
		t.Fatalf("first claim: %+v %v %v", e, claimed, err)
	}
	if _, claimed, err = s.BeginIdempotent(ctx, metadata.DefaultTenant, "k1", "h1", time.Hour); err != nil || claimed {
		t.Fatalf("second claim: %v %v", claimed, err)
	}
	if err := s.FinishIdempotent(ctx, metadata.DefaultTenant, "k1", 201, "application/json", []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if e, claimed, err = s.BeginIdempotent(ctx, metadata.DefaultTenant, "k1", "h1", 0); err != nil || claimed || !e.Done || e.Status != 201 || string(e.Body) != `{"a":1}` {
		t.Fatalf("after finish: %+v %v %v", e, claimed, err)
	}
	if _, claimed, err = s.BeginIdempotent(ctx, metadata.DefaultTenant, "k2", "h2", time.Hour); err != nil || !claimed {
		t.Fatalf("claim k2: %v %v", claimed, err)
	}
	if err := s.AbandonIdempotent(ctx, metadata.DefaultTenant, "k2"); err != nil {
		t.Fatal(err)
	}
	if _, claimed, err = s.BeginIdempotent(ctx, metadata.DefaultTenant, "k2", "h2", time.Hour); err != nil || !claimed {
		t.Fatalf("claim k2 after abandon: %v %v", claimed, err)
	}

	if err := s.SetTenantQuota(ctx, metadata.DefaultTenant, metadata.TenantQuota{MaxSandboxes: 3}); err != nil {
		t.Fatal(err)
	}
	if q, err := s.TenantQuota(ctx, metadata.DefaultTenant); err != nil || q.MaxSandboxes != 3 {
		t.Fatalf("quota: %+v %v", q, err)
	}
	if err := s.SetTenantPolicy(ctx, metadata.DefaultTenant, metadata.TenantPolicy{Recovery: "fast", KeepCheckpoints: 5}); err != nil {
		t.Fatal(err)
	}
	if p, err := s.TenantPolicy(ctx, metadata.DefaultTenant); err != nil || p.Recovery != "fast" || p.KeepCheckpoints != 5 {
		t.Fatalf("policy: %+v %v", p, err)
	}
	if err := s.PutSecret(ctx, metadata.SealedSecret{Tenant: metadata.DefaultTenant, Name: "s", Sealed: []byte{0, 1, 2}, Hosts: []string{"a:443"}}); err != nil {
		t.Fatal(err)
	}
	if x, err := s.GetSecret(ctx, metadata.DefaultTenant, "s"); err != nil || len(x.Sealed) != 3 || x.Sealed[2] != 2 || x.Hosts[0] != "a:443" {
		t.Fatalf("secret: %+v %v", x, err)
	}
	if l, err := s.ListSecrets(ctx, metadata.DefaultTenant); err != nil || len(l) != 1 || l[0].Name != "s" {
		t.Fatalf("secrets: %+v %v", l, err)
	}
	if err := s.DeleteSecret(ctx, metadata.DefaultTenant, "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSecret(ctx, metadata.DefaultTenant, "s"); !errdefs.IsNotFound(err) {
		t.Fatalf("deleted secret: %v", err)
	}
	if _, _, err := s.TenantCA(ctx, metadata.DefaultTenant); !errdefs.IsNotFound(err) {
		t.Fatalf("CA before any: %v", err)
	}
	if c, k, err := s.InsertTenantCA(ctx, metadata.DefaultTenant, []byte("cert"), []byte("key")); err != nil || string(c) != "cert" || string(k) != "key" {
		t.Fatalf("tenant CA: %q %q %v", c, k, err)
	}
	if c, _, err := s.InsertTenantCA(ctx, metadata.DefaultTenant, []byte("other"), []byte("other")); err != nil || string(c) != "cert" {
		t.Fatalf("second tenant CA must keep the first: %q %v", c, err)
	}
	if err := s.SetEgressRun(ctx, "sbx-1", "run-1"); err != nil {
		t.Fatal(err)
	}
	if p, run, err := s.SandboxEgress(ctx, "sbx-1"); err != nil || run != "run-1" || p != nil {
		t.Fatalf("egress run: %+v %q %v", p, run, err)
	}
	if err := s.SetSandboxEgress(ctx, "sbx-1", &metadata.EgressPolicy{Allow: []string{"example.com:443"}}); err != nil {
		t.Fatal(err)
	}
	if p, run, err := s.SandboxEgress(ctx, "sbx-1"); err != nil || run != "run-1" || p == nil || p.Allow[0] != "example.com:443" {
		t.Fatalf("egress policy: %+v %q %v", p, run, err)
	}
	hash := strings.Repeat("ab", 32)
	if _, err := s.PutExposure(ctx, metadata.Exposure{SandboxID: "sbx-1", Port: 8000, Tenant: metadata.DefaultTenant, TokenHash: hash}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ExposureByToken(ctx, "sbx-1", 8000, hash); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ExposureByToken(ctx, "sbx-1", 8000, strings.Repeat("cd", 32)); !errdefs.IsNotFound(err) {
		t.Fatalf("exposure by a wrong token: %v", err)
	}
	if l, err := s.Exposures(ctx, "sbx-1"); err != nil || len(l) != 1 || l[0].Port != 8000 {
		t.Fatalf("exposures: %+v %v", l, err)
	}
	if err := s.DeleteExposure(ctx, "sbx-1", 8000); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteExposure(ctx, "sbx-1", 8000); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := s.Exposure(ctx, "sbx-1", 8000); !errdefs.IsNotFound(err) {
		t.Fatalf("deleted exposure: %v", err)
	}
	if err := s.DeleteExposures(ctx, "sbx-1"); err != nil {
		t.Fatal(err)
	}
	pooled := true
	if l, err := s.List(ctx, metadata.Filter{Pooled: &pooled}); err != nil || len(l) != 0 {
		t.Fatalf("pooled rows: %+v %v", l, err)
	}
}

// testMetadataAndExpiry: a sandbox's metadata and deadline survive a
// reopen; List selects by every pair of Filter.Metadata and by
// ExpiredBy; SetExpiry with the zero time clears the deadline.
func testMetadataAndExpiry(t *testing.T, open Opener) {
	ctx := ctxT(t)
	s, err := open(clock.NewFake(epoch))
	if err != nil {
		t.Fatal(err)
	}
	a := row("a", false)
	a.Metadata = map[string]string{"team": "red", "job": "1"}
	a.Expires, a.OnExpire = epoch.Add(time.Minute), metadata.ExpirePause
	if _, err := s.Insert(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Insert(ctx, row("b", false)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetMetadata(ctx, "b", map[string]string{"team": "blue"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetExpiry(ctx, "b", epoch.Add(time.Hour), metadata.ExpireKill); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = mustOpen(t, open, clock.Real{})
	got, err := s.Get(ctx, "a")
	if err != nil || got.Metadata["team"] != "red" || got.Metadata["job"] != "1" || len(got.Metadata) != 2 ||
		!got.Expires.Equal(epoch.Add(time.Minute)) || got.OnExpire != metadata.ExpirePause {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	ids := func(f metadata.Filter) string {
		t.Helper()
		l, err := s.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, sb := range l {
			out = append(out, sb.ID)
		}
		return strings.Join(out, ",")
	}
	for _, c := range []struct {
		f    metadata.Filter
		want string
	}{
		{metadata.Filter{Metadata: map[string]string{"team": "red"}}, "a"},
		{metadata.Filter{Metadata: map[string]string{"team": "blue"}}, "b"},
		{metadata.Filter{Metadata: map[string]string{"team": "red", "job": "2"}}, ""},
		{metadata.Filter{Metadata: map[string]string{}}, "a,b"},
		{metadata.Filter{ExpiredBy: epoch.Add(time.Minute)}, "a"},
		{metadata.Filter{ExpiredBy: epoch.Add(time.Minute - 1)}, ""},
		{metadata.Filter{ExpiredBy: epoch.Add(2 * time.Hour)}, "a,b"},
	} {
		if got := ids(c.f); got != c.want {
			t.Errorf("list %+v: %q, want %q", c.f, got, c.want)
		}
	}
	if got, err = s.SetExpiry(ctx, "a", time.Time{}, ""); err != nil || !got.Expires.IsZero() || got.OnExpire != "" {
		t.Fatalf("cleared deadline: %+v %v", got, err)
	}
	if got := ids(metadata.Filter{ExpiredBy: epoch.Add(2 * time.Hour)}); got != "b" {
		t.Fatalf("expired after clearing a's deadline: %q", got)
	}
	if _, err := s.SetExpiry(ctx, "nope", epoch, ""); err == nil {
		t.Fatal("SetExpiry of a missing sandbox succeeded")
	}
}
