package server

import (
	"net/http"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/egress/gateway"
)

func (s *Server) secretStore() error {
	if s.secrets == nil {
		return errdefs.FailedPreconditionf("this daemon has no secret store (egress is off)")
	}
	return nil
}

// putSecret stores a secret of the caller's tenant. The value is read,
// sealed and forgotten: the answer, the log line and the audit record name
// the secret only.
func (s *Server) putSecret(w http.ResponseWriter, r *http.Request, c *call) error {
	tenant := r.PathValue("tenant")
	if err := s.manages(r, c, tenant); err != nil {
		return err
	}
	if err := s.secretStore(); err != nil {
		return err
	}
	name := r.PathValue("name")
	if err := gateway.CheckSecretName(name); err != nil {
		return err
	}
	var req api.PutSecretRequest
	if err := readJSON(r, &req); err != nil {
		return err
	}
	if err := s.secrets.Put(r.Context(), tenant, name, []byte(req.Value), req.Hosts); err != nil {
		return err
	}
	c.lg.Info("secret set", "for_tenant", tenant, "name", name, "hosts", req.Hosts)
	return writeJSON(w, http.StatusOK, api.Secret{Name: name, Placeholder: gateway.Placeholder(name), Hosts: req.Hosts, Updated: s.clock.Now().UTC()})
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request, c *call) error {
	tenant := r.PathValue("tenant")
	if err := s.manages(r, c, tenant); err != nil {
		return err
	}
	if err := s.secretStore(); err != nil {
		return err
	}
	xs, err := s.secrets.List(r.Context(), tenant)
	if err != nil {
		return err
	}
	out := api.SecretList{Secrets: []api.Secret{}}
	for _, x := range xs {
		out.Secrets = append(out.Secrets, api.Secret{Name: x.Name, Placeholder: gateway.Placeholder(x.Name), Hosts: x.Hosts, Updated: x.Updated})
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request, c *call) error {
	tenant := r.PathValue("tenant")
	if err := s.manages(r, c, tenant); err != nil {
		return err
	}
	if err := s.secretStore(); err != nil {
		return err
	}
	name := r.PathValue("name")
	if err := s.secrets.Delete(r.Context(), tenant, name); err != nil {
		return err
	}
	c.lg.Info("secret deleted", "for_tenant", tenant, "name", name)
	w.WriteHeader(http.StatusNoContent)
	return nil
}
