// Package server is Amber's REST API: the HTTP edge over internal/engine.
// It authenticates callers (Bearer API keys whose hashes live in
// internal/state/meta), authorizes them (each route declares the scope it needs,
// and the engine answers NotFound for another tenant's resources), turns
// requests into engine calls, maps error kinds to
// HTTP status codes (errdefs.HTTPStatus) and writes every error as
// {"error":{"kind":…,"message":…}}. The routes are listed once, in routes(),
// and the OpenAPI document in api/openapi.json is checked against them and
// against real responses with kin-openapi (openapi_test.go).
package server

import (
	"context"
	"github.com/amber-run/amber/internal/state/secretstore"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/trace"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/edge/e2b"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/obs/metrics"
	"github.com/amber-run/amber/internal/obs/tracing"
	"github.com/amber-run/amber/internal/session"
	"github.com/amber-run/amber/internal/state/audit"
	"github.com/amber-run/amber/lib/httpx"
)

// Options configure New.
type Options struct {
	Engine *engine.Engine
	// Meta is the metadata store the server reads itself: API keys by hash
	// (authentication) and the answers of idempotent calls.
	Meta Store
	// Tenancy administers tenants, keys and nodes (the tenant, key and node
	// routes); nil: one made over Meta.
	Tenancy *engine.Tenancy
	// Clock decides when keys expire (default clock.Real).
	Clock   clock.Clock
	Logger  *slog.Logger
	Version string
	// PublicURL is the daemon's address as clients see it, for the URLs of
	// exposed ports ("https://amber.example.com"); empty: the request's.
	PublicURL string
	// Hop authenticates calls forwarded between the nodes of a deployment
	// (the node token); nil: not authenticated (one node).
	Hop *httpx.Hop
	// PortDomain is the domain under which exposed ports have their own
	// origins, <port>-<sandbox>.<PortDomain> (ports.go); empty:
	// DefaultPortDomain.
	PortDomain string
	// Audit, when set, gets a record of every call to a write or admin
	// route that passed authentication (audit.go).
	Audit *audit.Trail
	// Metrics, when set, counts and times requests and is served at
	// /metrics (the operator's key).
	Metrics *metrics.Metrics
	// Secrets, when set, stores tenants' secrets (the /v1/secrets routes
	// answer 412 without one).
	Secrets *secretstore.Store
	// Limits bound requests (limits.go); zero fields take DefaultLimits.
	Limits Limits
	// Tracer makes a span per request (middleware.go) that the engine's
	// spans are children of; nil: no spans.
	Tracer trace.TracerProvider
	// Sessions, when set, serves agent sessions (/v1/sessions); without it
	// those routes answer 412.
	Sessions *session.Manager
	// Console, when set, is the web console's built assets, served at
	// /console/ (console.go).
	Console fs.FS
	// Router, when set, forwards calls into a sandbox to the node that
	// runs it (nodes.go); nil: one node, every call answered here.
	Router Router
	// Envd serves E2B's in-sandbox API (envd.go): the requests for port
	// envd.Port of a sandbox's origin (49983-<id>.<PortDomain>, the
	// SDK's host with E2B_DOMAIN set to PortDomain) and those for envd's
	// paths (envd.IsPath) that name a sandbox in the SDK's E2b-Sandbox-Id
	// header (E2B_SANDBOX_URL set to the daemon's URL).
	Envd bool
	// E2B serves E2B's control plane (internal/edge/e2b) under /e2b/
	// (E2B_API_URL set to the daemon's URL and /e2b).
	E2B bool
}

// Store is what the server needs of the metadata store: the keys its
// middleware authenticates with (by their hash), the answers of idempotent
// calls, and, for the Tenancy New makes when Options.Tenancy is nil, what a
// Tenancy administers. The handlers read no other rows of it.
type Store interface {
	engine.TenancyStore
	metadata.Idempotency
}

// keyStore is what the server itself reads of Options.Meta.
type keyStore interface {
	KeyByHash(ctx context.Context, hash string) (metadata.APIKey, error)
	metadata.Idempotency
}

// Server serves the API. It is an http.Handler.
type Server struct {
	secrets    *secretstore.Store
	mcpOnce    sync.Once
	mcpHandler *mcpEndpoint
	mcpServers sync.Map // tenant and key → *mcp.Server
	rates      rateLimits
	audit      *audit.Trail
	metrics    *metrics.Metrics
	tracer     trace.Tracer
	limits     Limits
	execs      execSlots
	idem       idemFlight // Idempotency-Key calls running here (idempotency.go)
	eng        *engine.Engine
	meta       keyStore
	tenancy    *engine.Tenancy // tenants, keys, nodes (tenants.go, nodes.go)
	clock      clock.Clock
	lg         *slog.Logger
	version    string
	mux        *http.ServeMux

	publicURL   string
	portDomain  string // exposed ports' origins (ports.go)
	envd        http.Handler
	e2b         http.Handler // Options.E2B
	proxies     proxies
	openStreams openStreams // streams per tenant, ended on key revocation (streams.go)

	sessions *session.Manager
	tickets  tickets // terminal tickets (terminal.go)
	router   Router
	hop      *httpx.Hop // node-to-node calls' credential (nodes.go)
	// streams ends with CloseStreams: long-lived streams (session SSE)
	// return so that a graceful shutdown does not wait for them.
	streams     context.Context
	stopStreams context.CancelFunc
}

// call is what a handler knows about its request beyond the request itself.
type call struct {
	tenant string          // the caller's: key.Tenant
	key    metadata.APIKey // the key that authenticated the call (zero on public routes)
	lg     *slog.Logger
}

type handler func(w http.ResponseWriter, r *http.Request, c *call) error

// Route is one endpoint of the API.
type Route struct {
	Method, Path string
	// Scope is what the caller's API key must hold: read (looking), write
	// (changing the tenant's sandboxes and checkpoints) or admin (managing
	// tenants and keys); Public routes need no key. A route that declares
	// none is refused to everyone (fail closed), and a test fails.
	Scope metadata.Scope
	// Idempotent routes (creating calls) honour an Idempotency-Key header
	// (idempotency.go).
	Idempotent bool
	// Upload routes stream their body (file contents, a tar, exec stdin)
	// and bound it themselves; on the others the middleware bounds it to
	// Limits.MaxBodyBytes.
	Upload bool
	h      handler
}

// Public is the Scope of the routes that need no API key.
const Public metadata.Scope = "public"

const (
	read  = metadata.ScopeRead
	write = metadata.ScopeWrite
	admin = metadata.ScopeAdmin
)

