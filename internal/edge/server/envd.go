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
// max_streams_per_tenant and ended when the key stops being usable.

// isEnvd reports whether r is for E2B's envd.
func (s *Server) isEnvd(r *http.Request) bool {
	if id, port, ok := parsePortHost(r.Host, s.portDomain); ok && id != "" {
		return port == envd.Port
	}
	return r.Header.Get("E2b-Sandbox-Id") != "" && !strings.HasPrefix(r.URL.Path, "/v1/")
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
