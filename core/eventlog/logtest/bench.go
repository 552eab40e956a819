package logtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/core/eventlog"
)

// BenchOptions size RunBench. Zero fields take the defaults in brackets.
type BenchOptions struct {
	// Dir, when set, is where the disk's raw fsync latency is measured
	// (FsyncLatency), normally the directory of the database.
	Dir string
	// SingleAppends is how many single-event appends the one-session
	// latency run makes [2000].
	SingleAppends int
	// Sessions and AppendsPerSession size the concurrent latency run: each
	// session appends single events to its own stream [64, 100].
	Sessions, AppendsPerSession int
	// BatchSize, BatchWriters and BatchedEvents size the throughput run
	// [100, 4, 200000].
	BatchSize, BatchWriters, BatchedEvents int
	// ReplayEvents is the length of the stream read back [100000].
	ReplayEvents int
	// PayloadBytes is the size of each event's payload [200].
	PayloadBytes int
	// Prefix starts every stream name and event id [a random one].
	Prefix string
}

func (o *BenchOptions) defaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.SingleAppends, 2000)
	def(&o.Sessions, 64)
	def(&o.AppendsPerSession, 100)
	def(&o.BatchSize, 100)
	def(&o.BatchWriters, 4)
	def(&o.BatchedEvents, 200000)
	def(&o.ReplayEvents, 100000)
	def(&o.PayloadBytes, 200)
	if o.Prefix == "" {
		o.Prefix = "bench-" + randHex(4)
	}
}

// Latency summarizes one latency run.
type Latency struct {
	N             int
	P50, P99, Max time.Duration
	// PerSec is appends acknowledged per second over the run.
	PerSec float64
	// CPU is the process CPU time (user+system, all threads) per append:
	// what the run costs independently of how busy the machine was.
	CPU time.Duration
}

// BenchReport is what RunBench measured.
type BenchReport struct {
	Options BenchOptions
	// Single1 and SingleN are durable single-event append latencies with
	// one session and with Options.Sessions concurrent sessions.
	Single1, SingleN Latency
	// BatchedPerSec is events/s appended in batches of Options.BatchSize by
	// Options.BatchWriters writers; BatchedCPU is process CPU per event.
	BatchedPerSec float64
	BatchedCPU    time.Duration
	// ReplayPerSec is events/s read back from one stream of
	// Options.ReplayEvents events, in pages of 1000; ReplayCPU is process
	// CPU per event.
	ReplayPerSec float64
	ReplayCPU    time.Duration
	// FsyncP50 and FsyncP99 are the disk's raw 4 KiB write+fdatasync
	// latencies (zero when Options.Dir was empty).
	FsyncP50, FsyncP99 time.Duration
	GOMAXPROCS         int
	// LoadBefore and LoadAfter are the machine's 1-minute load averages
	// (Linux), to tell a quiet run from a contended one.
	LoadBefore, LoadAfter string
}

// RunBench measures store with the workloads of docs/benchmarks.md. It
// writes about Sessions×AppendsPerSession + SingleAppends + BatchedEvents +
// ReplayEvents events to fresh streams.
func RunBench(ctx context.Context, store eventlog.Store, opts BenchOptions) (BenchReport, error) {
	opts.defaults()
	r := BenchReport{Options: opts, GOMAXPROCS: runtime.GOMAXPROCS(0), LoadBefore: loadAvg()}
	payload, _ := json.Marshal(map[string]string{"text": strings.Repeat("x", max(opts.PayloadBytes-11, 1))})
	b := &bencher{ctx: ctx, store: store, opts: opts, payload: payload}
	var err error
	if opts.Dir != "" {
		if r.FsyncP50, r.FsyncP99, err = FsyncLatency(opts.Dir, 500); err != nil {
			return r, err
		}
	}
	if _, err = b.sessions("warmup", 4, 20); err != nil {
		return r, err
	}
	if r.Single1, err = b.sessions("one", 1, opts.SingleAppends); err != nil {
		return r, err
	}
	if r.SingleN, err = b.sessions("many", opts.Sessions, opts.AppendsPerSession); err != nil {
		return r, err
	}
	if r.BatchedPerSec, r.BatchedCPU, err = b.batched(); err != nil {
		return r, err
	}
	if r.ReplayPerSec, r.ReplayCPU, err = b.replay(); err != nil {
		return r, err
	}
	r.LoadAfter = loadAvg()
	return r, nil
}