// routes lists every endpoint with the scope it needs. Paths use net/http's
// pattern syntax, which is also OpenAPI's ({id}). GET routes need read (a
// GET changes nothing); so does waiting for a process, which only looks.
func (s *Server) routes() []Route {
	return []Route{
		{Method: "GET", Path: "/healthz", Scope: Public, h: s.health},
		{Method: "GET", Path: "/readyz", Scope: Public, h: s.readyz},
		{Method: "GET", Path: "/metrics", Scope: admin, h: s.serveMetrics},
		{Method: "GET", Path: "/v1/openapi.json", Scope: Public, h: s.openapi},
		{Method: "GET", Path: "/v1/info", Scope: read, h: s.info},
		{Method: "GET", Path: "/v1/templates", Scope: read, h: s.listTemplates},
		{Method: "GET", Path: "/v1/templates/{ref}", Scope: read, h: s.inspectTemplate},
		{Method: "POST", Path: "/v1/templates/{name}/import", Scope: admin, h: s.importTemplate},
		{Method: "PUT", Path: "/v1/templates/{name}/tag", Scope: admin, h: s.tagTemplate},
		{Method: "DELETE", Path: "/v1/templates/{ref}", Scope: admin, h: s.removeTemplate},
		{Method: "POST", Path: "/v1/templates/gc", Scope: admin, h: s.gcTemplates},
		{Method: "POST", Path: "/v1/sandboxes", Scope: write, Idempotent: true, h: s.createSandbox},
		{Method: "GET", Path: "/v1/sandboxes", Scope: read, h: s.listSandboxes},
		{Method: "GET", Path: "/v1/sandboxes/{id}", Scope: read, h: s.getSandbox},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}", Scope: write, h: s.deleteSandbox},
		{Method: "POST", Path: "/v1/sandboxes/{id}/kill", Scope: write, h: s.killSandbox},
		{Method: "POST", Path: "/v1/sandboxes/{id}/timeout", Scope: write, h: s.setTimeout},
		{Method: "POST", Path: "/v1/sandboxes/{id}/exec", Scope: write, Upload: true, h: s.exec},
		{Method: "GET", Path: "/v1/sandboxes/{id}/processes", Scope: read, h: s.listProcesses},
		{Method: "POST", Path: "/v1/sandboxes/{id}/processes", Scope: write, Idempotent: true, h: s.startProcess},
		{Method: "POST", Path: "/v1/sandboxes/{id}/processes/{pid}/signal", Scope: write, h: s.signalProcess},
		{Method: "POST", Path: "/v1/sandboxes/{id}/processes/{pid}/stdin", Scope: write, Upload: true, h: s.writeStdin},
		{Method: "POST", Path: "/v1/sandboxes/{id}/processes/{pid}/wait", Scope: read, h: s.waitProcess},
		{Method: "GET", Path: "/v1/sandboxes/{id}/processes/{pid}/output", Scope: read, h: s.processOutput},
		{Method: "GET", Path: "/v1/sandboxes/{id}/files", Scope: read, h: s.getFile},
		{Method: "PUT", Path: "/v1/sandboxes/{id}/files", Scope: write, Upload: true, h: s.putFile},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}/files", Scope: write, h: s.deleteFile},
		{Method: "POST", Path: "/v1/sandboxes/{id}/files/mkdir", Scope: write, h: s.mkdir},
		{Method: "POST", Path: "/v1/sandboxes/{id}/files/rename", Scope: write, h: s.renameFile},
		{Method: "GET", Path: "/v1/sandboxes/{id}/files/watch", Scope: read, h: s.watchFiles},
		{Method: "GET", Path: "/v1/sandboxes/{id}/files/tar", Scope: read, h: s.getTar},
		{Method: "PUT", Path: "/v1/sandboxes/{id}/files/tar", Scope: write, Upload: true, h: s.putTar},
		{Method: "GET", Path: "/v1/sandboxes/{id}/events", Scope: read, h: s.events},
		{Method: "POST", Path: "/v1/sandboxes/{id}/ports", Scope: write, h: s.exposePort},
		{Method: "GET", Path: "/v1/sandboxes/{id}/ports", Scope: read, h: s.listPorts},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}/ports/{port}", Scope: write, h: s.unexposePort},
		{Method: "GET", Path: "/v1/sandboxes/{id}/egress", Scope: read, h: s.getEgress},
		{Method: "PUT", Path: "/v1/sandboxes/{id}/egress", Scope: write, h: s.putEgress},
		{Method: "GET", Path: "/v1/sandboxes/{id}/effects", Scope: read, h: s.listEffects},
		{Method: "POST", Path: "/v1/sandboxes/{id}/effects/reconcile", Scope: write, h: s.reconcileEffect},
		{Method: "GET", Path: "/v1/sandboxes/{id}/stats", Scope: read, h: s.sandboxStats},
		{Method: "POST", Path: "/v1/sandboxes/{id}/terminal", Scope: write, h: s.terminalTicket},
		{Method: "POST", Path: "/v1/mcp", Scope: read, h: s.mcp},
		{Method: "PUT", Path: "/v1/tenants/{tenant}/secrets/{name}", Scope: write, h: s.putSecret},
		{Method: "GET", Path: "/v1/tenants/{tenant}/secrets", Scope: read, h: s.listSecrets},
		{Method: "DELETE", Path: "/v1/tenants/{tenant}/secrets/{name}", Scope: write, h: s.deleteSecret},
		{Method: "POST", Path: "/v1/sandboxes/{id}/checkpoints", Scope: write, Idempotent: true, h: s.createCheckpoint},
		{Method: "GET", Path: "/v1/sandboxes/{id}/checkpoints", Scope: read, h: s.listCheckpoints},
		{Method: "POST", Path: "/v1/sandboxes/{id}/recover", Scope: write, Idempotent: true, h: s.recoverSandbox},
		{Method: "POST", Path: "/v1/sandboxes/{id}/upgrade", Scope: write, Idempotent: true, h: s.upgradeSandbox},
		{Method: "GET", Path: "/v1/checkpoints/{id}", Scope: read, h: s.getCheckpoint},
		{Method: "DELETE", Path: "/v1/checkpoints/{id}", Scope: write, h: s.deleteCheckpoint},
		{Method: "POST", Path: "/v1/checkpoints/{id}/restore", Scope: write, Idempotent: true, h: s.restoreCheckpoint},
		{Method: "POST", Path: "/v1/tenants", Scope: admin, h: s.createTenant},
		{Method: "GET", Path: "/v1/tenants", Scope: admin, h: s.listTenants},
		{Method: "POST", Path: "/v1/tenants/{tenant}/keys", Scope: admin, h: s.createKey},
		{Method: "GET", Path: "/v1/tenants/{tenant}/keys", Scope: admin, h: s.listKeys},
		{Method: "DELETE", Path: "/v1/tenants/{tenant}/keys/{name}", Scope: admin, h: s.revokeKey},
		{Method: "GET", Path: "/v1/tenants/{tenant}/policy", Scope: read, h: s.getTenantPolicy},
		{Method: "GET", Path: "/v1/tenants/{tenant}/quota", Scope: read, h: s.getTenantQuota},
		{Method: "PUT", Path: "/v1/tenants/{tenant}/quota", Scope: admin, h: s.putTenantQuota},
		{Method: "GET", Path: "/v1/audit", Scope: read, h: s.listAudit},
		{Method: "GET", Path: "/v1/audit/verify", Scope: read, h: s.verifyAudit},
		{Method: "GET", Path: "/v1/usage", Scope: read, h: s.getUsage},
		{Method: "GET", Path: "/v1/nodes", Scope: admin, h: s.listNodes},
		{Method: "POST", Path: "/v1/nodes/{id}/drain", Scope: admin, h: s.drainNode},
		{Method: "POST", Path: "/v1/nodes/{id}/undrain", Scope: admin, h: s.undrainNode},
		{Method: "PUT", Path: "/v1/tenants/{tenant}/policy", Scope: admin, h: s.putTenantPolicy},
		{Method: "POST", Path: "/v1/sessions", Scope: write, h: s.createSession},
		{Method: "GET", Path: "/v1/sessions", Scope: read, h: s.listSessions},
		{Method: "GET", Path: "/v1/sessions/{id}", Scope: read, h: s.getSession},
		{Method: "POST", Path: "/v1/sessions/{id}/events", Scope: write, h: s.postSessionEvent},
		{Method: "GET", Path: "/v1/sessions/{id}/events", Scope: read, h: s.sessionEvents},
		{Method: "GET", Path: "/v1/sessions/{id}/events/stream", Scope: read, h: s.sessionStream},
	}
}

