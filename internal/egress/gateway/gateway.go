package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"go.opentelemetry.io/otel/trace"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/lib/failpoint"
)

// Failpoint names in the forwarding path (see lib/failpoint). When one
// fires the gateway behaves as a crashed process: it drops the client
// connection, writes nothing more, and refuses all later traffic.
const (
	FPBeforeSend   = "gateway.before-send"               // intent durable, nothing sent
	FPAfterSend    = "gateway.after-send-before-outcome" // upstream answered, outcome not recorded
	FPAfterOutcome = "gateway.after-outcome"             // outcome durable, client not answered
	// FPWaitInFlight is counted, never fired: a request waits for an
	// identical one of a previous incarnation still in flight.
	FPWaitInFlight = "gateway.wait-in-flight"
)

// Resolver looks up the addresses of a host name (net.Resolver fits).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configure a Gateway.
type Options struct {
	// Journal records effects. Nil switches journaling off: requests are
	// forwarded as they come (tests use this as the negative control).
	Journal *Journal
	// Secrets resolves placeholders; nil refuses every placeholder.
	Secrets Secrets
	// OnDecision, when set, is called for every decision (allow, deny,
	// replay, …), synchronously; it must not block. Audit plugs in here.
	OnDecision func(Decision)
	Logger     *slog.Logger
	Clock      clock.Clock
	Failpoints *failpoint.Set
	// Fence, when set, is checked right before a request goes upstream
	// (after its intent is durable): an error forwards nothing and answers
	// 503 (fenced when it is errdefs.ErrFenced). The daemon checks its
	// data-dir lease here (internal/host/fence), so a daemon paused between
	// intent and send and taken over meanwhile sends nothing on resuming.
	Fence func(context.Context) error
	// Resolver resolves Host names; default net.DefaultResolver.
	Resolver Resolver
	// Hosts are names the operator maps to addresses (tests and local
	// services: "shop.test" → 127.0.0.1). They are looked up first, and
	// their addresses are exempt from the denied networks when reached by
	// that name only: a sandbox that dials the address itself is refused
	// as before.
	Hosts map[string]netip.Addr
	// DialTimeout bounds a dial upstream; default 10s.
	DialTimeout time.Duration
	// Dial opens every upstream connection (HTTP and streams), always to
	// an IP address the policy checked ("ip:port"); default a net.Dialer
	// with DialTimeout. Tests record here what would have been dialled.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// SniffTimeout is how long ServeConn waits for the client's first bytes
	// to tell HTTP from other TCP before treating the connection as a stream
	// (protocols where the server speaks first); default 300ms.
	SniffTimeout time.Duration
	// MaxRequestBody bounds a request body (413 above); default 8 MiB.
	MaxRequestBody int64
	// MaxJournaledBody bounds a response body stored in the journal; a
	// larger one is recorded as its size only. Default 256 KiB.
	MaxJournaledBody int64
	// MaxRequestsPerSandbox bounds the HTTP requests of one sandbox the
	// gateway serves at once (a protocol upgrade counts until it switched);
	// one more is answered 429 with Retry-After. Default 64.
	MaxRequestsPerSandbox int
	// MaxBufferedPerSandbox bounds the body bytes the gateway holds in
	// memory for one sandbox's requests at once: each request reserves
	// room for the response it may buffer (MaxJournaledBody, or 1 MiB
	// unjournaled) before anything is sent and charges its request body
	// as it is read. A request that does not fit is answered 503 with
	// Retry-After, before its intent is recorded or a byte goes upstream.
	// Default 128 MiB.
	MaxBufferedPerSandbox int64
	// TLS, when set, terminates TLS from sandboxes (a per-tenant CA, see
	// TenantCAs) so HTTPS goes through the journal like plain HTTP, and
	// re-encrypts upstream with normal verification. With nil, TLS is
	// proxied to the original destination as a counted stream.
	TLS TLSTerminator
	// UpstreamRoots verifies upstream TLS servers; nil means the system's.
	UpstreamRoots *x509.CertPool
	// Tracer, when set, makes a span per HTTP request (tracing.
	// StartGatewayRequest) with its status and whether it was replayed.
	Tracer trace.TracerProvider
}

