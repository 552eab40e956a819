package sqlmeta

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
)

// The package's tests run twice: on SQLite, then on PostgreSQL (the
// database `make setup-test` starts, or AMBER_TEST_PG), each PostgreSQL
// test in a schema of its own. -meta.backend=sqlite|postgres runs one.
var backendFlag = flag.String("meta.backend", "", "run the tests on this backend only (sqlite or postgres)")

// backend is the backend of the current run.
var backend = "sqlite"

func TestMain(m *testing.M) {
	flag.Parse()
	code := 0
	for _, b := range []string{"sqlite", "postgres"} {
		if *backendFlag != "" && *backendFlag != b {
			continue
		}
		backend = b
		fmt.Fprintf(os.Stderr, "=== meta tests on %s\n", b)
		if c := m.Run(); c != 0 {
			code = c
		}
	}
	os.Exit(code)
}

func testPGDSN() string {
	if dsn := os.Getenv("AMBER_TEST_PG"); dsn != "" {
		return dsn
	}
	return "postgres://amber:amber@127.0.0.1:5432/amber_test?sslmode=disable"
}

// newSpec returns where a fresh store lives on the current backend: a
// SQLite file in t's temp dir, or a PostgreSQL schema of its own (dropped
// when t ends) named in the DSN's search_path.
func newSpec(t *testing.T) string {
	t.Helper()
	if backend == "sqlite" {
		return filepath.Join(t.TempDir(), "meta.db")
	}
	var b [6]byte
	rand.Read(b[:])
	schema := "meta_t_" + hex.EncodeToString(b[:])
	admin, err := sql.Open("pgx", testPGDSN())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(`CREATE SCHEMA ` + schema); err != nil {
		admin.Close()
		t.Fatalf("the meta tests need PostgreSQL (run `make setup-test`, or set AMBER_TEST_PG): %v", err)
	}
	t.Cleanup(func() {
		admin.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
		admin.Close()
	})
	sep := "?"
	if strings.Contains(testPGDSN(), "?") {
		sep = "&"
	}
	return testPGDSN() + sep + "search_path=" + schema
}

// onlySQLite skips t on PostgreSQL (SQLite files and their migrations).
func onlySQLite(t *testing.T) {
	if backend != "sqlite" {
		t.Skip("SQLite only")
	}
}

// TestStatementsRoundTrip runs the statements the other tests do not
// (checkpoints, idempotency, quotas, secrets, egress, ports) on the
// backend, through their conditional paths.
func TestStatementsRoundTrip(t *testing.T) {
	ctx := context.Background()
	s, _ := open(t)
	if _, err := s.Insert(ctx, row("sbx-1", false)); err != nil {
		t.Fatal(err)
	}
	ck, err := s.InsertCheckpoint(ctx, Checkpoint{ID: "ckpt-1", Tenant: "default", SandboxID: "sbx-1", State: CheckpointPending,
		Stream: "sandbox/sbx-1", Seq: 3, Driver: "gvisor", Template: "minimal", TemplateVersion: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.InsertCheckpoint(ctx, ck); !errdefs.IsConflict(err) && !isAlreadyExists(err) {
		t.Fatalf("duplicate checkpoint: %v", err)
	}
	ck.Stats.StoredBytes, ck.EventSeq, ck.ManifestDigest = 1234, 4, "sha256:m"
	if ck, err = s.CommitCheckpoint(ctx, ck); err != nil || ck.State != CheckpointCommitted || ck.Stats.StoredBytes != 1234 {
		t.Fatalf("commit: %+v %v", ck, err)
	}
	if _, err := s.CommitCheckpoint(ctx, ck); err == nil {
		t.Fatal("a committed checkpoint committed again")
	}
	if n, err := s.CheckpointBytes(ctx, "default"); err != nil || n != 1234 {
		t.Fatalf("checkpoint bytes: %d %v", n, err)
	}
	if l, err := s.Checkpoints(ctx, CheckpointFilter{SandboxID: "sbx-1", States: []CheckpointState{CheckpointCommitted}}); err != nil || len(l) != 1 {
		t.Fatalf("checkpoints: %+v %v", l, err)
	}

	e, claimed, err := s.BeginIdempotent(ctx, "default", "k1", "h1", time.Hour)
	if err != nil || !claimed {
		t.Fatalf("first claim: %+v %v %v", e, claimed, err)
	}
	if _, claimed, err = s.BeginIdempotent(ctx, "default", "k1", "h1", time.Hour); err != nil || claimed {
		t.Fatalf("second claim: %v %v", claimed, err)
	}
	if err := s.FinishIdempotent(ctx, "default", "k1", 201, "application/json", []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if e, claimed, err = s.BeginIdempotent(ctx, "default", "k1", "h1", 0); err != nil || claimed || !e.Done || e.Status != 201 || string(e.Body) != `{"a":1}` {
		t.Fatalf("after finish: %+v %v %v", e, claimed, err)
	}

	if err := s.SetTenantQuota(ctx, "default", TenantQuota{MaxSandboxes: 3}); err != nil {
		t.Fatal(err)
	}
	if q, err := s.TenantQuota(ctx, "default"); err != nil || q.MaxSandboxes != 3 {
		t.Fatalf("quota: %+v %v", q, err)
	}
	if err := s.PutSecret(ctx, SealedSecret{Tenant: "default", Name: "s", Sealed: []byte{0, 1, 2}, Hosts: []string{"a:443"}}); err != nil {
		t.Fatal(err)
	}
	if x, err := s.GetSecret(ctx, "default", "s"); err != nil || len(x.Sealed) != 3 || x.Sealed[2] != 2 {
		t.Fatalf("secret: %+v %v", x, err)
	}
	if c, k, err := s.InsertTenantCA(ctx, "default", []byte("cert"), []byte("key")); err != nil || string(c) != "cert" || string(k) != "key" {
		t.Fatalf("tenant CA: %q %q %v", c, k, err)
	}
	if c, _, err := s.InsertTenantCA(ctx, "default", []byte("other"), []byte("other")); err != nil || string(c) != "cert" {
		t.Fatalf("second tenant CA must keep the first: %q %v", c, err)
	}
	if err := s.SetEgressRun(ctx, "sbx-1", "run-1"); err != nil {
		t.Fatal(err)
	}
	if _, run, err := s.SandboxEgress(ctx, "sbx-1"); err != nil || run != "run-1" {
		t.Fatalf("egress run: %q %v", run, err)
	}
	hash := strings.Repeat("ab", 32)
	if _, err := s.PutExposure(ctx, Exposure{SandboxID: "sbx-1", Port: 8000, Tenant: "default", TokenHash: hash}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ExposureByToken(ctx, "sbx-1", 8000, hash); err != nil {
		t.Fatal(err)
	}
	pooled := true
	if l, err := s.List(ctx, Filter{Pooled: &pooled}); err != nil || len(l) != 0 {
		t.Fatalf("pooled rows: %+v %v", l, err)
	}
}

// TestNodeLeases: a node registers with epoch 1, cannot register twice
// while live, heartbeats at its epoch; once its lease expired exactly one
// of two claimers wins it, its heartbeat is then fenced, and it registers
// again one epoch on. Sandbox rows move between nodes only from their
// current node.
func TestNodeLeases(t *testing.T) {
	ctx := context.Background()
	fc := clock.NewFake(time.Unix(1700000000, 0))
	s, err := Open(newSpec(t), Options{Clock: fc})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n, err := s.RegisterNode(ctx, Node{ID: "n1", Addr: "127.0.0.1:1"}, 5*time.Second)
	if err != nil || n.Epoch != 1 || n.State != NodeLive || !n.Alive(fc.Now()) {
		t.Fatalf("register: %+v %v", n, err)
	}
	if _, err := s.RegisterNode(ctx, Node{ID: "n1"}, 5*time.Second); !errdefs.IsConflict(err) {
		t.Fatalf("second registration while live: %v", err)
	}
	fc.Advance(3 * time.Second)
	if err := s.HeartbeatNode(ctx, "n1", 1, 5*time.Second, NodeCapacity{Sandboxes: 2}); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.ClaimDeadNode(ctx, "n1", 1, "n2"); err != nil || ok {
		t.Fatalf("claimed a live node: %v %v", ok, err)
	}
	fc.Advance(6 * time.Second)
	got := 0
	for _, by := range []string{"n2", "n3"} {
		ok, err := s.ClaimDeadNode(ctx, "n1", 1, by)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got++
		}
	}
	if got != 1 {
		t.Fatalf("%d claims of a dead node won, want 1", got)
	}
	if err := s.HeartbeatNode(ctx, "n1", 1, 5*time.Second, NodeCapacity{}); !errdefs.IsFenced(err) {
		t.Fatalf("heartbeat of a claimed node: %v", err)
	}
	if n, err = s.RegisterNode(ctx, Node{ID: "n1", Addr: "127.0.0.1:1"}, 5*time.Second); err != nil || n.Epoch != 2 || n.TakenBy != "" {
		t.Fatalf("register again: %+v %v", n, err)
	}
	sb := row("sbx-m", false)
	sb.Node = "n1"
	if _, err := s.Insert(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if got, err := s.MoveSandbox(ctx, "sbx-m", "n1", "n2"); err != nil || got.Node != "n2" {
		t.Fatalf("move: %+v %v", got, err)
	}
	if _, err := s.MoveSandbox(ctx, "sbx-m", "n1", "n3"); !errdefs.IsFenced(err) {
		t.Fatalf("second move from n1: %v", err)
	}
	on := "n2"
	if l, err := s.List(ctx, Filter{Node: &on}); err != nil || len(l) != 1 {
		t.Fatalf("n2's rows: %+v %v", l, err)
	}
	if l, err := s.ListNodes(ctx); err != nil || len(l) != 1 || l[0].Capacity.Sandboxes != 0 {
		t.Fatalf("nodes: %+v %v", l, err)
	}
}

// TestNodeLivenessLock: a node's liveness lock is held while the store
// that took it is open, by one store at a time, and free once that store's
// connection is gone (its process died) or released; a node is claimed
// before its lease expires only with the heartbeat the claimer saw. On
// SQLite there is no lock and no early claim.
func TestNodeLivenessLock(t *testing.T) {
	ctx := context.Background()
	spec := newSpec(t)
	s, err := Open(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id := "node-lock-" + fmt.Sprint(time.Now().UnixNano())
	if backend == "sqlite" {
		if held, err := s.NodeLock(id).Ensure(ctx); held || err != nil {
			t.Fatalf("sqlite: lock held %v, %v", held, err)
		}
		if _, supported, _ := s.NodeLockHeld(ctx, id); supported {
			t.Fatal("sqlite reports a liveness lock")
		}
		if _, err := s.ClaimLostNode(ctx, id, 1, time.Now(), "x"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("sqlite: claim lost node: %v", err)
		}
		return
	}
	heldBy := func(s *Store) bool {
		t.Helper()
		held, supported, err := s.NodeLockHeld(ctx, id)
		if err != nil || !supported {
			t.Fatalf("lock held? %v %v", supported, err)
		}
		return held
	}
	if heldBy(s) {
		t.Fatal("lock held before anyone took it")
	}
	// Another process of the node: a second store on the same schema,
	// whose session is then ended without a release (as the server ends a
	// killed process's session when its connection closes).
	other, err := Open(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if held, err := other.NodeLock(id).Ensure(ctx); !held || err != nil {
		t.Fatalf("first take: %v %v", held, err)
	}
	if !heldBy(s) {
		t.Fatal("lock taken, but not seen held")
	}
	mine := s.NodeLock(id)
	if held, err := mine.Ensure(ctx); held || err != nil {
		t.Fatalf("a second holder took the lock: %v %v", held, err)
	}
	var ended bool
	if err := s.db.DB.QueryRowContext(ctx, `SELECT bool_and(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2 AND granted`,
		uint32(nodeLockClass), uint32(nodeLockKey(s.db.scope, id))).Scan(&ended); err != nil || !ended {
		t.Fatalf("end the holder's session: %v %v", ended, err)
	}
	free := false
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if free = !heldBy(s); free {
			break
		}
	}
	if !free {
		t.Fatal("the lock outlived its holder's connection")
	}
	if held, err := mine.Ensure(ctx); !held || err != nil {
		t.Fatalf("take after the holder died: %v %v", held, err)
	}
	if held, err := mine.Ensure(ctx); !held || err != nil {
		t.Fatalf("check of a held lock: %v %v", held, err)
	}
	// Another schema (another deployment) does not see this one's lock.
	if s2, err := Open(newSpec(t), Options{}); err != nil {
		t.Fatal(err)
	} else {
		held, _, err := s2.NodeLockHeld(ctx, id)
		s2.Close()
		if held || err != nil {
			t.Fatalf("another schema sees the lock: %v %v", held, err)
		}
	}
	mine.Release()
	if heldBy(s) {
		t.Fatal("lock held after Release")
	}

	// Claims before the lease expires go by the heartbeat the claimer saw.
	n, err := s.RegisterNode(ctx, Node{ID: id, Addr: "127.0.0.1:1"}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.ClaimLostNode(ctx, id, n.Epoch, n.Heartbeat.Add(-time.Second), "n2"); err != nil || ok {
		t.Fatalf("claimed with a heartbeat the row no longer has: %v %v", ok, err)
	}
	got := 0
	for _, by := range []string{"n2", "n3"} {
		if ok, err := s.ClaimLostNode(ctx, id, n.Epoch, n.Heartbeat, by); err != nil {
			t.Fatal(err)
		} else if ok {
			got++
		}
	}
	if got != 1 {
		t.Fatalf("%d claims of a lost node won, want 1", got)
	}
	if err := s.HeartbeatNode(ctx, id, n.Epoch, time.Minute, NodeCapacity{}); !errdefs.IsFenced(err) {
		t.Fatalf("heartbeat of a claimed node: %v", err)
	}
}

// TestFailoverPlan: assignments of a dead node's sandboxes are pending
// while the sandbox is still on the dead node (and not destroyed), move to
// another target only from the target they have (one of two reassigners
// wins), and are dropped once done.
func TestFailoverPlan(t *testing.T) {
	ctx := context.Background()
	s, err := Open(newSpec(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, id := range []string{"sbx-f1", "sbx-f2", "sbx-f3"} {
		sb := row(id, false)
		sb.Node = "dead"
		if _, err := s.Insert(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	// claim registers node id with a lease that has already run out and
	// claims it for by with plan.
	claim := func(id, by string, plan ...FailoverAssignment) bool {
		t.Helper()
		n, err := s.RegisterNode(ctx, Node{ID: id, Addr: "127.0.0.1:1"}, time.Nanosecond)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
		ok, err := s.ClaimDeadNode(ctx, id, n.Epoch, by, plan...)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	plan := []FailoverAssignment{{SandboxID: "sbx-f1", DeadNode: "dead", Target: "n1"}, {SandboxID: "sbx-f2", DeadNode: "dead", Target: "n2"}, {SandboxID: "sbx-f3", DeadNode: "dead", Target: "n2"}}
	if !claim("dead", "n1", plan...) {
		t.Fatal("claim of a dead node with a plan lost")
	}
	pending := func() []FailoverAssignment {
		t.Helper()
		p, err := s.PendingFailovers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if got := pending(); !slices.Equal(got, plan) {
		t.Fatalf("pending: %+v, want %+v", got, plan)
	}
	// n2 is down: two nodes race to take sbx-f2 over; one wins.
	wins := 0
	for _, to := range []string{"n1", "n3"} {
		if ok, err := s.ReassignFailover(ctx, plan[1], to); err != nil {
			t.Fatal(err)
		} else if ok {
			wins++
		}
	}
	if got := pending(); wins != 1 || got[1].Target != "n1" {
		t.Fatalf("reassign: %d wins, pending %+v", wins, got)
	}
	// sbx-f1 taken over (its row moved), sbx-f3 destroyed: not pending.
	if _, err := s.MoveSandbox(ctx, "sbx-f1", "dead", "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetState(ctx, "sbx-f3", StateDestroyed, "test"); err != nil {
		t.Fatal(err)
	}
	if got := pending(); len(got) != 1 || got[0].SandboxID != "sbx-f2" {
		t.Fatalf("pending after one takeover and one destroy: %+v", got)
	}
	if err := s.DropDoneFailovers(ctx); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := s.db.QueryRow(`SELECT COUNT(*) FROM failover_plan`).Scan(&left); err != nil || left != 1 {
		t.Fatalf("plan rows after dropping the done ones: %d %v", left, err)
	}

	// A claim records its plan with it; a losing claim records nothing.
	sb := row("sbx-f4", false)
	sb.Node = "gone"
	if _, err := s.Insert(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if !claim("gone", "n1", FailoverAssignment{SandboxID: "sbx-f4", DeadNode: "gone", Target: "n3"}) {
		t.Fatal("claim with a plan lost")
	}
	g, err := s.GetNode(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.ClaimDeadNode(ctx, "gone", g.Epoch, "n2", FailoverAssignment{SandboxID: "sbx-f4", DeadNode: "gone", Target: "n2"}); err != nil || ok {
		t.Fatalf("second claim: %v %v", ok, err)
	}
	if got := pending(); len(got) != 2 || got[1] != (FailoverAssignment{SandboxID: "sbx-f4", DeadNode: "gone", Target: "n3"}) {
		t.Fatalf("pending after a claim with a plan and a losing one: %+v", got)
	}
}

// TestDrainedNodeStaysDrained: a node drained and then stopped (cleanly
// or not) registers draining when it starts again; once undrained (live)
// it registers live.
func TestDrainedNodeStaysDrained(t *testing.T) {
	ctx := context.Background()
	fc := clock.NewFake(time.Unix(1700000000, 0))
	s, err := Open(newSpec(t), Options{Clock: fc})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n, err := s.RegisterNode(ctx, Node{ID: "c1", Addr: "127.0.0.1:1"}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetNodeState(ctx, "c1", n.Epoch, NodeDraining); err != nil {
		t.Fatal(err)
	}
	if err := s.SetNodeState(ctx, "c1", n.Epoch, NodeLeft); err != nil {
		t.Fatal(err)
	}
	if n, err = s.RegisterNode(ctx, Node{ID: "c1", Addr: "127.0.0.1:1"}, 5*time.Second); err != nil || n.State != NodeDraining {
		t.Fatalf("a drained node started again after a clean stop: %+v %v (want draining)", n, err)
	}
	// Crashed while draining (lease expired, claimed): still draining.
	fc.Advance(6 * time.Second)
	if ok, err := s.ClaimDeadNode(ctx, "c1", n.Epoch, "c2"); err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	if n, err = s.RegisterNode(ctx, Node{ID: "c1", Addr: "127.0.0.1:1"}, 5*time.Second); err != nil || n.State != NodeDraining {
		t.Fatalf("a drained node started again after a takeover: %+v %v (want draining)", n, err)
	}
	if err := s.SetNodeState(ctx, "c1", n.Epoch, NodeLive); err != nil {
		t.Fatal(err)
	}
	if err := s.SetNodeState(ctx, "c1", n.Epoch, NodeLeft); err != nil {
		t.Fatal(err)
	}
	if n, err = s.RegisterNode(ctx, Node{ID: "c1", Addr: "127.0.0.1:1"}, 5*time.Second); err != nil || n.State != NodeLive {
		t.Fatalf("an undrained node started again: %+v %v (want live)", n, err)
	}
}
