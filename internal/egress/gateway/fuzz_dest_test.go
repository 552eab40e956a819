package gateway_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/egress/gateway"
)

// fuzzPool is what the fuzz resolver answers: denied addresses in every
// spelling, and public ones (never dialled: the fuzz dialer only records).
var fuzzPool = []string{
	"127.0.0.1", "::1", "10.0.0.1", "169.254.169.254", "fd00:ec2::254", "fe80::1%eth0", "::1%x",
	"64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "2002:7f00:1::", "::ffff:127.0.0.1", "::127.0.0.1",
	"2001:0:4136:e378:8000:63bf:3fff:fdd2", "100.64.0.1", "192.0.2.2",
	"8.8.8.8", "2606:4700::1111", "64:ff9b::808:808", "2002:808:808::1",
}

// hashResolver maps every name to an address of fuzzPool.
type hashResolver struct{}

func (hashResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	h := fnv.New32a()
	h.Write([]byte(host))
	return []netip.Addr{netip.MustParseAddr(fuzzPool[h.Sum32()%uint32(len(fuzzPool))])}, nil
}

// dialRecorder records what the gateway would dial and dials nothing.
type dialRecorder struct {
	mu    sync.Mutex
	addrs []string
}

var errNotDialled = errors.New("fuzz: not dialled")

func (d *dialRecorder) dial(_ context.Context, _, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.addrs = append(d.addrs, addr)
	d.mu.Unlock()
	return nil, errNotDialled
}

func (d *dialRecorder) take() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	a := d.addrs
	d.addrs = nil
	return a
}

var hostSet = sync.OnceValue(func() map[netip.Addr]bool {
	m := map[netip.Addr]bool{}
	as, _ := net.InterfaceAddrs()
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				m[ip.Unmap()] = true
			}
		}
	}
	return m
})

// inDenyList is the property's oracle, written apart from the gateway's
// code: zoned, in DefaultDeniedNets, embedding a denied IPv4 address
// (NAT64 well-known prefix, 6to4, IPv4-compatible), or the host's.
func inDenyList(a netip.Addr) bool {
	if a.Zone() != "" {
		return true
	}
	a = a.Unmap()
	in := func(x netip.Addr) bool {
		for _, n := range gateway.DefaultDeniedNets {
			if n.Contains(x) {
				return true
			}
		}
		return hostSet()[x]
	}
	if in(a) {
		return true
	}
	if a.Is6() {
		b := a.As16()
		var v4 netip.Addr
		switch {
		case b[0] == 0 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b && allZero(b[4:12]), allZero(b[:12]):
			v4 = netip.AddrFrom4([4]byte(b[12:]))
		case b[0] == 0x20 && b[1] == 0x02:
			v4 = netip.AddrFrom4([4]byte(b[2:6]))
		}
		if v4.IsValid() && in(v4) {
			return true
		}
	}
	return false
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func clean(s string) string { return strings.NewReplacer("\r", "", "\n", "").Replace(s) }

// destHarness is a gateway whose policy allows every destination, whose
// resolver answers from fuzzPool and whose dialer only records. send runs
// one HTTP request (Host host, request target target) and one non-HTTP
// stream to the name host through it, both with original destination
// orig — or, with raw, one connection carrying raw — and returns what
// would have been dialled.
func destHarness(t testing.TB) (send func(host, target string, orig netip.AddrPort, raw ...string) []string) {
	rec := &dialRecorder{}
	gw := gateway.New(gateway.Options{Logger: quietLog, Resolver: hashResolver{}, Dial: rec.dial,
		SniffTimeout: 5 * time.Millisecond, DialTimeout: time.Second})
	t.Cleanup(func() { gw.Close() })
	if err := gw.StartRun(context.Background(), gateway.Run{Tenant: "acme", Sandbox: "sb-fuzz", ID: "c0",
		Policy: gateway.Policy{Allow: []string{"*:*"}}}); err != nil {
		t.Fatal(err)
	}
	return func(host, target string, orig netip.AddrPort, raw ...string) []string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, s := net.Pipe()
		done := make(chan struct{})
		go func() { gw.ServeConn(ctx, s, orig, "sb-fuzz"); close(done) }()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if len(raw) > 0 {
			go func() { c.Write([]byte(raw[0])); time.Sleep(20 * time.Millisecond); c.Close() }()
			io.Copy(io.Discard, c)
			<-done
			return rec.take()
		}
		go fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target, host)
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			resp.Body.Close()
		}
		c.Close()
		<-done

		c, s = net.Pipe()
		done = make(chan struct{})
		go func() { gw.ServeConnTo(ctx, s, orig, host, "sb-fuzz"); close(done) }()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		go c.Write([]byte{0x00, 0x01, 0x02})
		time.Sleep(time.Millisecond)
		c.Close()
		<-done
		return rec.take()
	}
}

