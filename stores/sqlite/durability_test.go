package sqlite

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/amber-run/amber/core/clock"
)

// TestDurabilitySettings asserts what makes an acknowledged append survive
// power loss, read back from the database: WAL journaling and
// synchronous=FULL (2) on the connection that commits appends. SIGKILL
// (TestCrash) cannot show this: the page cache survives a killed process.
func TestDurabilitySettings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.db")
	s := openTest(t, path, clock.Real{})
	got, err := s.Durability(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"journal_mode": "wal", "synchronous": "2", "wal_autocheckpoint": "0", "foreign_keys": "1"}
	if runtime.GOOS == "linux" {
		want["fdatasync"] = "true"
	}
	for k, want := range want {
		if got[k] != want {
			t.Errorf("%s = %q, want %q (all: %v)", k, got[k], want, got)
		}
	}
	// The settings hold after a reopen of an existing file, too.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, path, clock.Real{})
	if got, err := s.Durability(t.Context()); err != nil || got["journal_mode"] != "wal" || got["synchronous"] != "2" {
		t.Fatalf("after reopen: %v, %v", got, err)
	}
}

// TestOpenErrors: a path that cannot hold a database fails Open cleanly.
func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	notDB := filepath.Join(dir, "not.db")
	if err := os.WriteFile(notDB, []byte("this is not a database, just some text long enough to look like a header........................................"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "missing", "x.db"), notDB, dir} {
		if s, err := Open(p, Options{}); err == nil {
			s.Close()
			t.Errorf("Open(%s) succeeded", p)
		}
	}
}

// TestMigrateIdempotent: migrating an up-to-date schema changes nothing,
// and a schema newer than the binary is refused.
func TestMigrateIdempotent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	if err := openTest(t, path, clock.Real{}).Close(); err != nil {
		t.Fatal(err)
	}
	db := rawDB(t, &Store{path: path})
	for range 2 {
		if err := migrate(db); err != nil {
			t.Fatal(err)
		}
	}
	var v int
	if err := db.QueryRow(`SELECT version FROM schema_version`).Scan(&v); err != nil || v != len(migrations) {
		t.Fatalf("schema version %d, %v; want %d", v, err, len(migrations))
	}
	if _, err := db.Exec(`UPDATE schema_version SET version = ?`, len(migrations)+1); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if s, err := Open(path, Options{}); err == nil {
		s.Close()
		t.Fatal("Open of a database with a newer schema succeeded")
	}
}
