package postgres_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/eventlog"
)

// TestBenchReport prints the event log figures of docs/benchmarks.md for
// this backend as a markdown table:
//
//	AMBER_BENCH=1 go test -run TestBenchReport -v ./stores/postgres
func TestBenchReport(t *testing.T) {
	if os.Getenv("AMBER_BENCH") != "1" {
		t.Skip("set AMBER_BENCH=1 to run the benchmark report")
	}
	ctx := context.Background()
	s := newStore(t, clock.Real{})
	rows := [][2]string{}
	add := func(k, v string) { rows = append(rows, [2]string{k, v}) }

	fsync := fsyncLatency(t, 200)
	add("disk fdatasync of 8 KiB, p50", fmtDur(fsync))

	// Single-event durable appends, one session.
	lat := appendLatencies(t, s, 1, 300)
	p50 := pct(lat, 50)
	add("append p50 / p99, 1 session", fmt.Sprintf("%s / %s (p50 = %.1f× fdatasync)", fmtDur(p50), fmtDur(pct(lat, 99)), float64(p50)/float64(fsync)))

	// 64 sessions, each appending to its own stream.
	start := time.Now()
	lat = appendLatencies(t, s, 64, 30)
	el := time.Since(start)
	add("append p50 / p99, 64 sessions", fmt.Sprintf("%s / %s (%.0f appends/s)", fmtDur(pct(lat, 50)), fmtDur(pct(lat, 99)), float64(len(lat))/el.Seconds()))

	// Batched: one session, 1,000 events per append.
	const batches, per = 50, 1000
	start = time.Now()
	for i := range batches {
		batch := make([]eventlog.Event, per)
		for j := range batch {
			batch[j] = benchEvent(fmt.Sprintf("batched-%d-%d", i, j))
		}
		if _, err := s.Append(ctx, "bench/batched", 0, eventlog.Any, batch...); err != nil {
			t.Fatal(err)
		}
	}
	add("batched append, 1,000 events per batch", fmt.Sprintf("%.0f events/s", float64(batches*per)/time.Since(start).Seconds()))

	// Replay a 100k-event stream.
	const total = 100_000
	for i := 0; i < total; i += per {
		batch := make([]eventlog.Event, per)
		for j := range batch {
			batch[j] = benchEvent(fmt.Sprintf("replay-%d", i+j))
		}
		if _, err := s.Append(ctx, "bench/replay", 0, eventlog.Any, batch...); err != nil {
			t.Fatal(err)
		}
	}
	start = time.Now()
	n := 0
	for from := uint64(1); ; {
		evs, err := s.Read(ctx, "bench/replay", from, per)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			break
		}
		n += len(evs)
		from = evs[len(evs)-1].Seq + 1
	}
	if n != total {
		t.Fatalf("replayed %d events", n)
	}
	add("replay of a 100k-event stream (pages of 1,000)", fmt.Sprintf("%.0f events/s", float64(n)/time.Since(start).Seconds()))

	d, err := s.Durability(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nPostgreSQL backend (synchronous_commit=%s, fsync=%s, wal_sync_method=%s)\n\n", d["synchronous_commit"], d["fsync"], d["wal_sync_method"])
	b.WriteString("| measure | value |\n|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s |\n", r[0], r[1])
	}
	t.Log(b.String())
}

// appendLatencies runs sessions goroutines, each appending n single events
// to its own stream, and returns every append's latency. Each session's
// first append (stream creation, connection setup) is not counted.
func appendLatencies(t *testing.T, s eventlog.Store, sessions, n int) []time.Duration {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	run := time.Now().UnixNano()
	for w := range sessions {
		wg.Go(func() {
			stream := fmt.Sprintf("bench/lat-%d-%d-%d", sessions, run, w)
			mine := make([]time.Duration, 0, n)
			for i := range n + 1 {
				start := time.Now()
				if _, err := s.Append(ctx, stream, 0, uint64(i), benchEvent(fmt.Sprintf("%s-%d", stream, i))); err != nil {
					t.Error(err)
					return
				}
				if i > 0 {
					mine = append(mine, time.Since(start))
				}
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	slices.Sort(all)
	return all
}

// fsyncLatency is the median of n 8 KiB write+fdatasync, done the way
// PostgreSQL writes its WAL: sequentially into a pre-zeroed 16 MiB file, on
// the disk under the test's temporary directory (the same disk as
// PostgreSQL's data here).
func fsyncLatency(t *testing.T, n int) time.Duration {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "wal"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const segment, block = 16 << 20, 8192
	if _, err := f.Write(make([]byte, segment)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, block)
	lat := make([]time.Duration, 0, n)
	for i := range n {
		buf[0] = byte(i)
		start := time.Now()
		if _, err := f.WriteAt(buf, int64(i*block)%segment); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	return pct(lat, 50)
}

func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

func fmtDur(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }
