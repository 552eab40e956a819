package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/eventlog/logtest"
)

func openTest(t *testing.T, path string, clk clock.Clock) *Store {
	t.Helper()
	s, err := Open(path, Options{Clock: clk})
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	logtest.Run(t, func(t *testing.T, clk clock.Clock) eventlog.Store {
		return openTest(t, filepath.Join(t.TempDir(), "log.db"), clk)
	}, logtest.Options{
		Corrupt: func(t *testing.T, store eventlog.Store, stream string, seq uint64) {
			flipByte(t, store.(*Store), stream, seq, 20)
		},
		Reopen: func(t *testing.T, store eventlog.Store, clk clock.Clock) eventlog.Store {
			s := store.(*Store)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			return openTest(t, s.path, clk)
		},
	})
}

// TestConformanceSharedDB runs the suite with every subtest's store on one
// database file, as a deployment with several Stores on one file would.
func TestConformanceSharedDB(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	path := filepath.Join(t.TempDir(), "shared.db")
	logtest.Run(t, func(t *testing.T, clk clock.Clock) eventlog.Store {
		return openTest(t, path, clk)
	}, logtest.Options{Writers: 16, AppendsPerWriter: 10})
}

// rawDB opens a second, unmanaged connection to the store's file, as an
// intruder (or a failing disk) would change it.
func rawDB(t *testing.T, s *Store) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", s.path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// rawExec runs a statement on the event of stream/seq (?1 = sid, ?2 = seq).
func rawExec(t *testing.T, s *Store, stream, query string, args ...any) {
	t.Helper()
	db := rawDB(t, s)
	var sid int64
	if err := db.QueryRow(`SELECT sid FROM streams WHERE stream = ?`, stream).Scan(&sid); err != nil {
		t.Fatalf("find stream %s: %v", stream, err)
	}
	res, err := db.ExecContext(context.Background(), query, append([]any{sid}, args...)...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("%s: %d rows affected, want 1", query, n)
	}
}

// flipByte flips one bit of byte i of the stored envelope of stream/seq.
func flipByte(t *testing.T, s *Store, stream string, seq uint64, i int) {
	t.Helper()
	env := rawEnvelope(t, s, stream, seq)
	env[i] ^= 0x04
	rawExec(t, s, stream, `UPDATE events SET env = ?3 WHERE sid = ?1 AND seq = ?2`, int64(seq), env)
}

// rawEnvelope returns the stored envelope of stream/seq.
func rawEnvelope(t *testing.T, s *Store, stream string, seq uint64) []byte {
	t.Helper()
	var env []byte
	err := rawDB(t, s).QueryRow(`SELECT env FROM events JOIN streams USING (sid) WHERE stream = ? AND seq = ?`, stream, int64(seq)).Scan(&env)
	if err != nil {
		t.Fatalf("read envelope %s/%d: %v", stream, seq, err)
	}
	return env
}
