package engine

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/internal/state/templatestore"
)

// Catalog is the set of templates sandboxes can be born from: a view of
// internal/state/templatestore (immutable versions named by content digest, tags
// naming them, the blob store keeping every version) that turns versions
// into the driver's sandbox.Template.
//
// Get resolves a reference at create time: "python" (the tag's current
// version; a template built by the setup scripts under Dir is adopted as a
// version at its first use), "python@sha256:<hex>" or "sha256:<hex>" (that
// exact version). Version returns the exact version a sandbox or checkpoint
// recorded, fetching it from the blob store when this node has no copy:
// a restore never runs on other files than the ones it was cut on.
type Catalog struct {
	// Dir is where the setup scripts build templates.
	Dir   string
	store *templatestore.Store
}

// CatalogOptions configure NewCatalog.
type CatalogOptions struct {
	// Dir holds the setup scripts' templates ($AMBER_CACHE/templates).
	Dir string
	// Root is this node's cache of versions and tags (DATA_DIR/templates).
	Root string
	// Blobs and Chunks keep versions in the blob store (nil: node-local).
	Blobs  blob.Store
	Chunks *chunkstore.Store
	Logger *slog.Logger
}

// DefaultLimits apply to a template that states none.
var DefaultLimits = sandbox.Limits{
	MemoryBytes: 512 << 20,
	MilliCPUs:   1000,
	Pids:        1024,
	DiskBytes:   1 << 30,
}

// builtinDefaults are the defaults of the setup scripts' templates that
// have no template.json.
var builtinDefaults = map[string]templatestore.Defaults{
	"minimal": {
		Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "TERM=xterm"},
		Cwd: "/root", User: "0:0",
	},
	"python": {
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
			"LANG=C.UTF-8", "TERM=xterm", "PYTHONUNBUFFERED=1"},
		Cwd: "/root", User: "0:0",
	},
}

// NewCatalog opens the catalog.
func NewCatalog(o CatalogOptions) (*Catalog, error) {
	st, err := templatestore.Open(templatestore.Config{Root: o.Root, LegacyDir: o.Dir, LegacyDefaults: builtinDefaults,
		Blobs: o.Blobs, Chunks: o.Chunks, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	return &Catalog{Dir: o.Dir, store: st}, nil
}

// Store is the catalog's version store.
func (c *Catalog) Store() *templatestore.Store { return c.store }

// Template turns version v, under name, into what a driver needs.
func Template(name string, v templatestore.Version) sandbox.Template {
	t := sandbox.Template{Name: name, Version: v.Digest, RootFS: v.Path,
		Env: v.Defaults.Env, Cwd: v.Defaults.Cwd, User: v.Defaults.User}
	if len(t.Env) == 0 {
		t.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/root"}
	}
	t.Limits = MergeLimits(DefaultLimits, v.Defaults.Limits)
	return t
}

// Get resolves ref ("name", "name@sha256:<hex>", "sha256:<hex>").
func (c *Catalog) Get(ref string) (sandbox.Template, error) {
	return c.GetContext(context.Background(), ref)
}

// GetContext is Get with a context (a version may be fetched).
func (c *Catalog) GetContext(ctx context.Context, ref string) (sandbox.Template, error) {
	v, err := c.store.Resolve(ctx, ref)
	if errdefs.IsNotFound(err) {
		return sandbox.Template{}, fmt.Errorf("%w (have: %s; build templates with `make setup` or `amber template import`)", err, strings.Join(c.Names(), ", "))
	}
	if err != nil {
		return sandbox.Template{}, err
	}
	name, _, _ := strings.Cut(ref, "@")
	if strings.HasPrefix(ref, "sha256:") {
		name = v.Name
	}
	return Template(name, v), nil
}

// Version returns exactly version of template name (fetched from the
// blob store when this node has no copy).
func (c *Catalog) Version(ctx context.Context, name, version string) (sandbox.Template, error) {
	if _, err := templatestore.ParseDigest(version); err != nil && name != "" {
		// A version string from before content addressing: adopting the
		// setup-script template records it as an alias.
		_, _ = c.store.Resolve(ctx, name)
	}
	v, err := c.store.Version(ctx, version)
	if err != nil {
		return sandbox.Template{}, fmt.Errorf("template %s version %s: %w", name, templatestore.Short(version), err)
	}
	t := Template(name, v)
	t.Version = version // an alias stays what the sandbox and its images recorded
	return t, nil
}

// Digest returns the content digest of version of template name (the
// same unless version is an alias).
func (c *Catalog) Digest(ctx context.Context, name, version string) (string, error) {
	if _, err := c.Version(ctx, name, version); err != nil {
		return "", err
	}
	v, err := c.store.Version(ctx, version)
	return v.Digest, err
}

// Names returns the template names (tags, and setup-script templates not
// adopted yet), sorted.
func (c *Catalog) Names() []string {
	set := map[string]bool{}
	if tags, err := c.store.Tags(); err == nil {
		for n := range tags {
			set[n] = true
		}
	}
	if c.Dir != "" {
		ents, _ := os.ReadDir(c.Dir)
		for _, e := range ents {
			name, _, ok := strings.Cut(e.Name(), "-")
			if e.IsDir() && ok && name != "" && !strings.HasPrefix(e.Name(), ".") && templatestore.ValidName.MatchString(name) {
				if st, err := os.Stat(filepath.Join(c.Dir, e.Name(), "rootfs")); err == nil && st.IsDir() {
					set[name] = true
				}
			}
		}
	}
	var out []string
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// MergeLimits returns base with every non-zero field of over applied.
func MergeLimits(base, over sandbox.Limits) sandbox.Limits {
	if over.MemoryBytes != 0 {
		base.MemoryBytes = over.MemoryBytes
	}
	if over.MilliCPUs != 0 {
		base.MilliCPUs = over.MilliCPUs
	}
	if over.Pids != 0 {
		base.Pids = over.Pids
	}
	if over.DiskBytes != 0 {
		base.DiskBytes = over.DiskBytes
	}
	return base
}

// ValidateLimits refuses limits no sandbox could run with.
func ValidateLimits(l sandbox.Limits) error {
	switch {
	case l.MemoryBytes < 0 || l.MilliCPUs < 0 || l.Pids < 0 || l.DiskBytes < 0:
		return errdefs.InvalidArgumentf("limits must not be negative: %+v", l)
	case l.MemoryBytes != 0 && l.MemoryBytes < 16<<20:
		return errdefs.InvalidArgumentf("memory limit %d bytes is below the 16 MiB minimum", l.MemoryBytes)
	case l.MilliCPUs != 0 && l.MilliCPUs < 10:
		return errdefs.InvalidArgumentf("cpu limit %dm is below the 10m minimum", l.MilliCPUs)
	case l.Pids != 0 && l.Pids < 8:
		return errdefs.InvalidArgumentf("pids limit %d is below the minimum of 8", l.Pids)
	case l.DiskBytes != 0 && l.DiskBytes < 1<<20:
		return errdefs.InvalidArgumentf("disk limit %d bytes is below the 1 MiB minimum", l.DiskBytes)
	}
	return nil
}
