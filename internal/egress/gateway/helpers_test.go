package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/amber-run/amber/internal/egress/egresstest"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/stores/sqlite"
)

// ledger is the shared payments server (egresstest.Ledger) under the
// names these tests use.
type ledger struct{ *egresstest.Ledger }

func newLedger(t testing.TB, idempotent bool) *ledger {
	return &ledger{egresstest.NewLedger(t, idempotent)}
}

func (l *ledger) addr() netip.AddrPort { return l.Addr() }

func (l *ledger) snapshot() (charges, requests map[int]int, total int) { return l.Snapshot() }

func (l *ledger) auth() string { return l.LastAuth() }

// front is the gateway listening on a loopback port, standing in for the
// network plumbing: every accepted connection is handed to ServeConn with a
// fixed original destination.
type front struct {
	ln      net.Listener
	mu      sync.Mutex
	gw      *gateway.Gateway
	origDst netip.AddrPort
	sandbox string
	wg      sync.WaitGroup
}

func newFront(t testing.TB, gw *gateway.Gateway, origDst netip.AddrPort, sandbox string) *front {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &front{ln: ln, gw: gw, origDst: origDst, sandbox: sandbox}
	ctx, cancel := context.WithCancel(context.Background())
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			gw, dst := f.gw, f.origDst
			f.mu.Unlock()
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				gw.ServeConn(ctx, c, dst, f.sandbox)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		cancel()
		f.wg.Wait()
	})
	return f
}

// setGateway swaps the gateway new connections reach (a daemon restart).
func (f *front) setGateway(gw *gateway.Gateway) {
	f.mu.Lock()
	f.gw = gw
	f.mu.Unlock()
}

func (f *front) setDst(d netip.AddrPort) {
	f.mu.Lock()
	f.origDst = d
	f.mu.Unlock()
}

// client returns an HTTP client whose every connection reaches the gateway,
// as a sandboxed program's would. Keep-alives are off so a dropped connection
// is never retried by the transport behind the test's back.
func (f *front) client() *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", f.ln.Addr().String())
			},
		},
	}
}

func openStore(t testing.TB, path string) *sqlite.Store {
	s, err := sqlite.Open(path, sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func storePath(t testing.TB) string { return filepath.Join(t.TempDir(), "log.db") }

// acquire takes the lease of the sandbox's effects stream for holder.
func acquire(t testing.TB, s eventlog.Store, sandbox, holder string) uint64 {
	l, err := s.Acquire(context.Background(), gateway.Stream(sandbox), holder, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return l.Epoch
}

// allowLoopback is a policy that reaches exactly addr on loopback.
func allowLoopback(addr netip.AddrPort) gateway.Policy {
	return gateway.Policy{
		Allow:     []string{addr.String()},
		AllowNets: []netip.Prefix{netip.PrefixFrom(addr.Addr(), addr.Addr().BitLen())},
	}
}

// charge is one step of the program: POST /charge through the gateway.
// A transport error (the gateway dropped the connection) comes back as err.
func charge(c *http.Client, target string, step int) (int, string, error) {
	body := fmt.Sprintf(`{"step":%d,"amount":100,"currency":"eur"}`, step)
	resp, err := c.Post("http://"+target+"/charge", "application/json", bytes.NewBufferString(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", err
	}
	return resp.StatusCode, string(b), nil
}

// readStream returns every event of stream.
func readStream(t testing.TB, s eventlog.Store, stream string) []eventlog.Event {
	evs, err := s.Read(context.Background(), stream, 1, 100000)
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	return evs
}

// decisions collects reported decisions.
type decisions struct {
	mu sync.Mutex
	ds []gateway.Decision
}

func (d *decisions) add(x gateway.Decision) {
	d.mu.Lock()
	d.ds = append(d.ds, x)
	d.mu.Unlock()
}

func (d *decisions) kinds() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := map[string]int{}
	for _, x := range d.ds {
		m[x.Kind]++
	}
	return m
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

var quietLog = slog.New(slog.DiscardHandler)

type eventStore = eventlog.Store

func httptestServer(t testing.TB, h http.Handler) *httptest.Server {
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

func netipAddrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
