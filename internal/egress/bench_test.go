package egress_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/egress/egresstest"
	"github.com/amber-run/amber/lib/netns"
)

// benchClient is an HTTP client whose connections are made in the network
// namespace at nsPath (a sandbox's), or in the host's when nsPath is "".
func benchClient(nsPath string, keepAlive bool) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if nsPath == "" {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
		var c net.Conn
		err := netns.Do(nsPath, func() error {
			var err error
			c, err = net.DialTimeout(network, addr, 5*time.Second)
			return err
		})
		return c, err
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: 64}}
}

// BenchmarkEgress compares a POST from a sandbox's namespace through the
// gateway (plumbing, redirect, journaled intent and outcome on SQLite) with
// the same POST made directly on the host, per request (p50, p99) and with
// 16 concurrent clients (requests/s). Run: make bench BENCH=egress.
func BenchmarkEgress(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	ledger := egresstest.NewLedger(b, true)
	path := egresstest.Start(b, map[string]netip.AddrPort{"payments.test": ledger.Addr()})
	dir := b.TempDir()
	sbx := filepath.Join(dir, "sbx.netns")
	if err := netns.Create(sbx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { netns.Remove(sbx) })
	const id = "sbx-bench"
	path.StartRun(b, "t1", id, "run-0")
	if err := path.Network.Plumb(context.Background(), id, sbx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { path.Network.Unplumb(context.Background(), id) })
	var standIn netip.Addr
	if err := netns.Do(sbx, func() error {
		var err error
		standIn, err = resolve("payments.test")
		return err
	}); err != nil {
		b.Fatal(err)
	}
	port := ledger.Addr().Port()
	step := 0
	post := func(c *http.Client, target string) error {
		step++
		req, _ := http.NewRequest("POST", "http://"+target+"/charge", strings.NewReader(fmt.Sprintf(`{"step":%d}`, step)))
		req.Host = fmt.Sprintf("payments.test:%d", port)
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	for _, tc := range []struct {
		name   string
		ns     string
		target string
		keep   bool
	}{
		{"direct/keepalive", "", ledger.Addr().String(), true},
		{"gateway/keepalive", sbx, netip.AddrPortFrom(standIn, port).String(), true},
		{"direct/newconn", "", ledger.Addr().String(), false},
		{"gateway/newconn", sbx, netip.AddrPortFrom(standIn, port).String(), false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := benchClient(tc.ns, tc.keep)
			if err := post(c, tc.target); err != nil { // warm up
				b.Fatal(err)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if err := post(c, tc.target); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
	b.Run("gateway/parallel16", func(b *testing.B) {
		c := benchClient(sbx, true)
		target := netip.AddrPortFrom(standIn, port).String()
		b.SetParallelism(8) // 8 × GOMAXPROCS(2) = 16 clients
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			n := 0
			for pb.Next() {
				n++
				req, _ := http.NewRequest("POST", "http://"+target+"/charge", strings.NewReader(fmt.Sprintf(`{"step":%d,"n":%d}`, time.Now().UnixNano(), n)))
				req.Host = fmt.Sprintf("payments.test:%d", port)
				resp, err := c.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
	})
}
