package server

import (
	"encoding/json"
	"net/http"
	"sort"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/state/templatestore"
)

// Templates are shared by every tenant: any key may list and inspect them
// (seeing only its own sandboxes and checkpoints among a version's
// references); importing, tagging, removing and collecting them is the
// operator's (an admin-scoped key of tenant default).

func (s *Server) needOperator(c *call, what string) error {
	if !c.operator() {
		return errdefs.PermissionDeniedf("%s needs the operator's key (an admin-scoped key of tenant %s, e.g. DATA_DIR/admin.key)", what, metadata.DefaultTenant)
	}
	return nil
}

// visibleTo is the tenant whose references c sees ("" for the operator).
func visibleTo(c *call) string {
	if c.operator() {
		return ""
	}
	return c.tenant
}

func toAPIVersion(ti engine.TemplateInfo, tenant string) api.TemplateVersion {
	v := ti.Version
	refs := ti.Refs.For(tenant)
	return api.TemplateVersion{
		Digest: v.Digest, Name: v.Name, Env: v.Defaults.Env, Cwd: v.Defaults.Cwd, User: v.Defaults.User,
		Limits: toAPILimits(v.Defaults.Limits), Packages: v.Packages, RootFSDigest: v.RootFS.Digest,
		Files: v.RootFS.Entries, Bytes: v.RootFS.Bytes, Source: v.Source, Created: v.Created,
		Local: ti.Local, Stored: ti.Stored, Tags: refs.Tags, Sandboxes: refs.Sandboxes, Checkpoints: refs.Checkpoints,
	}
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request, c *call) error {
	cat := s.eng.Templates()
	out := api.TemplateList{Templates: []api.Template{}, Versions: []api.TemplateVersion{}}
	tags, err := cat.Store().Tags()
	if err != nil {
		return err
	}
	for _, name := range cat.Names() {
		want, ready := s.eng.PoolSize(name)
		if _, ok := tags[name]; !ok {
			// A setup-script template not used yet: digested (made a
			// version) at its first use, not by a listing.
			out.Templates = append(out.Templates, api.Template{Name: name, PoolSize: want, PoolReady: ready})
			continue
		}
		t, err := cat.GetContext(r.Context(), name)
		if err != nil {
			continue
		}
		out.Templates = append(out.Templates, api.Template{
			Name: t.Name, Version: t.Version, Env: t.Env, Cwd: t.Cwd, User: t.User,
			Limits: toAPILimits(t.Limits), PoolSize: want, PoolReady: ready,
		})
	}
	sort.Slice(out.Templates, func(i, j int) bool { return out.Templates[i].Name < out.Templates[j].Name })
	vs, err := s.eng.ListTemplates(r.Context())
	if err != nil {
		return err
	}
	for _, ti := range vs {
		out.Versions = append(out.Versions, toAPIVersion(ti, visibleTo(c)))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) inspectTemplate(w http.ResponseWriter, r *http.Request, c *call) error {
	ti, err := s.eng.InspectTemplate(r.Context(), r.PathValue("ref"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPIVersion(ti, visibleTo(c)))
}

// importTemplate reads a root filesystem tarball as the body; the
// defaults come as the JSON query parameter "defaults"
// ({"env":[…],"cwd":…,"user":…,"limits":{…}}).
func (s *Server) importTemplate(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.needOperator(c, "importing a template"); err != nil {
		return err
	}
	var d templatestore.Defaults
	if q := r.URL.Query().Get("defaults"); q != "" {
		var ad struct {
			Env    []string   `json:"env"`
			Cwd    string     `json:"cwd"`
			User   string     `json:"user"`
			Limits api.Limits `json:"limits"`
		}
		if err := json.Unmarshal([]byte(q), &ad); err != nil {
			return errdefs.InvalidArgumentf("defaults: %v", err)
		}
		d = templatestore.Defaults{Env: ad.Env, Cwd: ad.Cwd, User: ad.User, Limits: fromAPILimits(ad.Limits)}
	}
	res, err := s.eng.ImportTemplate(r.Context(), r.PathValue("name"), r.Body, d)
	if err != nil {
		return err
	}
	c.lg.Info("template imported", "name", r.PathValue("name"), "version", res.Version.Short(), "existed", res.Existed)
	status := http.StatusCreated
	if res.Existed {
		status = http.StatusOK
	}
	return writeJSON(w, status, api.ImportTemplateResult{
		Version: toAPIVersion(engine.TemplateInfo{Version: res.Version, Local: true, Stored: true}, ""),
		Existed: res.Existed, Previous: res.Previous,
	})
}

func (s *Server) tagTemplate(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.needOperator(c, "tagging a template"); err != nil {
		return err
	}
	var req api.TagTemplateRequest
	if err := readJSON(r, &req); err != nil {
		return err
	}
	v, err := s.eng.TagTemplate(r.Context(), r.PathValue("name"), req.Version)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPIVersion(engine.TemplateInfo{Version: v, Local: true, Stored: true}, ""))
}

func (s *Server) removeTemplate(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.needOperator(c, "removing a template"); err != nil {
		return err
	}
	if err := s.eng.RemoveTemplate(r.Context(), r.PathValue("ref")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) gcTemplates(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.needOperator(c, "collecting templates"); err != nil {
		return err
	}
	removed, err := s.eng.GCTemplates(r.Context())
	if err != nil {
		return err
	}
	if removed == nil {
		removed = []string{}
	}
	return writeJSON(w, http.StatusOK, api.GCTemplatesResult{Removed: removed})
}

func (s *Server) upgradeSandbox(w http.ResponseWriter, r *http.Request, c *call) error {
	var req api.UpgradeSandboxRequest
	if err := readJSON(r, &req); err != nil {
		return err
	}
	sb, err := s.eng.Upgrade(r.Context(), engine.UpgradeRequest{Tenant: c.tenant, Sandbox: r.PathValue("id"), Template: req.Template})
	if err != nil {
		return err
	}
	c.lg.Info("sandbox upgraded", "sandbox", r.PathValue("id"), "new_sandbox", sb.ID)
	return writeJSON(w, http.StatusCreated, toAPISandbox(sb))
}
