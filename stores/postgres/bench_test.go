package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/eventlog"
)

// go test -run '^$' -bench . ./stores/postgres

// BenchmarkAppend: one durable single-event append at a time to one stream.
func BenchmarkAppend(b *testing.B) {
	s := newStore(b, clock.Real{})
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := s.Append(ctx, "bench/one", 0, uint64(i), benchEvent(fmt.Sprintf("one-%d", i))); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkAppend64: 64 sessions, each appending single events to its own
// stream concurrently; ns/op is per append across all of them. Each session
// appends once before the clock starts, so pool connections and streams
// exist.
func BenchmarkAppend64(b *testing.B) {
	s := newStore(b, clock.Real{})
	ctx := context.Background()
	const sessions = 64
	var next atomic.Int64
	var warm, done sync.WaitGroup
	start := make(chan struct{})
	for w := range sessions {
		warm.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			stream := fmt.Sprintf("bench/s%d", w)
			var head uint64
			appendOne := func() bool {
				if _, err := s.Append(ctx, stream, 0, head, benchEvent(fmt.Sprintf("s%d-%d", w, head))); err != nil {
					b.Error(err)
					return false
				}
				head++
				return true
			}
			ok := appendOne()
			warm.Done()
			<-start
			for ok && next.Add(1) <= int64(b.N) {
				ok = appendOne()
			}
		}()
	}
	warm.Wait()
	b.ResetTimer()
	close(start)
	done.Wait()
}

// BenchmarkReplay reads a 100,000-event stream from the start in pages of
// 1,000, decoding and checking every envelope.
func BenchmarkReplay(b *testing.B) {
	const total, page = 100_000, 1000
	s := newStore(b, clock.Real{})
	ctx := context.Background()
	batch := make([]eventlog.Event, 0, page)
	for i := range total {
		batch = append(batch, benchEvent(fmt.Sprintf("r-%d", i)))
		if len(batch) == page {
			if _, err := s.Append(ctx, "bench/replay", 0, eventlog.Any, batch...); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	b.ResetTimer()
	for b.Loop() {
		n := 0
		for from := uint64(1); ; {
			evs, err := s.Read(ctx, "bench/replay", from, page)
			if err != nil {
				b.Fatal(err)
			}
			if len(evs) == 0 {
				break
			}
			n += len(evs)
			from = evs[len(evs)-1].Seq + 1
		}
		if n != total {
			b.Fatalf("replayed %d events", n)
		}
	}
	b.ReportMetric(float64(total*b.N)/b.Elapsed().Seconds(), "events/s")
}

func benchEvent(id string) eventlog.Event {
	e := ev(id, `{"role":"assistant","text":"ran the tests; 3 passed, 1 failed","tokens":42}`)
	e.Type = "session.step"
	return e
}