// TLSTerminator gives the server side of TLS connections from a tenant's
// sandboxes: certificates signed by the tenant's CA, which Amber installs in
// the sandbox's trust store. fallbackName is the address the sandbox dialled,
// for clients that send no server name.
type TLSTerminator interface {
	ServerConfig(ctx context.Context, tenant, fallbackName string) (*tls.Config, error)
}

// Run is a sandbox's current run: the traffic since a cut. Request numbering
// (occurrence numbers) restarts at every cut, so a re-run from cut C meets the
// keys the original run recorded after C.
type Run struct {
	Tenant  string
	Sandbox string
	// ID names the cut the run started from (the checkpoint id).
	ID string
	// Epoch is the lease epoch the caller holds on Stream(Sandbox); the
	// journal's appends carry it and a stale one forwards nothing.
	Epoch  uint64
	Policy Policy
	// Resume continues run ID where its journal left it instead of
	// restarting the numbering: for a daemon that restarted while the
	// sandbox ran on (no cut happened, so nothing re-runs, and a request
	// identical to an earlier one is a new one).
	Resume bool
}

// Decision is one egress decision, reported through Options.OnDecision and
// the logger. It never holds a secret value, request headers or bodies.
type Decision struct {
	Time    time.Time
	Tenant  string
	Sandbox string
	Run     string
	// Kind: "forward", "replay", "deny", "rate-limited", "fenced",
	// "reconcile", "divergence", "stream", "error".
	Kind   string
	Dest   string // host:port
	Method string
	URL    string
	Status int
	Reason string
	Key    string // journal key id, when journaled
	// BytesIn (upstream → sandbox) and BytesOut: a stream's bytes; a
	// forwarded request's body bytes (a response body over the journal's
	// limit counts its announced length, or what was buffered if none).
	BytesIn, BytesOut int64
	// Journaled is true for a forward whose outcome is in the effect
	// journal (with its bytes): usage metering counts it from there.
	Journaled bool
	// Secrets names the secrets substituted into the request (names only).
	Secrets []string
}

// Gateway is the egress gateway of one node. Safe for concurrent use.
type Gateway struct {
	opts      Options
	log       *slog.Logger
	transport *http.Transport
	crashed   atomic.Bool

	mu  sync.Mutex
	sbs map[string]*sandboxState
	// inflight holds the keys being forwarded by this process; a re-run
	// meeting one (the sandbox was restored while the daemon lived) waits
	// for its outcome instead of sending it again.
	inflight map[string]chan struct{}
}

type sandboxState struct {
	mu      sync.Mutex
	run     Run
	counts  map[string]int // contentID → identical requests since the cut
	slots   map[string]int // method+URL → requests since the cut
	limiter *limiter
	bw      *bandwidth // nil: unlimited
	// held is closed when a cut in progress ends (Hold); active counts the
	// journaled requests numbered and not yet answered.
	held   chan struct{}
	active int
	// serving counts the HTTP requests being served, buffered the body
	// bytes reserved (Options.MaxRequestsPerSandbox, MaxBufferedPerSandbox).
	serving  int
	buffered int64
}

// unjournaledBuffer is how much of a response body the gateway buffers
// when it does not journal (the rest streams).
const unjournaledBuffer = 1 << 20

// enter takes a serving slot; false when max are taken.
func (st *sandboxState) enter(max int) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.serving >= max {
		return false
	}
	st.serving++
	return true
}

func (st *sandboxState) leave() {
	st.mu.Lock()
	st.serving--
	st.mu.Unlock()
}

// reserve takes n bytes of the buffer budget max; false if they do not fit.
func (st *sandboxState) reserve(n, max int64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if n < 0 || st.buffered+n > max {
		return false
	}
	st.buffered += n
	return true
}

func (st *sandboxState) bufferedNow() int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.buffered
}

func (st *sandboxState) release(n int64) {
	st.mu.Lock()
	st.buffered -= n
	st.mu.Unlock()
}

