// Package server is Amber's REST API: the HTTP edge over internal/engine.
// It authenticates callers (Bearer API keys whose hashes live in
// internal/meta), turns requests into engine calls, maps error kinds to
// HTTP status codes (errdefs.HTTPStatus) and writes every error as
// {"error":{"kind":…,"message":…}}. The routes are listed once, in routes(),
// and the OpenAPI document in api/openapi.json is tested to describe each.
package server

import (
	"log/slog"
	"net/http"

	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/meta"
)

// Options configure New.
type Options struct {
	Engine  *engine.Engine
	Meta    *meta.Store // API key hashes
	Logger  *slog.Logger
	Version string
	// PublicURL is the daemon's address as clients see it, for the URLs of
	// exposed ports ("https://amber.example.com"); empty: the request's.
	PublicURL string
}

// Server serves the API. It is an http.Handler.
type Server struct {
	eng     *engine.Engine
	meta    *meta.Store
	lg      *slog.Logger
	version string
	mux     *http.ServeMux

	publicURL string
	proxies   proxies
}

// call is what a handler knows about its request beyond the request itself.
type call struct {
	tenant string
	lg     *slog.Logger
}

type handler func(w http.ResponseWriter, r *http.Request, c *call) error

// Route is one endpoint of the API.
type Route struct {
	Method, Path string
	// Public routes need no API key.
	Public bool
	h      handler
}

// routes lists every endpoint. Paths use net/http's pattern syntax, which is
// also OpenAPI's ({id}).
func (s *Server) routes() []Route {
	return []Route{
		{Method: "GET", Path: "/healthz", Public: true, h: s.health},
		{Method: "GET", Path: "/v1/openapi.json", Public: true, h: s.openapi},
		{Method: "GET", Path: "/v1/info", h: s.info},
		{Method: "GET", Path: "/v1/templates", h: s.listTemplates},
		{Method: "POST", Path: "/v1/sandboxes", h: s.createSandbox},
		{Method: "GET", Path: "/v1/sandboxes", h: s.listSandboxes},
		{Method: "GET", Path: "/v1/sandboxes/{id}", h: s.getSandbox},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}", h: s.deleteSandbox},
		{Method: "POST", Path: "/v1/sandboxes/{id}/kill", h: s.killSandbox},
		{Method: "POST", Path: "/v1/sandboxes/{id}/exec", h: s.exec},
		{Method: "GET", Path: "/v1/sandboxes/{id}/processes", h: s.listProcesses},
		{Method: "POST", Path: "/v1/sandboxes/{id}/processes", h: s.startProcess},
		{Method: "POST", Path: "/v1/sandboxes/{id}/processes/{pid}/signal", h: s.signalProcess},
		{Method: "POST", Path: "/v1/sandboxes/{id}/processes/{pid}/wait", h: s.waitProcess},
		{Method: "GET", Path: "/v1/sandboxes/{id}/files", h: s.getFile},
		{Method: "PUT", Path: "/v1/sandboxes/{id}/files", h: s.putFile},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}/files", h: s.deleteFile},
		{Method: "POST", Path: "/v1/sandboxes/{id}/files/mkdir", h: s.mkdir},
		{Method: "GET", Path: "/v1/sandboxes/{id}/files/tar", h: s.getTar},
		{Method: "PUT", Path: "/v1/sandboxes/{id}/files/tar", h: s.putTar},
		{Method: "GET", Path: "/v1/sandboxes/{id}/events", h: s.events},
		{Method: "POST", Path: "/v1/sandboxes/{id}/ports", h: s.exposePort},
		{Method: "GET", Path: "/v1/sandboxes/{id}/ports", h: s.listPorts},
		{Method: "DELETE", Path: "/v1/sandboxes/{id}/ports/{port}", h: s.unexposePort},
		{Method: "POST", Path: "/v1/sandboxes/{id}/checkpoints", h: s.createCheckpoint},
		{Method: "GET", Path: "/v1/sandboxes/{id}/checkpoints", h: s.listCheckpoints},
		{Method: "POST", Path: "/v1/sandboxes/{id}/recover", h: s.recoverSandbox},
		{Method: "GET", Path: "/v1/checkpoints/{id}", h: s.getCheckpoint},
		{Method: "DELETE", Path: "/v1/checkpoints/{id}", h: s.deleteCheckpoint},
		{Method: "POST", Path: "/v1/checkpoints/{id}/restore", h: s.restoreCheckpoint},
	}
}

// New returns a Server.
func New(o Options) *Server {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{eng: o.Engine, meta: o.Meta, lg: o.Logger, version: o.Version, mux: http.NewServeMux(), publicURL: o.PublicURL}
	for _, rt := range s.routes() {
		s.mux.Handle(rt.Method+" "+rt.Path, s.wrap(rt))
	}
	// Exposed ports (ports.go): any method, authorised by the token in the path.
	s.mux.HandleFunc(proxyPattern, s.proxy)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errNotFoundRoute(r))
	})
	return s
}

// Routes returns the API's endpoints (for tests and documentation).
func (s *Server) Routes() []Route { return s.routes() }

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }
