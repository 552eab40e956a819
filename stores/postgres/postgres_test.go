package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/eventlog/logtest"
	"github.com/amber-run/amber/stores/postgres"
)

// TestConformance runs the event log suite against a real PostgreSQL, in a
// schema of its own that is dropped afterwards. Every subtest gets its own
// Store (pool and listener) on that schema.
func TestConformance(t *testing.T) {
	t.Parallel()
	schema := freshSchema(t)
	logtest.Run(t, func(t *testing.T, clk clock.Clock) eventlog.Store {
		return openStore(t, schema, clk)
	}, logtest.Options{
		Corrupt: corruptEnvelope,
		Reopen: func(t *testing.T, store eventlog.Store, clk clock.Clock) eventlog.Store {
			if err := store.Close(); err != nil {
				t.Fatal(err)
			}
			return openStore(t, schema, clk)
		},
	})
}

// corruptEnvelope flips one bit in the middle of the stored envelope of
// stream/seq, behind the Store's back.
func corruptEnvelope(t *testing.T, store eventlog.Store, stream string, seq uint64) {
	t.Helper()
	tag, err := store.(*postgres.Store).Pool().Exec(context.Background(), `
		UPDATE events SET envelope = set_byte(envelope, length(envelope) / 2, get_byte(envelope, length(envelope) / 2) # 1)
		WHERE stream = $1 AND seq = $2`, stream, int64(seq))
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("corrupt %s/%d: %v (%d rows)", stream, seq, err, tag.RowsAffected())
	}
}

// testDSN is the database the tests use. The README's test command starts a
// local PostgreSQL; a test that cannot reach it fails rather than skips.
func testDSN() string {
	if dsn := os.Getenv("AMBER_TEST_PG"); dsn != "" {
		return dsn
	}
	return "postgres://amber:amber@127.0.0.1:5432/amber_test?sslmode=disable"
}

// freshSchema returns a schema name no other test run uses and drops the
// schema when t ends.
func freshSchema(t testing.TB) string {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	schema := "t_" + hex.EncodeToString(b[:])
	t.Cleanup(func() { dropSchema(t, schema) })
	return schema
}

func dropSchema(t testing.TB, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, testDSN())
	if err != nil {
		t.Errorf("drop schema %s: %v", schema, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		t.Errorf("drop schema %s: %v", schema, err)
	}
}

// openStore opens a Store on schema and closes it when t ends.
func openStore(t testing.TB, schema string, clk clock.Clock) *postgres.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := postgres.Open(ctx, testDSN(), postgres.Options{Clock: clk, Schema: schema, MaxConns: testMaxConns(), Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("cannot open the PostgreSQL test database %s: %v\n"+
			"The tests need a running PostgreSQL: run `make test` (which runs scripts/setup/postgres.sh) "+
			"or set AMBER_TEST_PG to a reachable database.", testDSN(), err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newStore is a Store in a schema of its own.
func newStore(t testing.TB, clk clock.Clock) *postgres.Store {
	t.Helper()
	return openStore(t, freshSchema(t), clk)
}

// testLogger writes the Store's log lines into the test's output.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// testMaxConns lets a benchmark run try other pool sizes
// (AMBER_PG_CONNS=64); 0 means the Store's default.
func testMaxConns() int32 {
	n, _ := strconv.Atoi(os.Getenv("AMBER_PG_CONNS"))
	return int32(n)
}
