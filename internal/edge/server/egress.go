package server

import (
	"net/http"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/engine"
)

func fromAPIEgress(p *api.EgressPolicy) *metadata.EgressPolicy {
	if p == nil {
		return nil
	}
	m := &metadata.EgressPolicy{Allow: p.Allow, RequestsPerSecond: p.RequestsPerSecond, Burst: p.Burst, BytesPerSecond: p.BytesPerSecond, OnDivergence: p.OnDivergence}
	for _, x := range p.Modes {
		m.Modes = append(m.Modes, metadata.EgressMode{Dest: x.Dest, Method: x.Method, Mode: x.Mode})
	}
	return m
}

func toAPIEgress(p *metadata.EgressPolicy) *api.EgressPolicy {
	if p == nil {
		return nil
	}
	a := &api.EgressPolicy{Allow: p.Allow, RequestsPerSecond: p.RequestsPerSecond, Burst: p.Burst, BytesPerSecond: p.BytesPerSecond, OnDivergence: p.OnDivergence}
	for _, x := range p.Modes {
		a.Modes = append(a.Modes, api.EgressMode{Dest: x.Dest, Method: x.Method, Mode: x.Mode})
	}
	return a
}

func (s *Server) getEgress(w http.ResponseWriter, r *http.Request, c *call) error {
	own, eff, run, err := s.eng.Egress(r.Context(), c.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, api.SandboxEgress{Policy: toAPIEgress(own), Effective: *toAPIEgress(&eff), Run: run})
}

// putEgress sets the sandbox's own policy; a body of `null` returns it to
// its tenant's.
func (s *Server) putEgress(w http.ResponseWriter, r *http.Request, c *call) error {
	id := r.PathValue("id")
	if _, err := s.eng.Get(r.Context(), c.tenant, id); err != nil {
		return err // another tenant's sandbox is not found, whatever the body
	}
	var req *api.EgressPolicy
	if err := readJSON(r, &req); err != nil {
		return err
	}
	if err := s.eng.SetEgress(r.Context(), c.tenant, id, fromAPIEgress(req)); err != nil {
		return err
	}
	c.lg.Info("egress policy set", "sandbox", id)
	return s.getEgress(w, r, c)
}

func (s *Server) listEffects(w http.ResponseWriter, r *http.Request, c *call) error {
	fxs, err := s.eng.Effects(r.Context(), c.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	out := api.EffectList{Effects: make([]api.Effect, 0, len(fxs))}
	for _, f := range fxs {
		out.Effects = append(out.Effects, toAPIEffect(f))
		if f.State == "needs-reconciliation" {
			out.NeedsReconciliation++
		}
	}
	return writeJSON(w, http.StatusOK, out)
}

func toAPIEffect(f engine.Effect) api.Effect {
	return api.Effect{Key: f.Key, Run: f.Run, Method: f.Method, URL: f.URL, State: f.State, Status: f.Status,
		Attempts: f.Attempts, Mode: f.Mode, Divergences: f.Divergences, Error: f.Error, Seq: f.Seq, Reconciled: f.Reconciled, Replays: f.Replays}
}
