package server

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
)

// errNotReady is what /readyz tells anyone: ready or not, nothing of why
// (a store's name, address or error text is the operator's).
var errNotReady = errdefs.Unavailablef("not ready")

// readyz answers GET /readyz (public: load balancers and probes call it
// without a key): 200 {"status":"ready"} when the metadata store and the
// event log answer, else 503 "not ready". Why is logged (with the request
// id) and told only to a call with the operator's key.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request, c *call) error {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	why := s.readiness(ctx)
	if why == nil {
		return writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	}
	c.lg.WarnContext(r.Context(), "not ready", "err", why)
	if r.Header.Get("Authorization") != "" {
		k, err := s.authorize(r, Route{Method: r.Method, Path: "/readyz", Scope: admin})
		if err == nil && k.Tenant == metadata.DefaultTenant {
			return errdefs.Unavailablef("not ready: %v", why)
		}
	}
	return errNotReady
}

// readiness is nil when the daemon can answer calls, else why not.
func (s *Server) readiness(ctx context.Context) error {
	if s.tenancy == nil || s.eng == nil {
		return errors.New("no engine")
	}
	if _, err := s.tenancy.Tenant(ctx, metadata.DefaultTenant); err != nil {
		return errors.New("metadata store: " + err.Error())
	}
	if err := s.eng.Ping(ctx); err != nil {
		return err
	}
	return nil
}
