package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/egress/gateway"
)

// hostService is a service of the host's on addr (a listener the test
// starts); hits counts the connections it accepted.
func hostService(t *testing.T, network, addr string) (netip.AddrPort, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	var hits atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "host secret")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return netip.MustParseAddrPort(ln.Addr().String()), &hits
}

// rawGet sends one request written by hand (Go's client strips zones from
// a Host) through the gateway front and returns the status.
func rawGet(t *testing.T, f *front, target, host string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", f.ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target, host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s Host %s: %v", target, host, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A sandbox names a host service on [::1] with a zone: netip.Prefix.Contains
// never matches a zoned address, so the deny list passed it and the gateway
// dialled [::1]. The zone is refused (400) before any decision now, in the
// Host header and in an absolute-form request line alike; the dial guard
// refuses a zoned address too.
func TestGatewayDeniesZonedLoopback(t *testing.T) {
	svc, hits := hostService(t, "tcp6", "[::1]:0")
	ctx := context.Background()
	gw := gateway.New(gateway.Options{Logger: quietLog})
	defer gw.Close()
	if err := gw.StartRun(ctx, gateway.Run{Tenant: "acme", Sandbox: "sb-zone", ID: "c0",
		Policy: gateway.Policy{Allow: []string{"*:*"}}}); err != nil {
		t.Fatal(err)
	}
	f := newFront(t, gw, svc, "sb-zone")
	p := svc.Port()

	// Control: the unzoned address is denied (it was before, too).
	if got := rawGet(t, f, "/", fmt.Sprintf("[::1]:%d", p)); got != http.StatusForbidden {
		t.Fatalf("Host [::1]: status %d, want 403", got)
	}
	for _, tc := range []struct{ target, host string }{
		{"/", fmt.Sprintf("[::1%%25x]:%d", p)},
		{"/", fmt.Sprintf("[::1%%x]:%d", p)},
		{"/", "[::1%25x]"},
		{fmt.Sprintf("http://[::1%%25x]:%d/", p), "example.com"},
		{"/", fmt.Sprintf("[0:0:0:0:0:0:0:1%%25lo]:%d", p)},
		{"/", fmt.Sprintf("[::ffff:127.0.0.1%%25x]:%d", p)},
	} {
		if got := rawGet(t, f, tc.target, tc.host); got != http.StatusBadRequest {
			t.Errorf("GET %s Host %s: status %d, want 400 (a zone names no destination)", tc.target, tc.host, got)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the host service on [::1] was reached %d times through the gateway", n)
	}

	// The daemon's own dials on a tenant's behalf (GuardedDialer).
	d := gateway.GuardedDialer(nil, 2*time.Second)
	for _, a := range []string{fmt.Sprintf("[::1%%25x]:%d", p), fmt.Sprintf("[::1%%x]:%d", p)} {
		if c, err := d.Dial("tcp6", a); err == nil {
			c.Close()
			t.Errorf("GuardedDialer dialled %s", a)
		} else if !strings.Contains(err.Error(), "refusing") {
			t.Errorf("GuardedDialer %s: %v, want a refusal", a, err)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the host service on [::1] was reached %d times", n)
	}
}

// IPv6 forms that embed an IPv4 address are decided by that address:
// NAT64's well-known prefix, 6to4, IPv4-mapped and IPv4-compatible. NAT64
// and 6to4 to a public IPv4 address stay allowed (a decision, never a
// dial). Teredo is denied whole.
func TestGatewayDeniesEmbeddedIPv4(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		denied bool
	}{
		{"64:ff9b::7f00:1", true},                      // NAT64 → 127.0.0.1
		{"64:ff9b::a9fe:a9fe", true},                   // NAT64 → 169.254.169.254 (metadata)
		{"64:ff9b::a00:1", true},                       // NAT64 → 10.0.0.1
		{"64:ff9b::c0a8:101", true},                    // NAT64 → 192.168.1.1
		{"64:ff9b::808:808", false},                    // NAT64 → 8.8.8.8: public, allowed
		{"64:ff9b:1::808:808", true},                   // local-use NAT64: denied whole
		{"2002:7f00:1::", true},                        // 6to4 → 127.0.0.1
		{"2002:a9fe:a9fe::1", true},                    // 6to4 → 169.254.169.254
		{"2002:808:808::1", false},                     // 6to4 → 8.8.8.8
		{"::ffff:127.0.0.1", true},                     // IPv4-mapped
		{"::ffff:169.254.169.254", true},               // IPv4-mapped metadata
		{"::127.0.0.1", true},                          // IPv4-compatible
		{"::10.0.0.1", true},                           // IPv4-compatible
		{"::8.8.8.8", false},                           // IPv4-compatible public
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", true}, // Teredo
		{"fd00:ec2::254", true},                        // IPv6 metadata (ULA)
		{"fec0::1", true},                              // site-local
		{"2606:4700::1111", false},                     // a public IPv6 address
		{"8.8.8.8", false},
	} {
		if got := gateway.AddrDenied(netip.MustParseAddr(tc.addr)); got != tc.denied {
			t.Errorf("AddrDenied(%s) = %v, want %v", tc.addr, got, tc.denied)
		}
	}
}

// The host's own addresses (every interface's) are denied whatever range
// they are in: with the deny list emptied by the policy, a service on
// 127.0.0.1 is still refused, as is every address net.InterfaceAddrs lists.
func TestGatewayDeniesHostAddrs(t *testing.T) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, _ := netip.AddrFromSlice(ipn.IP)
		if !gateway.AddrDenied(ip.Unmap()) {
			t.Errorf("the host's address %s (%s) is not denied", ip.Unmap(), a)
		}
	}
	svc, hits := hostService(t, "tcp4", "127.0.0.1:0")
	noList := &gateway.Policy{DeniedNets: []netip.Prefix{}}
	if c, err := gateway.GuardedDialer(noList, 2*time.Second).Dial("tcp", svc.String()); err == nil {
		c.Close()
		t.Errorf("with an empty deny list, GuardedDialer dialled the host's %s", svc)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the host service was reached %d times", n)
	}
}