type bencher struct {
	ctx     context.Context
	store   eventlog.Store
	opts    BenchOptions
	payload json.RawMessage
}

func (b *bencher) event(stream string, i int) eventlog.Event {
	return eventlog.Event{Tenant: Tenant, ID: fmt.Sprintf("%s#%d", stream, i), Type: "bench.event", Version: 1, Payload: b.payload}
}

// sessions runs n sessions, each appending count single events to its own
// stream at the head it expects, and returns the latency distribution.
func (b *bencher) sessions(name string, n, count int) (Latency, error) {
	lat := make([][]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start, cpu0 := time.Now(), processCPU()
	for s := range n {
		wg.Go(func() {
			stream := fmt.Sprintf("%s/%s-%d", b.opts.Prefix, name, s)
			lat[s] = make([]time.Duration, 0, count)
			for i := range count {
				t0 := time.Now()
				if _, err := b.store.Append(b.ctx, stream, 0, uint64(i), b.event(stream, i)); err != nil {
					errs[s] = fmt.Errorf("%s append %d: %w", stream, i, err)
					return
				}
				lat[s] = append(lat[s], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), processCPU()-cpu0
	for _, err := range errs {
		if err != nil {
			return Latency{}, err
		}
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	return Latency{
		N: len(all), P50: quantile(all, 0.50), P99: quantile(all, 0.99), Max: all[len(all)-1],
		PerSec: float64(len(all)) / elapsed.Seconds(), CPU: cpu / time.Duration(len(all)),
	}, nil
}

// batched appends BatchedEvents events in batches from BatchWriters
// writers and returns events/s and CPU per event.
func (b *bencher) batched() (float64, time.Duration, error) {
	o := b.opts
	perWriter := max(o.BatchedEvents/o.BatchWriters/o.BatchSize, 1)
	errs := make([]error, o.BatchWriters)
	var wg sync.WaitGroup
	start, cpu0 := time.Now(), processCPU()
	for w := range o.BatchWriters {
		wg.Go(func() {
			stream := fmt.Sprintf("%s/batched-%d", o.Prefix, w)
			batch := make([]eventlog.Event, o.BatchSize)
			for i := range perWriter {
				for j := range batch {
					batch[j] = b.event(stream, i*o.BatchSize+j)
				}
				if _, err := b.store.Append(b.ctx, stream, 0, uint64(i*o.BatchSize), batch...); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), processCPU()-cpu0
	for _, err := range errs {
		if err != nil {
			return 0, 0, err
		}
	}
	n := perWriter * o.BatchSize * o.BatchWriters
	return float64(n) / elapsed.Seconds(), cpu / time.Duration(n), nil
}

// replay fills one stream with ReplayEvents events (not timed) and reads
// it back from 1 in pages of 1000, returning events/s and CPU per event.
func (b *bencher) replay() (float64, time.Duration, error) {
	stream := b.opts.Prefix + "/replay"
	const page = 1000
	for head := 0; head < b.opts.ReplayEvents; {
		n := min(page, b.opts.ReplayEvents-head)
		batch := make([]eventlog.Event, n)
		for j := range batch {
			batch[j] = b.event(stream, head+j)
		}
		if _, err := b.store.Append(b.ctx, stream, 0, uint64(head), batch...); err != nil {
			return 0, 0, err
		}
		head += n
	}
	start, cpu0 := time.Now(), processCPU()
	got := 0
	for from := uint64(1); ; {
		evs, err := b.store.Read(b.ctx, stream, from, page)
		if err != nil {
			return 0, 0, err
		}
		if len(evs) == 0 {
			break
		}
		got += len(evs)
		from = evs[len(evs)-1].Seq + 1
	}
	elapsed, cpu := time.Since(start), processCPU()-cpu0
	if got != b.opts.ReplayEvents {
		return 0, 0, fmt.Errorf("replay read %d events, want %d", got, b.opts.ReplayEvents)
	}
	return float64(got) / elapsed.Seconds(), cpu / time.Duration(got), nil
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(int(q*float64(len(sorted))), len(sorted)-1)]
}

// FsyncLatency measures the disk under dir: n times, write 4 KiB into a
// preallocated file and fdatasync it. It returns the p50 and p99.
func FsyncLatency(dir string, n int) (p50, p99 time.Duration, err error) {
	f, err := os.CreateTemp(dir, ".fsync-probe-*")
	if err != nil {
		return 0, 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	const block, blocks = 4096, 256
	buf := make([]byte, block)
	if _, err := f.Write(make([]byte, block*blocks)); err != nil {
		return 0, 0, err
	}
	if err := f.Sync(); err != nil {
		return 0, 0, err
	}
	lat := make([]time.Duration, 0, n)
	for i := range n {
		buf[0] = byte(i)
		t0 := time.Now()
		if _, err := f.WriteAt(buf, int64(i%blocks)*block); err != nil {
			return 0, 0, err
		}
		if err := fdatasync(f); err != nil {
			return 0, 0, err
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	return quantile(lat, 0.5), quantile(lat, 0.99), nil
}

// Markdown renders the report as the table in docs/benchmarks.md, with the
// embedded-backend targets of issue 2, the ratio to the raw fsync and the
// process CPU each operation cost.
func (r BenchReport) Markdown(backend string) string {
	var sb strings.Builder
	ratio := func(d time.Duration) string {
		if r.FsyncP50 == 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f×", float64(d)/float64(r.FsyncP50))
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }
	us := func(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/1e3) }
	o := r.Options
	fmt.Fprintf(&sb, "Backend: %s, GOMAXPROCS=%d, payload %d B, load average %s → %s\n\n", backend, r.GOMAXPROCS, o.PayloadBytes, r.LoadBefore, r.LoadAfter)
	fmt.Fprintf(&sb, "| measure | result | target | vs raw fsync p50 | CPU per op |\n|---|---|---|---|---|\n")
	fmt.Fprintf(&sb, "| raw 4 KiB write+fdatasync p50 / p99 | %s / %s | – | 1× | – |\n", ms(r.FsyncP50), ms(r.FsyncP99))
	fmt.Fprintf(&sb, "| append p50 / p99, 1 session (%d appends) | %s / %s | – | %s / %s | %s |\n", r.Single1.N, ms(r.Single1.P50), ms(r.Single1.P99), ratio(r.Single1.P50), ratio(r.Single1.P99), us(r.Single1.CPU))
	fmt.Fprintf(&sb, "| append p50, %d sessions (%d appends) | %s | ≤ 1 ms | %s | %s |\n", o.Sessions, r.SingleN.N, ms(r.SingleN.P50), ratio(r.SingleN.P50), us(r.SingleN.CPU))
	fmt.Fprintf(&sb, "| append p99, %d sessions | %s | ≤ 5 ms | %s | |\n", o.Sessions, ms(r.SingleN.P99), ratio(r.SingleN.P99))
	fmt.Fprintf(&sb, "| appends/s, %d sessions | %.0f | – | – | |\n", o.Sessions, r.SingleN.PerSec)
	fmt.Fprintf(&sb, "| batched events/s (batches of %d, %d writers) | %.0f | ≥ 50,000 | – | %s |\n", o.BatchSize, o.BatchWriters, r.BatchedPerSec, us(r.BatchedCPU))
	fmt.Fprintf(&sb, "| replay events/s (%d-event stream) | %.0f | ≥ 200,000 | – | %s |\n", o.ReplayEvents, r.ReplayPerSec, us(r.ReplayCPU))
	return sb.String()
}