// The harness of FuzzGatewayDest sees dials (it is not vacuous): NAT64 and
// 6to4 to a public address are dialled — recorded, never sent — at the
// address decided on, and their loopback forms are not.
func TestGatewayDestDecisions(t *testing.T) {
	send := destHarness(t)
	orig := netip.MustParseAddrPort("203.0.113.9:80")
	for _, tc := range []struct {
		host, target string
		want         []string
	}{
		{"[64:ff9b::808:808]", "/", []string{"[64:ff9b::808:808]:80", "[64:ff9b::808:808]:80"}},
		{"[2002:808:808::1]:80", "/", []string{"[2002:808:808::1]:80", "[2002:808:808::1]:80"}},
		{"example.com", "http://[64:ff9b::808:808]:80/", []string{"[64:ff9b::808:808]:80"}},
		{"[64:ff9b::7f00:1]", "/", nil},
		{"[2002:7f00:1::]", "/", nil},
		{"[::ffff:127.0.0.1]", "/", nil},
		{"[::1%25x]", "/", nil},
		{"[fd00:ec2::254%25x]", "/", nil},
		{"example.com", "http://[fd00:ec2::254%25x]/", nil},
		{"[64:ff9b::a9fe:a9fe]", "/", nil},
	} {
		got := send(tc.host, tc.target, orig)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("Host %s target %s: dialled %v, want %v", tc.host, tc.target, got, tc.want)
		}
	}
	// An HTTP/1.1 CONNECT is no request the gateway serves: the bytes are a
	// stream to the original destination, checked as such; its target is
	// never dialled.
	if got := send("", "", netip.MustParseAddrPort("9.9.9.9:80"), "CONNECT [::1%25x]:80 HTTP/1.1\r\nHost: [::1%25x]:80\r\n\r\n"); fmt.Sprint(got) != "[9.9.9.9:80]" {
		t.Errorf("CONNECT [::1%%25x]:80 from a connection to 9.9.9.9:80: dialled %v, want [9.9.9.9:80]", got)
	}
	undo := gateway.PretendHostAddrs(netip.MustParseAddr("9.9.9.9"))
	defer undo()
	if got := send("9.9.9.9", "/", orig); len(got) != 0 {
		t.Errorf("a host address (pretended 9.9.9.9): dialled %v", got)
	}
	if got := send("[64:ff9b::909:909]", "/", orig); len(got) != 0 {
		t.Errorf("NAT64 of a host address: dialled %v", got)
	}
}

// FuzzGatewayDest sends a request with a fuzzed Host header and request
// target (origin or absolute form) through the gateway, then a non-HTTP
// stream to a fuzzed name, with a fuzzed original destination, under a
// policy that allows every destination: whatever the spelling, nothing in
// the deny list is ever dialled.
func FuzzGatewayDest(f *testing.F) {
	for _, s := range []struct{ host, target string }{
		{"[::1%25x]:80", "/"}, {"[::ffff:127.0.0.1]", "/"}, {"[64:ff9b::7f00:1]:80", "/"}, {"64:ff9b::7f00:1", "/"},
		{"[2002:7f00:1::]", "/"}, {"[fd00:ec2::254%25x]", "/"}, {"example.com", "http://[::1%25x]:80/"},
		{"example.com", "http://[64:ff9b::7f00:1]/x"}, {"[::127.0.0.1]", "/"}, {"169.254.169.254", "/"},
		{"[::1]", "/"}, {"0x7f.1", "/"}, {"2130706433", "/"}, {"[fe80::1%eth0]:80", "/"}, {"", "/"},
		{"[64:ff9b::808:808]", "/"}, {"api.example.com", "/"},
	} {
		f.Add(s.host, s.target, []byte(netip.MustParseAddr("203.0.113.9").AsSlice()), uint16(80))
	}
	f.Add("[::1%25x]", "/", []byte(netip.IPv6Loopback().AsSlice()), uint16(443))
	send := destHarness(f)
	f.Fuzz(func(t *testing.T, host, target string, dst []byte, port uint16) {
		ip, ok := netip.AddrFromSlice(dst)
		if !ok {
			ip = netip.MustParseAddr("203.0.113.9")
		}
		orig := netip.AddrPortFrom(ip, port)
		host, target = clean(host), clean(target)
		for _, a := range send(host, target, orig) {
			ap, err := netip.ParseAddrPort(a)
			if err != nil {
				t.Fatalf("Host %q target %q dst %s: dialled %q, not an address", host, target, orig, a)
			}
			if inDenyList(ap.Addr()) {
				t.Fatalf("Host %q target %q dst %s: dialled %s, in the deny list", host, target, orig, a)
			}
		}
	})
}