// errBufferFull is a request body that does not fit the sandbox's budget.
var errBufferFull = errors.New("gateway: the sandbox's buffer budget is full")

// budgetReader charges what it reads to a sandbox's buffer budget.
type budgetReader struct {
	r       io.Reader
	st      *sandboxState
	max     int64
	charged *int64
}

func (b budgetReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if n > 0 {
		if !b.st.reserve(int64(n), b.max) {
			return 0, errBufferFull
		}
		*b.charged += int64(n)
	}
	return n, err
}

// New returns a gateway.
func New(opts Options) *Gateway {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 10 * time.Second
	}
	if opts.SniffTimeout <= 0 {
		opts.SniffTimeout = 300 * time.Millisecond
	}
	if opts.MaxRequestBody <= 0 {
		opts.MaxRequestBody = 8 << 20
	}
	if opts.MaxJournaledBody <= 0 {
		opts.MaxJournaledBody = 256 << 10
	}
	if opts.MaxRequestsPerSandbox <= 0 {
		opts.MaxRequestsPerSandbox = 64
	}
	if opts.MaxBufferedPerSandbox <= 0 {
		opts.MaxBufferedPerSandbox = 128 << 20
	}
	isHostAddr(netip.IPv6Unspecified()) // read the host's addresses at start
	if opts.Dial == nil {
		d := &net.Dialer{Timeout: opts.DialTimeout, KeepAlive: 30 * time.Second}
		opts.Dial = d.DialContext
	}
	dial := opts.Dial
	return &Gateway{
		opts: opts,
		log:  opts.Logger.With("component", "gateway"),
		transport: &http.Transport{
			// Requests name the host; the dial goes to the address the
			// policy checked, carried in the context (no second lookup
			// that DNS could answer differently).
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				to, ok := ctx.Value(dialTargetKey{}).(netip.AddrPort)
				if !ok {
					return nil, errdefs.FailedPreconditionf("gateway: dial without a checked address")
				}
				return dial(ctx, network, to.String())
			},
			TLSClientConfig:     &tls.Config{RootCAs: opts.UpstreamRoots, MinVersion: tls.VersionTLS12},
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true, // bodies pass through as the upstream sent them
			ForceAttemptHTTP2:   false,
		},
		sbs:      map[string]*sandboxState{},
		inflight: map[string]chan struct{}{},
	}
}

// StartRun begins a run of r.Sandbox: call it at every cut — when a
// checkpoint is taken and when the sandbox is restored from one — before the
// sandbox sends traffic. It resets request numbering and brings the
// journal's index up to date (a new owner reads what the old one wrote).
func (g *Gateway) StartRun(ctx context.Context, r Run) error {
	if r.Tenant == "" || r.Sandbox == "" || r.ID == "" {
		return errdefs.InvalidArgumentf("gateway run: tenant, sandbox and run id are required")
	}
	if g.opts.Journal != nil {
		if err := g.opts.Journal.Sync(ctx, r.Sandbox); err != nil {
			return err
		}
	}
	g.mu.Lock()
	st := g.sbs[r.Sandbox]
	if st == nil {
		st = &sandboxState{}
		g.sbs[r.Sandbox] = st
	}
	g.mu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.limiter == nil || st.run.Policy.RequestsPerSecond != r.Policy.RequestsPerSecond || st.run.Policy.Burst != r.Policy.Burst {
		st.limiter = newLimiter(r.Policy.RequestsPerSecond, r.Policy.Burst, g.opts.Clock.Now())
	}
	if st.bw == nil && r.Policy.BytesPerSecond > 0 || st.bw != nil && int64(st.bw.rate) != r.Policy.BytesPerSecond {
		st.bw = newBandwidth(r.Policy.BytesPerSecond)
	}
	st.run = r
	if st.held != nil {
		close(st.held) // the cut is over: held requests go into this run
		st.held = nil
	}
	st.counts = map[string]int{}
	st.slots = map[string]int{}
	if r.Resume && g.opts.Journal != nil {
		counts, slots, err := g.opts.Journal.numbering(ctx, r.Sandbox, r.ID)
		if err != nil {
			return err
		}
		st.counts, st.slots = counts, slots
	}
	return nil
}

