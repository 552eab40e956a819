package server

import (
	"net/http"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/meta"
)

// The operator is whoever holds an admin-scoped key of meta.DefaultTenant
// (the key `amber up` writes to DATA_DIR/admin.key is one): it creates
// tenants and manages every tenant's keys. A tenant's own admin-scoped keys
// manage that tenant's keys only; to them every other tenant does not exist
// (NotFound), like every other tenant's sandboxes.

func (c *call) operator() bool {
	return c.key.Tenant == meta.DefaultTenant && c.key.Has(meta.ScopeAdmin)
}

// manages checks that the caller may manage tenant's keys and that the
// tenant exists.
func (s *Server) manages(r *http.Request, c *call, tenant string) error {
	if !c.operator() && c.key.Tenant != tenant {
		return errdefs.NotFoundf("tenant %s", tenant)
	}
	_, err := s.meta.GetTenant(r.Context(), tenant)
	return err
}

func toAPITenant(t meta.Tenant) api.Tenant {
	return api.Tenant{ID: t.ID, Name: t.Name, State: t.State, Created: t.Created}
}

func toAPIKey(k meta.APIKey) api.APIKey {
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
		return errdefs.PermissionDeniedf("creating tenants needs the operator's key (an admin-scoped key of tenant %s, e.g. DATA_DIR/admin.key)", meta.DefaultTenant)
	}
	req, err := s.decodeCreateTenant(r)
	if err != nil {
		return err
	}
	t, err := s.meta.CreateTenant(r.Context(), meta.Tenant{ID: req.ID, Name: req.Name})
	if err != nil {
		return err
	}
	c.lg.InfoContext(r.Context(), "tenant created", "new_tenant", t.ID)
	return writeJSON(w, http.StatusCreated, toAPITenant(t))
}

func (s *Server) listTenants(w http.ResponseWriter, r *http.Request, c *call) error {
	var ts []meta.Tenant
	if c.operator() {
		var err error
		if ts, err = s.meta.ListTenants(r.Context()); err != nil {
			return err
		}
	} else {
		t, err := s.meta.GetTenant(r.Context(), c.tenant)
		if err != nil {
			return err
		}
		ts = []meta.Tenant{t}
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
	req, scopes, err := s.decodeCreateKey(r)
	if err != nil {
		return err
	}
	var expires time.Time
	if req.ExpiresAt != nil {
		if now := s.clock.Now(); !req.ExpiresAt.After(now) {
			return errdefs.InvalidArgumentf("expires_at %s is not in the future (now %s)", req.ExpiresAt.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
		}
		expires = *req.ExpiresAt
	}
	secret, err := meta.NewKeySecret()
	if err != nil {
		return err
	}
	k, err := s.meta.CreateKey(r.Context(), meta.APIKey{
		Tenant: tenant, Name: req.Name, Hash: meta.HashKey(secret), Prefix: meta.KeyPrefix(secret), Scopes: scopes, Expires: expires,
	})
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
	keys, err := s.meta.ListKeys(r.Context(), tenant)
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
	// The API does not revoke the operator's key: `amber up` would bring it
	// back at the next start, and until then the operator could be locked out.
	if tenant == meta.DefaultTenant && name == meta.OperatorKeyName {
		return errdefs.FailedPreconditionf("the operator key %s/%s lives in DATA_DIR/admin.key: delete that file and restart `amber up` to rotate it", tenant, name)
	}
	k, err := s.meta.RevokeKey(r.Context(), tenant, name)
	if err != nil {
		return err
	}
	c.lg.InfoContext(r.Context(), "api key revoked", "for_tenant", tenant, "name", k.Name)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func toAPITenantPolicy(p meta.TenantPolicy) api.TenantPolicy {
	return api.TenantPolicy{Recovery: p.Recovery, FastEvery: p.FastEvery, FastIntervalMS: p.FastInterval.Milliseconds(),
		KeepCheckpoints: p.KeepCheckpoints, IdleTimeoutMS: p.IdleTimeout.Milliseconds(), Egress: toAPIEgress(p.Egress)}
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
	if req.FastIntervalMS < 0 || req.IdleTimeoutMS < 0 {
		return errdefs.InvalidArgumentf("durations must not be negative")
	}
	p := meta.TenantPolicy{Recovery: req.Recovery, FastEvery: req.FastEvery,
		FastInterval: time.Duration(req.FastIntervalMS) * time.Millisecond, KeepCheckpoints: req.KeepCheckpoints,
		IdleTimeout: time.Duration(req.IdleTimeoutMS) * time.Millisecond, Egress: fromAPIEgress(req.Egress)}
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
