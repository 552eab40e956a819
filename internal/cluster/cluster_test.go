package cluster

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/stores/sqlmeta"
)

// pgStore opens a meta store in a fresh schema of the test PostgreSQL
// (make setup-test, or AMBER_TEST_PG), dropped when t ends.
func pgStore(t *testing.T) (metadata.Store, string) {
	t.Helper()
	dsn := os.Getenv("AMBER_TEST_PG")
	if dsn == "" {
		dsn = "postgres://amber:amber@127.0.0.1:5432/amber_test?sslmode=disable"
	}
	var b [6]byte
	rand.Read(b[:])
	schema := "cluster_t_" + hex.EncodeToString(b[:])
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(`CREATE SCHEMA ` + schema); err != nil {
		admin.Close()
		t.Fatalf("this test needs PostgreSQL (make setup-test, or AMBER_TEST_PG): %v", err)
	}
	t.Cleanup(func() {
		admin.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
		admin.Close()
	})
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	spec := dsn + sep + "search_path=" + schema
	s, err := sqlmeta.Open(spec, sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, spec
}

// TestLostNode: a node is judged gone before its lease expires only when
// its heartbeat is overdue and its liveness lock is free, and only by a
// node that has held its own lock for two heartbeats (after a database
// restart every lock is gone at once; nobody is claimed for a lock it had
// no time to take again).
func TestLostNode(t *testing.T) {
	ctx := context.Background()
	s, spec := pgStore(t)
	n := &Node{o: Options{Meta: s, Heartbeat: time.Second, Scan: 500 * time.Millisecond},
		lg: slog.New(slog.NewTextHandler(io.Discard, nil))}
	now := time.Now()
	n.locked.Store(true)
	n.lockedSince.Store(now.Add(-time.Minute).UnixNano())
	d := meta.Node{ID: "d-" + hex.EncodeToString([]byte(t.Name()))[:12], State: meta.NodeLive, Heartbeat: now.Add(-2 * time.Second)}

	if !n.lost(ctx, d, now) {
		t.Fatal("a node with an overdue heartbeat and a free lock is not lost")
	}
	fresh := d
	fresh.Heartbeat = now.Add(-time.Second)
	if n.lost(ctx, fresh, now) {
		t.Fatal("a node whose heartbeat is not overdue (1 s < heartbeat + scan) is lost")
	}
	n.lockedSince.Store(now.Add(-time.Second).UnixNano())
	if n.lost(ctx, d, now) {
		t.Fatal("judged by a node that took its own lock again 1 s ago (a database restart)")
	}
	// With the default lease and heartbeat (4 s, 500 ms), a heartbeat is
	// overdue 1 s after the last, and a judge must have held its own lock
	// for half the lease (2 s), not two heartbeats (1 s).
	def := &Node{o: Options{Meta: s, TTL: DefaultTTL, Heartbeat: DefaultTTL / 8, Scan: DefaultTTL / 8}, lg: n.lg}
	def.locked.Store(true)
	def.lockedSince.Store(now.Add(-time.Minute).UnixNano())
	late, early := d, d
	late.Heartbeat, early.Heartbeat = now.Add(-1100*time.Millisecond), now.Add(-900*time.Millisecond)
	if !def.lost(ctx, late, now) || def.lost(ctx, early, now) {
		t.Fatal("with the defaults, a free lock and a heartbeat 1.1 s old is lost, 0.9 s old is not")
	}
	def.lockedSince.Store(now.Add(-1500 * time.Millisecond).UnixNano())
	if def.lost(ctx, late, now) {
		t.Fatal("judged by a node that took its own lock again 1.5 s ago, under half the lease")
	}
	n.lockedSince.Store(now.Add(-time.Minute).UnixNano())
	n.locked.Store(false)
	if n.lost(ctx, d, now) {
		t.Fatal("judged by a node that does not hold its own lock")
	}
	n.locked.Store(true)
	// d's process holds its lock (its session is open): not lost, however
	// late its heartbeat (a paused process: the lease decides).
	other, err := sqlmeta.Open(spec, sqlmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	l := other.NodeLock(d.ID)
	if held, err := l.Ensure(ctx); !held || err != nil {
		t.Fatalf("take d's lock: %v %v", held, err)
	}
	if n.lost(ctx, d, now) {
		t.Fatal("a node whose lock is held is lost")
	}
	l.Release()
	if !n.lost(ctx, d, now) {
		t.Fatal("not lost once its lock is released")
	}
}