// New returns a Server.
func New(o Options) *Server {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Tenancy == nil && o.Meta != nil {
		o.Tenancy = engine.NewTenancy(o.Meta, o.Clock)
	}
	s := &Server{eng: o.Engine, meta: o.Meta, tenancy: o.Tenancy, clock: o.Clock, lg: o.Logger, version: o.Version, mux: http.NewServeMux(), publicURL: o.PublicURL, audit: o.Audit, metrics: o.Metrics,
		tracer: tracing.OrNoop(o.Tracer).Tracer(tracing.ScopeServer), limits: o.Limits.withDefaults(), secrets: o.Secrets,
		sessions: o.Sessions, router: o.Router, hop: o.Hop}
	s.streams, s.stopStreams = context.WithCancel(context.Background())
	s.portDomain = portDomainOrDefault(o.PortDomain)
	if o.Envd {
		s.envd = s.envdHandler()
	}
	if o.E2B {
		s.e2b = http.StripPrefix(E2BPrefix, e2b.Handler(e2b.Options{Engine: s.eng, Keys: s.meta, Clock: s.clock,
			Logger: s.lg.With("component", "e2b"), Domain: s.portDomain}))
	}
	for _, rt := range s.routes() {
		s.mux.Handle(rt.Method+" "+rt.Path, s.wrap(rt))
	}
	// The old path form of exposed ports: a redirect to the port's own
	// origin (ports.go), which ServeHTTP serves.
	s.mux.HandleFunc(proxyPattern, s.legacyPortPath)
	// The MCP endpoint's other methods: a session's GET and DELETE, else
	// 405 (mcp_session.go).
	s.mux.Handle("/v1/mcp", s.mcpOtherMethods())
	// The terminal's WebSocket, authorised by a ticket (terminal.go).
	s.mux.HandleFunc("GET /v1/sandboxes/{id}/terminal/ws", s.terminalWS)
	if o.Console != nil {
		s.mux.Handle("GET /console", consoleHandler(o.Console))
		s.mux.Handle("GET /console/", consoleHandler(o.Console))
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errNotFoundRoute(r))
	})
	return s
}

// CloseStreams ends the long-lived event streams (for http.Server's
// RegisterOnShutdown): clients reconnect to the next daemon and resume.
func (s *Server) CloseStreams() { s.stopStreams() }

// Routes returns the API's endpoints (for tests and documentation).
func (s *Server) Routes() []Route { return s.routes() }

// E2BPrefix is where Options.E2B serves E2B's control plane.
const E2BPrefix = "/e2b"

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := s.hop.Admit(r, forwardedHeader); err != nil { // a forged hop (httpx.Hop)
		s.lg.WarnContext(r.Context(), "forwarded call refused", "path", r.URL.Path, "from", r.RemoteAddr, "err", err)
		writeError(w, err)
		return
	}
	if s.e2b != nil && strings.HasPrefix(r.URL.Path, E2BPrefix+"/") { // E2B's control plane
		s.e2b.ServeHTTP(w, r)
		return
	}
	if s.envd != nil && s.isEnvd(r) { // E2B's in-sandbox API (envd.go)
		s.serveEnvd(w, r)
		return
	}
	if s.servePortHost(w, r) { // an exposed port's origin: never the API (ports.go)
		return
	}
	s.mux.ServeHTTP(w, r)
}
