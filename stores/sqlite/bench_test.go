package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/eventlog/logtest"
)

// TestBenchReport runs the scripted benchmark of docs/benchmarks.md and
// prints its table. It only runs when asked:
//
//	AMBER_BENCH=1 go test -run TestBenchReport -v ./stores/sqlite
//
// AMBER_BENCH_DIR puts the database elsewhere than the test's temp dir.
func TestBenchReport(t *testing.T) {
	if os.Getenv("AMBER_BENCH") == "" {
		t.Skip("set AMBER_BENCH=1 to run the benchmark report")
	}
	dir := os.Getenv("AMBER_BENCH_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, fmt.Sprintf("bench-%d.db", os.Getpid()))
	t.Cleanup(func() {
		for _, suffix := range []string{"", "-wal", "-shm"} {
			os.Remove(path + suffix)
		}
	})
	s := openTest(t, path, clock.Real{})
	r, err := logtest.RunBench(t.Context(), s, logtest.BenchOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := s.Durability(t.Context())
	wal, _ := os.Stat(path + "-wal")
	db, _ := os.Stat(path)
	fmt.Printf("\n%s\nSQLite settings read back: %v; database %d MiB, WAL %d MiB at the end; %d commits, %.1f writes per commit\n\n",
		r.Markdown("stores/sqlite"), d, size(db)>>20, size(wal)>>20, s.w.commits.Load(), float64(s.w.committed.Load())/float64(s.w.commits.Load()))
}

var benchPayload = json.RawMessage(`{"text":"` + strings.Repeat("x", 189) + `"}`)

func benchStore(b *testing.B) *Store {
	s, err := Open(filepath.Join(b.TempDir(), "b.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

func benchEvent(stream string, i int) eventlog.Event {
	return eventlog.Event{Tenant: "t", ID: fmt.Sprintf("%s#%d", stream, i), Type: "bench", Version: 1, Payload: benchPayload}
}

// BenchmarkAppend: durable single-event appends from one session.
func BenchmarkAppend(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		if _, err := s.Append(ctx, "session/b", 0, uint64(i), benchEvent("session/b", i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppend64: durable single-event appends from 64 concurrent
// sessions, each on its own stream (group commit shares the fsyncs).
func BenchmarkAppend64(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(max(64/runtimeProcs(), 1))
	c0, n0 := s.w.commits.Load(), s.w.committed.Load()
	b.RunParallel(func(pb *testing.PB) {
		stream := fmt.Sprintf("session/p%d", next.Add(1))
		for i := 0; pb.Next(); i++ {
			if _, err := s.Append(ctx, stream, 0, uint64(i), benchEvent(stream, i)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(s.w.committed.Load()-n0)/float64(max(s.w.commits.Load()-c0, 1)), "appends/commit")
}

// BenchmarkAppendBatch100: batches of 100 events from one writer; reports
// events/s.
func BenchmarkAppendBatch100(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	batch := make([]eventlog.Event, 100)
	n := 0
	for i := 0; b.Loop(); i++ {
		for j := range batch {
			batch[j] = benchEvent("session/batch", i*100+j)
		}
		if _, err := s.Append(ctx, "session/batch", 0, uint64(i*100), batch...); err != nil {
			b.Fatal(err)
		}
		n += 100
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkReplay: reading a 100k-event stream from the start; reports
// events/s.
func BenchmarkReplay(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	const total = 100000
	for head := 0; head < total; head += 1000 {
		batch := make([]eventlog.Event, 1000)
		for j := range batch {
			batch[j] = benchEvent("session/replay", head+j)
		}
		if _, err := s.Append(ctx, "session/replay", 0, uint64(head), batch...); err != nil {
			b.Fatal(err)
		}
	}
	n := 0
	for b.Loop() {
		for from := uint64(1); ; {
			evs, err := s.Read(ctx, "session/replay", from, 1000)
			if err != nil {
				b.Fatal(err)
			}
			if len(evs) == 0 {
				break
			}
			n += len(evs)
			from = evs[len(evs)-1].Seq + 1
		}
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "events/s")
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

func size(fi os.FileInfo) int64 {
	if fi == nil {
		return 0
	}
	return fi.Size()
}
