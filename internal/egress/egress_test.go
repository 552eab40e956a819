package egress_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/egress"
	"github.com/amber-run/amber/internal/egress/egresstest"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/lib/netns"
	"github.com/amber-run/amber/stores/sqlite"
	"golang.org/x/net/dns/dnsmessage"
)

type fixture struct {
	net     *egress.Network
	gw      *gateway.Gateway
	store   *sqlite.Store
	sbxNS   string
	sandbox string
	hits    atomic.Int64
	srvPort uint16
	denied  []gateway.Decision
}

// setup makes a sandbox namespace (as a driver would), plumbs it, and runs
// a gateway whose policy reaches exactly "payments.test" = an HTTP server on
// 127.0.0.1.
func setup(t *testing.T) *fixture {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	f := &fixture{sandbox: "sbx-egress-" + fmt.Sprint(time.Now().UnixNano()%1e6)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.hits.Add(1)
		fmt.Fprintf(w, "hello %s %s", r.Method, r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	up := netip.MustParseAddrPort(srv.Listener.Addr().String())
	f.srvPort = up.Port()

	dir := t.TempDir()
	var err error
	f.store, err = sqlite.Open(filepath.Join(dir, "log.db"), sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.store.Close() })
	f.gw = gateway.New(gateway.Options{
		Journal:  gateway.NewJournal(f.store),
		Resolver: egresstest.Hosts{"payments.test": up.Addr()},
		OnDecision: func(d gateway.Decision) {
			if d.Kind == "deny" {
				f.denied = append(f.denied, d)
			}
		},
	})
	l, err := f.store.Acquire(context.Background(), gateway.Stream(f.sandbox), "node-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	err = f.gw.StartRun(context.Background(), gateway.Run{Tenant: "t1", Sandbox: f.sandbox, ID: "run-1", Epoch: l.Epoch,
		Policy: gateway.Policy{
			Allow:     []string{fmt.Sprintf("payments.test:%d", up.Port())},
			AllowNets: []netip.Prefix{netip.PrefixFrom(up.Addr(), 32)},
		}})
	if err != nil {
		t.Fatal(err)
	}
	f.sbxNS = filepath.Join(dir, "sbx.netns")
	if err := netns.Create(f.sbxNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(f.sbxNS) })
	f.net, err = egress.New(filepath.Join(dir, "gw"), f.gw, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.net.Unplumb(context.Background(), f.sandbox); err != nil {
			t.Error(err)
		}
		f.net.Close()
	})
	if err := f.net.Plumb(context.Background(), f.sandbox, f.sbxNS); err != nil {
		t.Fatal(err)
	}
	return f
}

// inSandbox runs fn in the sandbox's namespace, as a sandboxed program.
func (f *fixture) inSandbox(t *testing.T, fn func() error) error {
	t.Helper()
	return netns.Do(f.sbxNS, fn)
}

