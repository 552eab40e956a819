package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"

	"github.com/amber-run/amber/api"
)

func tmplPath(ref string, rest ...string) string {
	p := "/v1/templates/" + url.PathEscape(ref)
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

// TemplateList lists the tags and every template version.
func (c *Client) TemplateList(ctx context.Context) (api.TemplateList, error) {
	var out api.TemplateList
	return out, c.do(ctx, "GET", "/v1/templates", nil, nil, &out)
}

// InspectTemplate returns the version ref names ("name", "name@sha256:…",
// "sha256:…").
func (c *Client) InspectTemplate(ctx context.Context, ref string) (api.TemplateVersion, error) {
	var out api.TemplateVersion
	return out, c.do(ctx, "GET", tmplPath(ref), nil, nil, &out)
}

// ImportTemplate uploads a root filesystem tarball as a version of name
// (with defaults, when set) and moves tag name to it. The operator's key.
func (c *Client) ImportTemplate(ctx context.Context, name string, tarball io.Reader, defaults *api.Template) (api.ImportTemplateResult, error) {
	var out api.ImportTemplateResult
	q := url.Values{}
	if defaults != nil {
		b, err := json.Marshal(struct {
			Env    []string   `json:"env,omitempty"`
			Cwd    string     `json:"cwd,omitempty"`
			User   string     `json:"user,omitempty"`
			Limits api.Limits `json:"limits"`
		}{defaults.Env, defaults.Cwd, defaults.User, defaults.Limits})
		if err != nil {
			return out, err
		}
		q.Set("defaults", string(b))
	}
	req, err := c.request(ctx, "POST", tmplPath(name, "import"), q, tarball, "application/x-tar")
	if err != nil {
		return out, err
	}
	resp, err := c.send(req)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("import template %s: decode answer: %w", name, err)
	}
	return out, nil
}

// TagTemplate points tag name at version (a digest or a reference).
func (c *Client) TagTemplate(ctx context.Context, name, version string) (api.TemplateVersion, error) {
	var out api.TemplateVersion
	return out, c.do(ctx, "PUT", tmplPath(name, "tag"), nil, api.TagTemplateRequest{Version: version}, &out)
}

// RemoveTemplate removes a tag ("name") or an unreferenced version
// ("name@sha256:…", "sha256:…").
func (c *Client) RemoveTemplate(ctx context.Context, ref string) error {
	return c.do(ctx, "DELETE", tmplPath(ref), nil, nil, nil)
}

// GCTemplates removes every version nothing references.
func (c *Client) GCTemplates(ctx context.Context) (api.GCTemplatesResult, error) {
	var out api.GCTemplatesResult
	return out, c.do(ctx, "POST", "/v1/templates/gc", nil, nil, &out)
}

// UpgradeSandbox moves sandbox id onto template (a reference): it returns
// the new sandbox; the old one is left stopped.
func (c *Client) UpgradeSandbox(ctx context.Context, id, template string) (api.Sandbox, error) {
	var out api.Sandbox
	return out, c.do(ctx, "POST", sbPath(id, "/upgrade"), nil, api.UpgradeSandboxRequest{Template: template}, &out)
}
