package server

import (
	"net/http"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/engine"
)

// The operator is whoever holds an admin-scoped key of metadata.DefaultTenant
// (the key `amber up` writes to DATA_DIR/admin.key is one): it creates
// tenants and manages every tenant's keys. A tenant's own admin-scoped keys
// manage that tenant's keys only; to them every other tenant does not exist
// (NotFound), like every other tenant's sandboxes.

func (c *call) operator() bool {
	return c.key.Tenant == metadata.DefaultTenant && c.key.Has(metadata.ScopeAdmin)
}

// manages checks that the caller may manage tenant's keys and that the
// tenant exists.
func (s *Server) manages(r *http.Request, c *call, tenant string) error {
	if !c.operator() && c.key.Tenant != tenant {
		return errdefs.NotFoundf("tenant %s", tenant)
	}
	_, err := s.tenancy.Tenant(r.Context(), tenant)
	return err
}

func toAPITenant(t metadata.Tenant) api.Tenant {
	return api.Tenant{ID: t.ID, Name: t.Name, State: t.State, Created: t.Created}
}

func toAPIKey(k engine.Key) api.APIKey {
	out := api.APIKey{Name: k.Name, Tenant: k.Tenant, Prefix: k.Prefix, Created: k.Created, Scopes: []string{}}
	for _, s := range k.Scopes {
		out.Scopes = append(out.Scopes, string(s))
	}
	if !k.Expires.IsZero() {
		e := k.Expires
		out.ExpiresAt = &e
	}
	if !k.Revoked.IsZero() {
		rv := k.Revoked
		out.RevokedAt = &rv
	}
	return out
}

func (s *Server) createTenant(w http.ResponseWriter, r *http.Request, c *call) error {
	if !c.operator() {
		return errdefs.PermissionDeniedf("creating tenants needs the operator's key (an admin-scoped key of tenant %s, e.g. DATA_DIR/admin.key)", metadata.DefaultTenant)
	}
	req, err := s.decodeCreateTenant(r)
	if err != nil {
		return err
	}
	t, err := s.tenancy.CreateTenant(r.Context(), req.ID, req.Name)
	if err != nil {
		return err
	}
	c.lg.InfoContext(r.Context(), "tenant created", "new_tenant", t.ID)
	return writeJSON(w, http.StatusCreated, toAPITenant(t))
}

func (s *Server) listTenants(w http.ResponseWriter, r *http.Request, c *call) error {
	var ts []metadata.Tenant
	if c.operator() {
		var err error
		if ts, err = s.tenancy.Tenants(r.Context()); err != nil {
			return err
		}
	} else {
		t, err := s.tenancy.Tenant(r.Context(), c.tenant)
		if err != nil {
			return err
		}
		ts = []metadata.Tenant{t}
	}
	out := api.TenantList{Tenants: []api.Tenant{}}
	for _, t := range ts {
		out.Tenants = append(out.Tenants, toAPITenant(t))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request, c *call) error {
	tenant := r.PathValue("tenant")
	if err := s.manages(r, c, tenant); err != nil {
		return err
	}
	req, _, err := s.decodeCreateKey(r)
	if err != nil {
		return err
	}
	k, secret, err := s.tenancy.CreateKey(r.Context(), tenant, req.Name, req.Scopes, req.ExpiresAt)
	if err != nil {
		return err
	}
	c.lg.InfoContext(r.Context(), "api key created", "for_tenant", tenant, "name", k.Name, "scopes", scopeList(k.Scopes))
	out := toAPIKey(k)
	out.Key = secret
	return writeJSON(w, http.StatusCreated, out)
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request, c *call) error {
	tenant := r.PathValue("tenant")
	if err := s.manages(r, c, tenant); err != nil {
		return err
	}
	keys, err := s.tenancy.Keys(r.Context(), tenant)
	if err != nil {
		return err
	}
	out := api.APIKeyList{Keys: []api.APIKey{}}
	for _, k := range keys {
		out.Keys = append(out.Keys, toAPIKey(k))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request, c *call) error {
	tenant, name := r.PathValue("tenant"), r.PathValue("name")
	if err := s.manages(r, c, tenant); err != nil {
		return err
	}
	// The API does not revoke the operator's key (engine.Tenancy.RevokeKey).
	k, err := s.tenancy.RevokeKey(r.Context(), tenant, name)
	if err != nil {
		return err
	}
	c.lg.InfoContext(r.Context(), "api key revoked", "for_tenant", tenant, "name", k.Name)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func toAPITenantPolicy(p metadata.TenantPolicy) api.TenantPolicy {
	return api.TenantPolicy{Recovery: p.Recovery, FastEvery: p.FastEvery, FastIntervalMS: p.FastInterval.Milliseconds(),
		FastReplayBudgetMS: p.FastReplayBudget.Milliseconds(), KeepCheckpoints: p.KeepCheckpoints, IdleTimeoutMS: p.IdleTimeout.Milliseconds(), Egress: toAPIEgress(p.Egress)}
}

func (s *Server) getTenantPolicy(w http.ResponseWriter, r *http.Request, c *call) error {
	tenant := r.PathValue("tenant")
	if err := s.manages(r, c, tenant); err != nil {
		return err
	}
	p, err := s.eng.TenantPolicy(r.Context(), tenant)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPITenantPolicy(p))
}

func (s *Server) putTenantPolicy(w http.ResponseWriter, r *http.Request, c *call) error {
	tenant := r.PathValue("tenant")
	if err := s.manages(r, c, tenant); err != nil {
		return err
	}
	var req api.TenantPolicy
	if err := readJSON(r, &req); err != nil {
		return err
	}
	if req.FastIntervalMS < 0 || req.IdleTimeoutMS < 0 || req.FastReplayBudgetMS < 0 {
		return errdefs.InvalidArgumentf("durations must not be negative")
	}
	p := metadata.TenantPolicy{Recovery: req.Recovery, FastEvery: req.FastEvery,
		FastInterval: time.Duration(req.FastIntervalMS) * time.Millisecond, KeepCheckpoints: req.KeepCheckpoints,
		FastReplayBudget: time.Duration(req.FastReplayBudgetMS) * time.Millisecond,
		IdleTimeout:      time.Duration(req.IdleTimeoutMS) * time.Millisecond, Egress: fromAPIEgress(req.Egress)}
	if err := s.eng.SetTenantPolicy(r.Context(), tenant, p); err != nil {
		return err
	}
	c.lg.InfoContext(r.Context(), "tenant policy set", "for_tenant", tenant, "policy", p)
	cur, err := s.eng.TenantPolicy(r.Context(), tenant)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPITenantPolicy(cur))
}
