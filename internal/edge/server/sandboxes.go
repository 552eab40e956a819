package server

import (
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/obs/logging"
)

func toAPILimits(l sandbox.Limits) api.Limits {
	return api.Limits{MemoryBytes: l.MemoryBytes, MilliCPUs: l.MilliCPUs, Pids: l.Pids, DiskBytes: l.DiskBytes}
}

func fromAPILimits(l api.Limits) sandbox.Limits {
	return sandbox.Limits{MemoryBytes: l.MemoryBytes, MilliCPUs: l.MilliCPUs, Pids: l.Pids, DiskBytes: l.DiskBytes}
}

func toAPISandbox(sb metadata.Sandbox) api.Sandbox {
	return api.Sandbox{
		ID: sb.ID, Tenant: sb.Tenant, Template: sb.Template, TemplateVersion: sb.TemplateVersion,
		Driver: sb.Driver, State: string(sb.State), Reason: sb.Reason, Limits: toAPILimits(sb.Limits),
		Env: sb.Env, FromPool: sb.FromPool, Generation: sb.Generation, Origin: sb.Origin, Recovery: sb.Policy,
		Node: sb.Node, Created: sb.Created, Updated: sb.Updated, Metadata: sb.Metadata, OnTimeout: sb.OnExpire,
		ExpiresAt: expiresAt(sb.Expires),
	}
}

func expiresAt(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func (s *Server) health(w http.ResponseWriter, r *http.Request, c *call) error {
	return writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request, c *call) error {
	w.Header().Set("Content-Type", "application/json")
	_, err := w.Write(api.OpenAPI)
	return err
}

func (s *Server) info(w http.ResponseWriter, r *http.Request, c *call) error {
	d := s.eng.Driver()
	caps := d.Capabilities()
	return writeJSON(w, http.StatusOK, api.Info{
		Version: s.version, Driver: d.Name(), Tenant: c.tenant, Key: c.key.Name, Scopes: scopeNames(c.key.Scopes),
		Capabilities: map[string]bool{
			"checkpoint": caps.Checkpoint, "lazy_restore": caps.LazyRestore,
			"live_outside_tcp": caps.LiveOutsideTCP, "pty": caps.PTY, "port_forward": caps.PortForward,
		},
	})
}

// scopeNames lists scopes by name, never null.
func scopeNames(sc []metadata.Scope) []string {
	out := make([]string, 0, len(sc))
	for _, x := range sc {
		out = append(out, string(x))
	}
	return out
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request, c *call) error {
	req, err := s.decodeCreateSandbox(r)
	if err != nil {
		return err
	}
	sb, err := s.eng.Create(r.Context(), engine.CreateRequest{
		Tenant: c.tenant, Template: req.Template, Limits: fromAPILimits(req.Limits), Env: req.Env, Cold: req.Cold, Policy: req.Recovery,
		Egress: fromAPIEgress(req.Egress), Metadata: req.Metadata, Timeout: time.Duration(req.Timeout) * time.Second, OnTimeout: req.OnTimeout,
	})
	if err != nil {
		return err
	}
	c.lg.InfoContext(r.Context(), "sandbox created", logging.SandboxID, sb.ID, "from_pool", sb.FromPool)
	return writeJSON(w, http.StatusCreated, toAPISandbox(sb))
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request, c *call) error {
	f, err := listFilter(r.URL.Query())
	if err != nil {
		return err
	}
	rows, err := s.eng.Find(r.Context(), c.tenant, f)
	if err != nil {
		return err
	}
	out := api.SandboxList{Sandboxes: []api.Sandbox{}}
	for _, sb := range rows {
		out.Sandboxes = append(out.Sandboxes, toAPISandbox(sb))
	}
	return writeJSON(w, http.StatusOK, out)
}

// listFilter reads GET /v1/sandboxes' filters: state (comma-separated or
// repeated) and metadata (key=value, repeated: every pair).
func listFilter(q url.Values) (engine.ListFilter, error) {
	var f engine.ListFilter
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if st = strings.TrimSpace(st); st != "" {
				f.States = append(f.States, metadata.State(st))
			}
		}
	}
	for _, kv := range q["metadata"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return f, errdefs.InvalidArgumentf("metadata filter %.60q: want key=value", kv)
		}
		if f.Metadata == nil {
			f.Metadata = map[string]string{}
		}
		f.Metadata[k] = v
	}
	return f, nil
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, c *call) error {
	// Another tenant's sandbox is a 404 whatever the body.
	if _, err := s.eng.Get(r.Context(), c.tenant, r.PathValue("id")); err != nil {
		return err
	}
	var req api.SetTimeoutRequest
	if err := readJSON(r, &req); err != nil {
		return err
	}
	if req.Timeout < 0 || req.Timeout > int64(engine.MaxTimeout/time.Second) {
		return errdefs.InvalidArgumentf("timeout %d: want 0 (none) to %d seconds", req.Timeout, int64(engine.MaxTimeout/time.Second))
	}
	sb, err := s.eng.SetTimeout(r.Context(), c.tenant, r.PathValue("id"), time.Duration(req.Timeout)*time.Second)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPISandbox(sb))
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, err := s.eng.Get(r.Context(), c.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPISandbox(sb))
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.eng.Destroy(r.Context(), c.tenant, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) killSandbox(w http.ResponseWriter, r *http.Request, c *call) error {
	sb, err := s.eng.Kill(r.Context(), c.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPISandbox(sb))
}

// serveMetrics serves Prometheus metrics to the operator.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request, c *call) error {
	if !c.operator() {
		return errdefs.PermissionDeniedf("metrics span every tenant: they need the operator's key (an admin-scoped key of tenant %s)", metadata.DefaultTenant)
	}
	if s.metrics == nil {
		return errdefs.FailedPreconditionf("this daemon exports no metrics")
	}
	s.metrics.Handler().ServeHTTP(w, r)
	return nil
}
