package server

import (
	"net/http"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/internal/egress/gateway"
)

// sandboxStats answers one reading of a running sandbox's resources (the
// console polls it for its live graphs).
func (s *Server) sandboxStats(w http.ResponseWriter, r *http.Request, c *call) error {
	st, err := s.eng.Stats(r.Context(), c.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.SandboxStats{Time: st.Time, CPUNanos: st.CPUNanos, MemoryBytes: st.MemoryBytes,
		DiskUsedBytes: st.DiskUsedBytes, DiskTotalBytes: st.DiskTotalBytes})
}

// reconcileEffect records an operator's resolution of an effect that needs
// reconciliation as its outcome (gateway.Gateway.Reconcile).
func (s *Server) reconcileEffect(w http.ResponseWriter, r *http.Request, c *call) error {
	id := r.PathValue("id")
	if _, err := s.eng.Get(r.Context(), c.tenant, id); err != nil {
		return err // another tenant's sandbox is not found, whatever the body
	}
	var req api.ReconcileRequest
	if err := readJSON(r, &req); err != nil {
		return err
	}
	fx, err := s.eng.Reconcile(r.Context(), c.tenant, id, gateway.Resolution{Key: req.Key, Status: req.Status, Body: []byte(req.Body), Note: req.Note})
	if err != nil {
		return err
	}
	c.lg.InfoContext(r.Context(), "effect reconciled", "key", req.Key, "status", req.Status)
	return writeJSON(w, http.StatusOK, toAPIEffect(fx))
}
