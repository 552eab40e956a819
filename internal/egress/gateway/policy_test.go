package gateway_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/internal/egress/gateway"
)

// fakeResolver answers from a table; no network.
type fakeResolver map[string]string

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func get(t *testing.T, c *http.Client, url, host string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if host != "" {
		req.Host = host
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestPolicy(t *testing.T) {
	ctx := context.Background()
	led := newLedger(t, false)
	clk := clock.NewFake(time.Unix(1e9, 0))
	var ds decisions
	gw := gateway.New(gateway.Options{Logger: quietLog, Clock: clk, OnDecision: ds.add,
		Resolver: fakeResolver{"api.example.com": "127.0.0.1", "rebind.example.com": "10.1.2.3"}})
	defer gw.Close()
	start := func(p gateway.Policy) {
		if err := gw.StartRun(ctx, gateway.Run{Tenant: "acme", Sandbox: "sb-pol", ID: "c0", Policy: p}); err != nil {
			t.Fatal(err)
		}
	}
	f := newFront(t, gw, led.addr(), "sb-pol")
	c := f.client()
	url := "http://" + led.addr().String() + "/x"

	cases := []struct {
		name   string
		policy gateway.Policy
		host   string
		want   int
	}{
		{"empty policy denies", gateway.Policy{}, "", 403},
		{"allowlisted loopback still in a denied range", gateway.Policy{Allow: []string{led.addr().String()}}, "", 403},
		{"loopback explicitly allowed", allowLoopback(led.addr()), "", 200},
		{"host not in the allowlist", allowLoopback(led.addr()), "evil.example.com", 403},
		{"name allowed, resolves to allowed loopback", gateway.Policy{Allow: []string{"*.example.com:*"},
			AllowNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, "api.example.com", 200},
		{"name allowed, resolves into a private range", gateway.Policy{Allow: []string{"*.example.com:*"},
			AllowNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, "rebind.example.com", 403},
		{"wrong port", gateway.Policy{Allow: []string{"127.0.0.1:1"},
			AllowNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, "", 403},
	}
	for _, tc := range cases {
		start(tc.policy)
		resp, body := get(t, c, url, tc.host)
		if resp.StatusCode != tc.want {
			t.Errorf("%s: status %d (%s), want %d", tc.name, resp.StatusCode, strings.TrimSpace(body), tc.want)
		}
		if tc.want == 403 && resp.Header.Get(gateway.HeaderError) != "denied" {
			t.Errorf("%s: %s = %q, want denied", tc.name, gateway.HeaderError, resp.Header.Get(gateway.HeaderError))
		}
	}
	if _, _, n := led.snapshot(); n != 2 {
		t.Errorf("upstream received %d requests, want 2 (only the allowed ones)", n)
	}
	if k := ds.kinds(); k["deny"] != 5 || k["forward"] != 2 {
		t.Errorf("decisions %v, want 5 deny and 2 forward", k)
	}
	for _, d := range ds.ds {
		if d.Kind == "deny" && d.Reason == "" {
			t.Errorf("deny decision without a reason: %+v", d)
		}
	}

	// Rate limit: 2 requests per second, burst 2, on the fake clock.
	p := allowLoopback(led.addr())
	p.RequestsPerSecond, p.Burst = 2, 2
	start(p)
	var codes []int
	for range 3 {
		resp, _ := get(t, c, url, "")
		codes = append(codes, resp.StatusCode)
	}
	clk.Advance(time.Second)
	resp, _ := get(t, c, url, "")
	codes = append(codes, resp.StatusCode)
	if want := []int{200, 200, 429, 200}; !equalInts(codes, want) {
		t.Errorf("rate limited codes %v, want %v", codes, want)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestStream: non-HTTP TCP is proxied to the original destination as a
// counted stream — client-first and server-first protocols — and refused
// when the policy says so.
func TestStream(t *testing.T) {
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte("220 hello\n")) // the server speaks first
				line, err := bufio.NewReader(c).ReadString('\n')
				if err == nil {
					c.Write([]byte("echo " + line))
				}
			}()
		}
	}()
	dst := netip.MustParseAddrPort(ln.Addr().String())
	var ds decisions
	gw := gateway.New(gateway.Options{Logger: quietLog, OnDecision: ds.add, SniffTimeout: 50 * time.Millisecond})
	if err := gw.StartRun(ctx, gateway.Run{Tenant: "acme", Sandbox: "sb-tcp", ID: "c0", Policy: allowLoopback(dst)}); err != nil {
		t.Fatal(err)
	}
	f := newFront(t, gw, dst, "sb-tcp")
	c, err := net.Dial("tcp", f.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	if l, err := r.ReadString('\n'); err != nil || l != "220 hello\n" {
		t.Fatalf("banner %q %v", l, err)
	}
	c.Write([]byte("ping\n"))
	if l, err := r.ReadString('\n'); err != nil || l != "echo ping\n" {
		t.Fatalf("echo %q %v", l, err)
	}
	c.Close()
	waitFor(t, func() bool { return ds.kinds()["stream"] == 1 })
	d := ds.ds[0]
	if d.BytesIn != int64(len("220 hello\necho ping\n")) || d.BytesOut != int64(len("ping\n")) {
		t.Errorf("stream counted in %d out %d", d.BytesIn, d.BytesOut)
	}

	// Denied: another port on loopback.
	if err := gw.StartRun(ctx, gateway.Run{Tenant: "acme", Sandbox: "sb-tcp", ID: "c1", Policy: gateway.Policy{}}); err != nil {
		t.Fatal(err)
	}
	c, err = net.Dial("tcp", f.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("denied stream delivered %d bytes", n)
	}
	c.Close()
	waitFor(t, func() bool { return ds.kinds()["deny"] == 1 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met in 5s")
}

// TestUpgradeStreams: a request switching protocols (WebSocket-style) is
// proxied as a stream after the 101, not journaled.
func TestUpgradeStreams(t *testing.T) {
	up := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want upgrade", 400)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw)
	}))
	dst := netip.MustParseAddrPort(up.Listener.Addr().String())
	var ds decisions
	gw := gateway.New(gateway.Options{Logger: quietLog, OnDecision: ds.add})
	if err := gw.StartRun(context.Background(), gateway.Run{Tenant: "a", Sandbox: "s", ID: "c", Policy: allowLoopback(dst)}); err != nil {
		t.Fatal(err)
	}
	f := newFront(t, gw, dst, "s")
	c, err := net.Dial("tcp", f.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: "+dst.String()+"\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(c, "frame-1\n")
	if l, err := br.ReadString('\n'); err != nil || l != "frame-1\n" {
		t.Fatalf("echo %q %v", l, err)
	}
	if ds.kinds()["stream"] != 1 {
		t.Fatalf("decisions %v", ds.kinds())
	}
}
