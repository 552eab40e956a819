package postgres_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/eventlog/logtest"
)

// TestBenchReport runs the scripted benchmark of docs/benchmarks.md against
// the test database and prints its table. It only runs when asked:
//
//	AMBER_BENCH=1 go test -run TestBenchReport -v ./stores/postgres
//
// The raw fdatasync figure is measured under AMBER_BENCH_DIR (default: the
// test's temporary directory); point it at the disk that holds PostgreSQL's
// WAL when the server is on another disk or host.
func TestBenchReport(t *testing.T) {
	if os.Getenv("AMBER_BENCH") == "" {
		t.Skip("set AMBER_BENCH=1 to run the benchmark report")
	}
	dir := os.Getenv("AMBER_BENCH_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	s := newStore(t, clock.Real{})
	r, err := logtest.RunBench(t.Context(), s, logtest.BenchOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.Durability(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("\n%s\nPostgreSQL settings read back: %v; pool of %d connections\n\n",
		r.Markdown("stores/postgres"), d, s.Pool().Config().MaxConns)
}
