package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/egress/gateway"
)

// BenchmarkLatency measures one small POST (keep-alive connections) sent
// directly to a loopback server, through the gateway without the journal,
// and through the gateway journaling intent and outcome in SQLite (two
// durable appends per request). It reports p50 and p99 per request; the
// added latency of the gateway is the difference with "direct".
//
//	go test ./internal/egress/gateway -run '^$' -bench Latency -benchtime 2000x
func BenchmarkLatency(b *testing.B) {
	for _, mode := range []string{"direct", "gateway", "gateway+journal"} {
		b.Run(mode, func(b *testing.B) {
			led := newLedger(b, false)
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			if mode != "direct" {
				opts := gateway.Options{Logger: quietLog}
				epoch := uint64(0)
				if mode == "gateway+journal" {
					store := openStore(b, storePath(b))
					defer store.Close()
					opts.Journal = gateway.NewJournal(store)
					epoch = acquire(b, store, "sb-bench", "n")
				}
				gw := gateway.New(opts)
				defer gw.Close()
				if err := gw.StartRun(context.Background(), gateway.Run{Tenant: "acme", Sandbox: "sb-bench", ID: "c0", Epoch: epoch, Policy: allowLoopback(led.addr())}); err != nil {
					b.Fatal(err)
				}
				f := newFront(b, gw, led.addr(), "sb-bench")
				c.Transport = &http.Transport{MaxIdleConnsPerHost: 4, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "tcp", f.ln.Addr().String())
				}}
			}
			url := "http://" + led.addr().String() + "/bench"
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				start := time.Now()
				resp, err := c.Post(url, "application/json", bytes.NewBufferString(fmt.Sprintf(`{"i":%d}`, i)))
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// BenchmarkAppendFloor is the floor of the journal's cost: one durable
// single-event SQLite append (a journaled request makes two).
func BenchmarkAppendFloor(b *testing.B) {
	store := openStore(b, storePath(b))
	defer store.Close()
	lat := make([]time.Duration, 0, b.N)
	for i := range b.N {
		start := time.Now()
		_, err := store.Append(context.Background(), "effects/floor", 0, eventlog.Any, eventlog.Event{
			Tenant: "acme", ID: fmt.Sprintf("floor-%d", i), Type: "x", Version: 1, Payload: []byte(`{"k":1}`)})
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkThroughput: 16 concurrent clients through one journaling
// gateway (group commit shares fsyncs between them); reports requests/s.
func BenchmarkThroughput(b *testing.B) {
	led := newLedger(b, false)
	store := openStore(b, storePath(b))
	defer store.Close()
	gw := gateway.New(gateway.Options{Logger: quietLog, Journal: gateway.NewJournal(store)})
	defer gw.Close()
	if err := gw.StartRun(context.Background(), gateway.Run{Tenant: "acme", Sandbox: "sb-tp", ID: "c0",
		Epoch: acquire(b, store, "sb-tp", "n"), Policy: allowLoopback(led.addr())}); err != nil {
		b.Fatal(err)
	}
	f := newFront(b, gw, led.addr(), "sb-tp")
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", f.ln.Addr().String())
	}}}
	url := "http://" + led.addr().String() + "/tp"
	var n atomic.Int64
	b.SetParallelism(8) // × GOMAXPROCS
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := c.Post(url, "application/json", bytes.NewBufferString(fmt.Sprintf(`{"i":%d}`, n.Add(1))))
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
	b.ReportMetric(float64(n.Load())/time.Since(start).Seconds(), "req/s")
}