// resolve asks the gateway's DNS for name's A record, as the sandbox's
// resolv.conf says. It must run inside inSandbox: the socket is made on the
// calling (locked) thread. (net.Resolver would dial from other threads,
// outside the sandbox's namespace.)
func resolve(name string) (netip.Addr, error) {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, err := b.Finish()
	if err != nil {
		return netip.Addr{}, err
	}
	c, err := net.Dial("udp", netip.AddrPortFrom(egress.GatewayAddr, 53).String())
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	if _, err := c.Write(q); err != nil {
		return netip.Addr{}, err
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		return netip.Addr{}, err
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf[:n]); err != nil {
		return netip.Addr{}, err
	}
	for _, a := range m.Answers {
		if r, ok := a.Body.(*dnsmessage.AResource); ok {
			return netip.AddrFrom4(r.A), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no A record for %s (rcode %v)", name, m.RCode)
}

func TestEgressThroughGateway(t *testing.T) {
	f := setup(t)
	var standIn netip.Addr
	var body string
	err := f.inSandbox(t, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		standIn, err = resolve("payments.test")
		if err != nil {
			return fmt.Errorf("resolve: %w", err)
		}
		// Connect by address: the dial happens in this namespace.
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", netip.AddrPortFrom(standIn, f.srvPort).String())
		if err != nil {
			return fmt.Errorf("dial: %w", err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /orders HTTP/1.1\r\nHost: payments.test:%d\r\nConnection: close\r\n\r\n", f.srvPort)
		b, err := io.ReadAll(c)
		body = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !egress.StandIns.Contains(standIn) {
		t.Fatalf("payments.test resolved to %s, want a stand-in in %s", standIn, egress.StandIns)
	}
	if !strings.Contains(body, "hello GET /orders") {
		t.Fatalf("response through the gateway: %q", body)
	}
	if f.hits.Load() != 1 {
		t.Fatalf("upstream hits = %d, want 1", f.hits.Load())
	}
	// The name and the request are in the journal.
	names, err := f.gw.Names(context.Background(), f.sandbox)
	if err != nil || names["payments.test"] != standIn {
		t.Fatalf("journaled names %v (%v), want payments.test=%s", names, err, standIn)
	}
	evs, err := f.store.Read(context.Background(), gateway.Stream(f.sandbox), 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]int{}
	for _, ev := range evs {
		types[ev.Type]++
	}
	if types[gateway.EventIntent] != 1 || types[gateway.EventOutcome] != 1 || types[gateway.EventName] != 1 {
		t.Fatalf("journal events %v", types)
	}
}

func TestEgressStreamByName(t *testing.T) {
	f := setup(t)
	// A non-HTTP protocol where the client speaks first with no Host: the
	// gateway finds the name from the stand-in address and proxies a stream.
	err := f.inSandbox(t, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a, err := resolve("payments.test")
		if err != nil {
			return err
		}
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", netip.AddrPortFrom(a, f.srvPort).String())
		if err != nil {
			return err
		}
		defer c.Close()
		// Not an HTTP method the sniffer knows: a stream. The upstream (an
		// HTTP server) answers 400 to it; any answer proves the path.
		fmt.Fprintf(c, "HELLO\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		if !strings.Contains(string(b), "400") {
			return fmt.Errorf("stream answer %q, want the upstream's 400", b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestEgressIsolation(t *testing.T) {
	f := setup(t)
	err := f.inSandbox(t, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var d net.Dialer
		// The host's loopback is not the sandbox's: the test server on the
		// host's 127.0.0.1 cannot be reached directly.
		if c, err := d.DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", f.srvPort)); err == nil {
			c.Close()
			return errors.New("the host's loopback server was reachable from the sandbox")
		}
		// Any other address ends at the gateway, which refuses what the
		// policy does not allow: a public address not in the allowlist, the
		// gateway's own address, a stand-in nobody resolved.
		for _, dst := range []string{"203.0.113.7:80", "10.254.0.1:22", "198.18.9.9:80"} {
			c, err := d.DialContext(ctx, "tcp", dst)
			if err != nil {
				continue // refused outright is fine too
			}
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", dst)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			b, _ := io.ReadAll(c)
			c.Close()
			if !strings.Contains(string(b), "403") {
				return fmt.Errorf("%s answered %q, want the gateway's 403", dst, b)
			}
		}
		// UDP other than DNS goes nowhere (no reply, no error beyond a timeout).
		u, err := net.Dial("udp", "203.0.113.7:9999")
		if err != nil {
			return nil
		}
		defer u.Close()
		u.Write([]byte("x"))
		u.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := u.Read(make([]byte, 10)); err == nil {
			return errors.New("a UDP packet to the outside got an answer")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if f.hits.Load() != 0 {
		t.Fatalf("upstream was hit %d times", f.hits.Load())
	}
	if len(f.denied) < 3 {
		t.Fatalf("denied decisions %d, want 3: %+v", len(f.denied), f.denied)
	}
}

func TestPlumbIdempotentAndUnplumb(t *testing.T) {
	f := setup(t)
	// Again (a restore): no error, still works.
	if err := f.net.Plumb(context.Background(), f.sandbox, f.sbxNS); err != nil {
		t.Fatal(err)
	}
	gw := f.net.GatewayNetns(f.sandbox)
	if !netns.Pinned(gw) {
		t.Fatal("gateway namespace not pinned")
	}
	if err := f.net.Unplumb(context.Background(), f.sandbox); err != nil {
		t.Fatal(err)
	}
	if netns.Pinned(gw) {
		t.Fatal("gateway namespace still pinned after Unplumb")
	}
	// The sandbox end of the veth went with the pair.
	err := f.inSandbox(t, func() error {
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		for _, i := range ifs {
			if i.Name == egress.SandboxIface {
				return errors.New("eth0 left in the sandbox namespace")
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