// Hold begins a cut of sandbox: journaled requests that arrive from now on
// wait, and Hold waits (up to timeout) for those already numbered to be
// answered, so that every request is wholly before the cut or wholly in
// the run the cut starts. The next StartRun ends the hold; so does the
// returned release (a cut that failed). It reports whether the requests in
// flight all finished in time.
func (g *Gateway) Hold(sandbox string, timeout time.Duration) (release func(), drained bool) {
	g.mu.Lock()
	st := g.sbs[sandbox]
	g.mu.Unlock()
	if st == nil {
		return func() {}, true
	}
	st.mu.Lock()
	ch := st.held
	if ch == nil {
		ch = make(chan struct{})
		st.held = ch
	}
	st.mu.Unlock()
	release = func() {
		st.mu.Lock()
		if st.held == ch {
			close(ch)
			st.held = nil
		}
		st.mu.Unlock()
	}
	for deadline := time.Now().Add(timeout); ; time.Sleep(2 * time.Millisecond) {
		st.mu.Lock()
		n := st.active
		st.mu.Unlock()
		if n == 0 {
			return release, true
		}
		if time.Now().After(deadline) {
			g.log.Warn("cut: requests still in flight; they stay in the run before the cut", "sandbox", sandbox, "in_flight", n)
			return release, false
		}
	}
}

// EndSandbox forgets a sandbox (it was destroyed or moved away).
func (g *Gateway) EndSandbox(sandbox string) {
	g.mu.Lock()
	delete(g.sbs, sandbox)
	g.mu.Unlock()
}

// Close releases idle upstream connections. Connections being served end
// with their ServeConn.
func (g *Gateway) Close() error {
	g.transport.CloseIdleConnections()
	return nil
}

