package server

import (
	"context"
	"net/http"
	"strings"

	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/edge/e2b/envd"
)

// E2B's in-sandbox API (Options.Envd) is internal/edge/e2b/envd's
// handler, authorized as the server authorizes: an Amber key with write
// scope, sent as the sandbox's access token (X-Access-Token), and its
// streams are the tenant's streams (streams.go): counted against
// max_streams_per_tenant and ended when the key stops being usable. In a
// deployment of many nodes, a request goes to the node that runs its
// sandbox (the SDK names the sandbox in a header, so the forwarded
// request needs no Host of its own).

// isEnvd reports whether r is for E2B's envd: on envd's origin, or one
// of envd's own paths naming a sandbox in the SDK's header.
func (s *Server) isEnvd(r *http.Request) bool {
	if id, port, ok := parsePortHost(r.Host, s.portDomain); ok && id != "" {
		return port == envd.Port
	}
	return r.Header.Get("E2b-Sandbox-Id") != "" && envd.IsPath(r.URL.Path)
}

// serveEnvd serves r with envd here, or forwards it to the node that
// runs its sandbox (Router), as every call into a sandbox is: the node
// that runs it serves its envd.
func (s *Server) serveEnvd(w http.ResponseWriter, r *http.Request) {
	if s.router != nil && r.Header.Get(forwardedHeader) == "" {
		if id, _, err := envd.Target(r); err == nil {
			addr, err := s.router.Owner(r.Context(), id)
			if err != nil {
				writeError(w, err)
				return
			}
			if addr != "" {
				s.forwardTo(w, r, addr)
				return
			}
		}
	}
	s.envd.ServeHTTP(w, r)
}

func (s *Server) envdHandler() http.Handler {
	return envd.Handler(envd.Options{Engine: s.eng, Auth: envdAuth{s: s, keys: envd.KeyAuthorizer(s.meta, s.clock)},
		Logger: s.lg.With("component", "envd"), MaxUploadBytes: s.limits.MaxUploadBytes})
}

// envdAuth is envd's Authorizer and StreamBeginner.
type envdAuth struct {
	s    *Server
	keys envd.Authorizer
}

func (a envdAuth) Authorize(r *http.Request, id string) (string, error) {
	return a.keys.Authorize(r, id)
}

// BeginStream makes an envd stream one of the tenant's streams, held by
// the key the request authorized with.
func (a envdAuth) BeginStream(ctx context.Context, r *http.Request, tenant string) (context.Context, func(), error) {
	k, err := a.s.meta.KeyByHash(ctx, metadata.HashKey(strings.TrimSpace(r.Header.Get("X-Access-Token"))))
	if err != nil {
		return nil, nil, err
	}
	return a.s.openStreams.begin(a.s, nil, ctx, tenant, k)
}
