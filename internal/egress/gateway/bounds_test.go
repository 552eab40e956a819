package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/egress/gateway"
)

// A sandbox cannot hold more of the gateway than its share: with the
// default bounds, the 65th request in flight is answered 429 with
// Retry-After while another sandbox's requests go through, and (with a
// small buffer budget) a request body that does not fit is answered 503
// with Retry-After before anything reaches the upstream.
func TestGatewayBoundsPerSandbox(t *testing.T) {
	release := make(chan struct{})
	var hits atomic.Int64
	up := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path == "/block" {
			<-release
		}
		fmt.Fprint(w, "ok")
	}))
	addr := netip.MustParseAddrPort(up.Listener.Addr().String())
	ctx := context.Background()
	gw := gateway.New(gateway.Options{Logger: quietLog})
	defer gw.Close()
	for _, sb := range []string{"sb-a", "sb-b"} {
		if err := gw.StartRun(ctx, gateway.Run{Tenant: "acme", Sandbox: sb, ID: "c0", Policy: allowLoopback(addr)}); err != nil {
			t.Fatal(err)
		}
	}
	fa, fb := newFront(t, gw, addr, "sb-a"), newFront(t, gw, addr, "sb-b")
	ca := fa.client()
	ca.Timeout = 30 * time.Second
	var wg sync.WaitGroup
	defer func() { close(release); wg.Wait() }()
	const inFlight = 64 // the documented default
	for i := 0; i < inFlight; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := ca.Get("http://" + addr.String() + "/block"); err == nil {
				resp.Body.Close()
			}
		}()
	}
	for deadline := time.Now().Add(20 * time.Second); hits.Load() < inFlight; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d requests reached the upstream", hits.Load(), inFlight)
		}
	}
	c := fa.client()
	c.Timeout = 3 * time.Second
	resp, err := c.Get("http://" + addr.String() + "/x")
	if err != nil {
		t.Fatalf("request %d: %v (want a 429 at once)", inFlight+1, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("request %d in flight: status %d Retry-After %q, want 429 with Retry-After", inFlight+1, resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if resp, body := get(t, fb.client(), "http://"+addr.String()+"/x", ""); resp.StatusCode != 200 {
		t.Fatalf("another sandbox: status %d %s, want 200", resp.StatusCode, body)
	}
}

func TestGatewayBoundsBufferedBytes(t *testing.T) {
	var hits atomic.Int64
	up := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "ok")
	}))
	addr := netip.MustParseAddrPort(up.Listener.Addr().String())
	ctx := context.Background()
	gw := gateway.New(gateway.Options{Logger: quietLog, MaxBufferedPerSandbox: 3 << 20})
	defer gw.Close()
	if err := gw.StartRun(ctx, gateway.Run{Tenant: "acme", Sandbox: "sb-a", ID: "c0", Policy: allowLoopback(addr)}); err != nil {
		t.Fatal(err)
	}
	c := newFront(t, gw, addr, "sb-a").client()
	resp, err := c.Post("http://"+addr.String()+"/big", "application/octet-stream", bytes.NewReader(make([]byte, 5<<19)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || resp.Header.Get(gateway.HeaderError) != "busy" {
		t.Fatalf("2.5 MiB body over a 3 MiB budget: status %d Retry-After %q, want 503 busy with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if hits.Load() != 0 {
		t.Fatalf("the upstream was reached by a request over the budget")
	}
	resp, err = c.Post("http://"+addr.String()+"/small", "application/octet-stream", bytes.NewReader(make([]byte, 1<<20)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("1 MiB body: status %d, want 200 (the budget was given back)", resp.StatusCode)
	}
}