func (g *Gateway) state(sandbox string) (*sandboxState, Run, bool) {
	g.mu.Lock()
	st := g.sbs[sandbox]
	g.mu.Unlock()
	if st == nil {
		return nil, Run{}, false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st, st.run, true
}

// ServeConn serves one connection accepted from sandbox, whose original
// destination was origDst, until it closes or ctx ends. HTTP/1.1 and
// HTTP/2 with prior knowledge (h2c) are served request by request through
// the journal; anything else (TLS included, for now) is proxied to origDst
// as a counted stream. The sandbox must have a run (StartRun). ServeConn
// closes conn.
func (g *Gateway) ServeConn(ctx context.Context, conn net.Conn, origDst netip.AddrPort, sandbox string) error {
	return g.ServeConnTo(ctx, conn, origDst, "", sandbox)
}

// ServeConnTo is ServeConn for a connection whose destination the sandbox
// named: host is the name it resolved to origDst through the gateway's DNS
// (origDst is then a stand-in address, see package egress), "" for an
// address the sandbox dialled directly. Streams are checked against the
// allowlist by that name and dialled at the address the gateway resolves
// for it; HTTP requests are matched by their Host header as always, and
// host is the server name for TLS clients that send none.
func (g *Gateway) ServeConnTo(ctx context.Context, conn net.Conn, origDst netip.AddrPort, host, sandbox string) error {
	defer conn.Close()
	st, run, ok := g.state(sandbox)
	if !ok {
		return errdefs.FailedPreconditionf("gateway: sandbox %s has no run (StartRun)", sandbox)
	}
	if g.crashed.Load() {
		return errCrashed
	}
	br := bufio.NewReaderSize(conn, 4096)
	conn.SetReadDeadline(time.Now().Add(g.opts.SniffTimeout))
	head, _ := br.Peek(8)
	conn.SetReadDeadline(time.Time{})
	pc := &peekedConn{Conn: conn, r: br}
	if looksHTTP(head) {
		return g.serveHTTP(ctx, pc, origDst, host, st, run, "http")
	}
	if g.opts.TLS != nil && len(head) >= 2 && head[0] == 0x16 && head[1] == 0x03 { // TLS handshake record
		name := host
		if name == "" {
			name = origDst.Addr().String()
		}
		cfg, err := g.opts.TLS.ServerConfig(ctx, run.Tenant, name)
		if err != nil {
			g.report(run, Decision{Kind: "error", Dest: origDst.String(), Reason: "TLS termination: " + err.Error()})
			return err
		}
		return g.serveHTTP(ctx, tls.Server(pc, cfg), origDst, host, st, run, "https")
	}
	return g.serveStream(ctx, pc, origDst, host, st, run)
}

var errCrashed = errors.New("gateway: crashed at a failpoint")

func looksHTTP(b []byte) bool {
	for _, m := range []string{"GET ", "POST ", "PUT ", "PATCH ", "DELETE ", "HEAD ", "OPTIONS ", "TRACE ", "PRI * HT"} {
		n := min(len(m), len(b))
		if n >= 4 && string(b[:n]) == m[:n] {
			return true
		}
	}
	return false
}

type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// dialTargetKey carries the checked upstream address to the transport's dial.
type dialTargetKey struct{}

// serveHTTP runs an http.Server on the single connection c (plain, or a
// *tls.Conn whose handshake the server runs).
func (g *Gateway) serveHTTP(ctx context.Context, c net.Conn, origDst netip.AddrPort, host string, st *sandboxState, run Run, scheme string) error {
	done := make(chan struct{})
	var once sync.Once
	h := &handler{g: g, st: st, sandbox: run.Sandbox, origDst: origDst, origHost: host, scheme: scheme}
	// Handlers still running when the server lets go of the connection
	// (a hijacked upgrade) own it until they return.
	var active sync.WaitGroup
	defer active.Wait()
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			active.Add(1)
			defer active.Done()
			h.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed || s == http.StateHijacked {
				once.Do(func() { close(done) })
			}
		},
	}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetHTTP2(true) // over the terminated TLS, by ALPN
	srv.Protocols.SetUnencryptedHTTP2(true)
	l := &oneConnListener{c: c, done: done, closed: make(chan struct{})}
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	err := srv.Serve(l)
	if errors.Is(err, errListenerDone) || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

var errListenerDone = errors.New("connection done")

// oneConnListener hands out one connection, then blocks until it is done
// (closed or hijacked) or the listener is closed — http.Server.Close waits
// for Accept to return before it closes the connections it serves.
type oneConnListener struct {
	mu     sync.Mutex
	c      net.Conn
	done   chan struct{}
	closed chan struct{}
	once   sync.Once
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	c := l.c
	l.c = nil
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	select {
	case <-l.done:
	case <-l.closed:
	}
	return nil, errListenerDone
}

func (l *oneConnListener) Close() error {
	l.mu.Lock()
	c := l.c
	l.c = nil
	l.mu.Unlock()
	if c != nil {
		c.Close() // never accepted
	}
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return dummyAddr{} }

type dummyAddr struct{}

func (dummyAddr) Network() string { return "tcp" }
func (dummyAddr) String() string  { return "gateway" }

// serveStream proxies non-HTTP TCP to origDst (or to host, resolved by the
// gateway), counting bytes, unjournaled.
func (g *Gateway) serveStream(ctx context.Context, c net.Conn, origDst netip.AddrPort, host string, st *sandboxState, run Run) error {
	d := Decision{Kind: "stream", Dest: origDst.String()}
	if host != "" {
		d.Dest = joinHostPort(host, origDst.Port())
	}
	target, reason := g.checkStream(ctx, st, run, origDst, host)
	if reason != "" {
		d.Kind, d.Reason = "deny", reason
		g.report(run, d)
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, g.opts.DialTimeout)
	up, err := g.opts.Dial(dctx, "tcp", target.String())
	cancel()
	if err != nil {
		d.Kind, d.Reason = "error", "dial: "+err.Error()
		g.report(run, d)
		return nil
	}
	defer up.Close()
	stop := context.AfterFunc(ctx, func() { c.Close(); up.Close() })
	defer stop()
	var in, out atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	st.mu.Lock()
	bw := st.bw
	st.mu.Unlock()
	go func() {
		defer wg.Done()
		n, _ := io.Copy(shapedWriter{ctx, up, bw}, c)
		out.Add(n)
		if tc, ok := up.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}()
	n, _ := io.Copy(shapedWriter{ctx, c, bw}, up)
	in.Add(n)
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else if pc, ok := c.(*peekedConn); ok {
		if tc, ok := pc.Conn.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}
	wg.Wait()
	d.BytesIn, d.BytesOut = in.Load(), out.Load()
	g.report(run, d)
	return nil
}

