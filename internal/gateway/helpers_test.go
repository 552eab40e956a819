package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/amber-run/amber/internal/gateway"
	"github.com/amber-run/amber/stores/sqlite"
)

// ledger is a "payments" server on 127.0.0.1. POST /charge with
// {"step":N,...} books a charge. With idempotent set it honours
// Idempotency-Key: a repeated key books nothing and returns the first answer.
type ledger struct {
	srv        *httptest.Server
	idempotent bool

	mu       sync.Mutex
	charges  map[int]int // step → charges booked
	requests map[int]int // step → requests received
	seenKeys map[string][]byte
	total    int
	lastAuth string
}

func newLedger(t testing.TB, idempotent bool) *ledger {
	l := &ledger{idempotent: idempotent, charges: map[int]int{}, requests: map[int]int{}, seenKeys: map[string][]byte{}}
	l.srv = httptest.NewServer(http.HandlerFunc(l.serve))
	t.Cleanup(l.srv.Close)
	return l
}

func (l *ledger) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total++
	l.lastAuth = r.Header.Get("Authorization")
	switch r.URL.Path {
	case "/charge":
		var c struct {
			Step int `json:"step"`
		}
		if err := json.Unmarshal(body, &c); err != nil {
			http.Error(w, "bad charge", http.StatusBadRequest)
			return
		}
		l.requests[c.Step]++
		key := r.Header.Get("Idempotency-Key")
		if l.idempotent && key != "" {
			if prev, ok := l.seenKeys[key]; ok {
				w.Header().Set("Idempotent-Replayed", "true")
				w.Write(prev)
				return
			}
		}
		l.charges[c.Step]++
		resp := fmt.Appendf(nil, `{"charge":"ch_%d_%d","step":%d}`, c.Step, l.charges[c.Step], c.Step)
		if l.idempotent && key != "" {
			l.seenKeys[key] = resp
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(resp)
	case "/echo-auth":
		// A careless upstream that reflects the credential it received.
		w.Header().Set("X-Seen-Authorization", r.Header.Get("Authorization"))
		fmt.Fprintf(w, "you sent %s", r.Header.Get("Authorization"))
	case "/big":
		w.Write(bytes.Repeat([]byte("x"), 4096))
	default:
		fmt.Fprintf(w, "ok %s %s", r.Method, r.URL.Path)
	}
}

func (l *ledger) auth() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastAuth
}

func (l *ledger) addr() netip.AddrPort {
	return netip.MustParseAddrPort(l.srv.Listener.Addr().String())
}

func (l *ledger) snapshot() (charges, requests map[int]int, total int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	charges, requests = map[int]int{}, map[int]int{}
	for k, v := range l.charges {
		charges[k] = v
	}
	for k, v := range l.requests {
		requests[k] = v
	}
	return charges, requests, l.total
}

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
