// Package egresstest runs a real egress path for tests: an event-log store,
// a journaling gateway, an egress Network, and a "payments" server with a
// ledger on 127.0.0.1 that the sandbox reaches by name through the gateway.
package egresstest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/egress"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/stores/sqlite"
)

// Ledger is a payments server on 127.0.0.1: POST /charge with
// {"step":N} books a charge; with Idempotent it honours Idempotency-Key (a
// repeated key books nothing and gets the first answer, marked
// Idempotent-Replayed). GET /ping answers "pong"; /echo-auth reflects the
// Authorization it received, as a careless server would; /big answers
// 4 KiB; any other path answers "ok METHOD PATH".
type Ledger struct {
	Server     *httptest.Server
	Idempotent bool

	mu       sync.Mutex
	charges  map[int]int // step → charges booked
	perStep  map[int]int // step → charge requests received
	requests int
	lastAuth string
	seen     map[string][]byte
}

// NewLedger starts a ledger, closed when the test ends.
func NewLedger(t testing.TB, idempotent bool) *Ledger {
	l := &Ledger{Idempotent: idempotent, charges: map[int]int{}, perStep: map[int]int{}, seen: map[string][]byte{}}
	l.Server = httptest.NewServer(http.HandlerFunc(l.serve))
	t.Cleanup(l.Server.Close)
	return l
}

// NewTLSLedger is NewLedger serving HTTPS (httptest's certificate, for
// example.com; trust Server.Certificate()).
func NewTLSLedger(t testing.TB, idempotent bool) *Ledger {
	l := &Ledger{Idempotent: idempotent, charges: map[int]int{}, perStep: map[int]int{}, seen: map[string][]byte{}}
	l.Server = httptest.NewTLSServer(http.HandlerFunc(l.serve))
	t.Cleanup(l.Server.Close)
	return l
}

// Addr is the ledger's address.
func (l *Ledger) Addr() netip.AddrPort {
	return netip.MustParseAddrPort(l.Server.Listener.Addr().String())
}

func (l *Ledger) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests++
	l.lastAuth = r.Header.Get("Authorization")
	switch r.URL.Path {
	case "/ping":
		fmt.Fprint(w, "pong")
	case "/charge":
		var c struct {
			Step int `json:"step"`
		}
		if err := json.Unmarshal(body, &c); err != nil {
			http.Error(w, "bad charge", http.StatusBadRequest)
			return
		}
		l.perStep[c.Step]++
		key := r.Header.Get("Idempotency-Key")
		if l.Idempotent && key != "" {
			if prev, ok := l.seen[key]; ok {
				w.Header().Set("Idempotent-Replayed", "true")
				w.Write(prev)
				return
			}
		}
		l.charges[c.Step]++
		resp := fmt.Appendf(nil, `{"charge":"ch_%d_%d","step":%d}`, c.Step, l.charges[c.Step], c.Step)
		if l.Idempotent && key != "" {
			l.seen[key] = resp
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(resp)
	case "/echo-auth":
		w.Header().Set("X-Seen-Authorization", r.Header.Get("Authorization"))
		fmt.Fprintf(w, "you sent %s", r.Header.Get("Authorization"))
	case "/big":
		w.Write(bytes.Repeat([]byte("x"), 4096))
	default:
		fmt.Fprintf(w, "ok %s %s", r.Method, r.URL.Path)
	}
}

// Snapshot returns step → charges booked, step → charge requests received,
// and the number of requests of any kind.
func (l *Ledger) Snapshot() (charges, requests map[int]int, total int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.charges), maps.Clone(l.perStep), l.requests
}

// Charges returns step → charges booked.
func (l *Ledger) Charges() map[int]int {
	c, _, _ := l.Snapshot()
	return c
}

// StepRequests counts the charge requests received for step (booked or
// deduplicated).
func (l *Ledger) StepRequests(step int) int {
	_, r, _ := l.Snapshot()
	return r[step]
}

// Requests counts every request the ledger received.
func (l *Ledger) Requests() int {
	_, _, n := l.Snapshot()
	return n
}

// LastAuth is the Authorization header of the latest request.
func (l *Ledger) LastAuth() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastAuth
}

// Hosts is a static resolver: the names tests give their servers.
type Hosts map[string]netip.Addr

func (h Hosts) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := h[host]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, fmt.Errorf("egresstest: unknown host %s", host)
}

// Path is a running egress path.
type Path struct {
	Store   *sqlite.Store
	Gateway *gateway.Gateway
	Network *egress.Network
	Policy  gateway.Policy
}

// Start runs a store, a journaling gateway that resolves hosts, and a
// Network, all closed when the test ends. The policy allows exactly the
// given name → loopback address:port pairs.
func Start(t testing.TB, servers map[string]netip.AddrPort) *Path {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "log.db"), sqlite.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	hosts := Hosts{}
	var pol gateway.Policy
	for name, ap := range servers {
		hosts[name] = ap.Addr()
		pol.Allow = append(pol.Allow, fmt.Sprintf("%s:%d", name, ap.Port()))
		pol.AllowNets = append(pol.AllowNets, netip.PrefixFrom(ap.Addr(), ap.Addr().BitLen()))
	}
	gw := gateway.New(gateway.Options{Journal: gateway.NewJournal(st), Resolver: hosts, Logger: slog.New(slog.DiscardHandler)})
	n, err := egress.New(filepath.Join(dir, "gw"), gw, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return &Path{Store: st, Gateway: gw, Network: n, Policy: pol}
}

// StartRun begins run id of sandbox under a fresh lease on its effects
// stream.
func (p *Path) StartRun(t testing.TB, tenant, sandbox, id string) {
	t.Helper()
	l, err := p.Store.Acquire(context.Background(), gateway.Stream(sandbox), "test-node", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Gateway.StartRun(context.Background(), gateway.Run{Tenant: tenant, Sandbox: sandbox, ID: id, Epoch: l.Epoch, Policy: p.Policy}); err != nil {
		t.Fatal(err)
	}
}