// checkStream applies the policy to a stream and returns the address to
// dial, or why not. A named destination is matched by its name and dialled
// at the address the gateway resolves for it (the one it checked).
func (g *Gateway) checkStream(ctx context.Context, st *sandboxState, run Run, dst netip.AddrPort, host string) (netip.AddrPort, string) {
	if !st.limiter.allow(g.opts.Clock.Now()) {
		return netip.AddrPort{}, "request rate limit"
	}
	if host != "" {
		// The name the sandbox's DNS gave a stand-in for: decided on like a
		// Host (no zone, a host name's shape).
		h, err := parseRequestHost(host)
		if err != nil {
			return netip.AddrPort{}, err.Error()
		}
		host = h
	}
	name := host
	if name == "" {
		name = dst.Addr().String()
	}
	if !run.Policy.allowed(name, dst.Port()) {
		return netip.AddrPort{}, "destination not in the allowlist"
	}
	ip, named := dst.Addr(), false
	if host != "" {
		var err error
		if ip, named, err = g.resolve(ctx, host); err != nil {
			return netip.AddrPort{}, "cannot resolve " + host
		}
	}
	if why := run.Policy.denyReason(ip); !named && why != "" {
		return netip.AddrPort{}, "destination in a denied network (" + why + ")"
	}
	return netip.AddrPortFrom(ip, dst.Port()), ""
}

// report sends d to OnDecision and the logger.
func (g *Gateway) report(run Run, d Decision) {
	d.Time = g.opts.Clock.Now()
	d.Tenant, d.Sandbox, d.Run = run.Tenant, run.Sandbox, run.ID
	if g.opts.OnDecision != nil {
		g.opts.OnDecision(d)
	}
	lvl := slog.LevelDebug
	switch d.Kind {
	case "deny", "rate-limited", "fenced", "reconcile", "divergence", "error":
		lvl = slog.LevelWarn
	}
	g.log.Log(context.Background(), lvl, "egress "+d.Kind, "tenant", d.Tenant, "sandbox", d.Sandbox, "run", d.Run,
		"dest", d.Dest, "method", d.Method, "url", d.URL, "status", d.Status, "reason", d.Reason, "key", d.Key,
		"bytes_in", d.BytesIn, "bytes_out", d.BytesOut)
}

func joinHostPort(host string, port uint16) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// RecordName records, in sandbox's effect journal under its current run's
// epoch, that the sandbox's DNS answered name with addr, and returns the
// address recorded for name (an earlier record wins). Without a journal it
// returns addr.
func (g *Gateway) RecordName(ctx context.Context, sandbox, name string, addr netip.Addr) (netip.Addr, error) {
	if g.opts.Journal == nil {
		return addr, nil
	}
	_, run, ok := g.state(sandbox)
	if !ok {
		return netip.Addr{}, errdefs.FailedPreconditionf("gateway: sandbox %s has no run (StartRun)", sandbox)
	}
	return g.opts.Journal.RecordName(ctx, Writer{Tenant: run.Tenant, Sandbox: sandbox, Epoch: run.Epoch}, name, addr)
}

// Names returns the stand-in addresses recorded for sandbox's names (empty
// without a journal).
func (g *Gateway) Names(ctx context.Context, sandbox string) (map[string]netip.Addr, error) {
	if g.opts.Journal == nil {
		return map[string]netip.Addr{}, nil
	}
	return g.opts.Journal.Names(ctx, sandbox)
}
