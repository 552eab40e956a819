package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// Catalog is the set of templates sandboxes can be born from. It is read once
// from a directory laid out by the setup scripts:
//
//	<dir>/<name>-<version>/rootfs/          the root filesystem (read-only)
//	<dir>/<name>-<version>/packages.txt     optional: what the rootfs holds
//	<dir>/<name>-<version>/template.json    optional: defaults (env, cwd, user, limits)
//
// Directories starting with "." are builds in progress and are ignored. When
// a name has several versions, the lexically last directory wins. A
// template's Version is a digest of its directory name and packages.txt, so
// a rebuilt template with other contents gets another version.
//
// A name the catalog does not know makes Get read the directory again, so a
// template imported while the daemon runs (`amber template import`) is found
// at its first use.
type Catalog struct {
	Dir string

	mu        sync.RWMutex
	templates map[string]sandbox.Template
}

// DefaultLimits apply to a template that states none.
var DefaultLimits = sandbox.Limits{
	MemoryBytes: 512 << 20,
	MilliCPUs:   1000,
	Pids:        1024,
	DiskBytes:   1 << 30,
}

// builtinDefaults are the defaults of the templates Amber ships.
var builtinDefaults = map[string]sandbox.Template{
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

// LoadCatalog reads the templates under dir. A missing dir is an empty
// catalog, not an error (`amber up` then says which command builds them).
func LoadCatalog(dir string) (*Catalog, error) {
	c := &Catalog{Dir: dir, templates: map[string]sandbox.Template{}}
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read templates in %s: %w", dir, err)
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	// Two builds of one template (its inputs changed, e.g. a package was
	// added): the one published last wins.
	published := map[string]time.Time{}
	for _, e := range ents {
		name, _, ok := strings.Cut(e.Name(), "-")
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || !ok || name == "" {
			continue
		}
		tdir := filepath.Join(dir, e.Name())
		if st, err := os.Stat(filepath.Join(tdir, "rootfs")); err != nil || !st.IsDir() {
			continue
		}
		st, err := os.Stat(tdir)
		if err != nil {
			continue
		}
		if prev, ok := published[name]; ok && st.ModTime().Before(prev) {
			continue
		}
		t, err := loadTemplate(name, tdir)
		if err != nil {
			return nil, err
		}
		c.templates[name] = t
		published[name] = st.ModTime()
	}
	return c, nil
}

func loadTemplate(name, dir string) (sandbox.Template, error) {
	t := builtinDefaults[name]
	t.Name = name
	t.RootFS = filepath.Join(dir, "rootfs")
	h := sha256.New()
	h.Write([]byte(filepath.Base(dir)))
	h.Write([]byte{0})
	if pk, err := os.ReadFile(filepath.Join(dir, "packages.txt")); err == nil {
		h.Write(pk)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "template.json")); err == nil {
		var over struct {
			Env    []string       `json:"env"`
			Cwd    string         `json:"cwd"`
			User   string         `json:"user"`
			Limits sandbox.Limits `json:"limits"`
		}
		if err := json.Unmarshal(b, &over); err != nil {
			return t, errdefs.InvalidArgumentf("template %s: %s/template.json: %v", name, dir, err)
		}
		h.Write(b)
		if over.Env != nil {
			t.Env = over.Env
		}
		if over.Cwd != "" {
			t.Cwd = over.Cwd
		}
		if over.User != "" {
			t.User = over.User
		}
		t.Limits = over.Limits
	}
	if len(t.Env) == 0 {
		t.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/root"}
	}
	t.Limits = MergeLimits(DefaultLimits, t.Limits)
	t.Version = "sha256:" + hex.EncodeToString(h.Sum(nil))[:24]
	return t, nil
}

// Get returns the template called name.
func (c *Catalog) Get(name string) (sandbox.Template, error) {
	c.mu.RLock()
	t, ok := c.templates[name]
	c.mu.RUnlock()
	if !ok && c.Dir != "" {
		if fresh, err := LoadCatalog(c.Dir); err == nil {
			c.mu.Lock()
			for n, ft := range fresh.templates {
				if _, known := c.templates[n]; !known {
					c.templates[n] = ft // known names keep their version until restart
				}
			}
			t, ok = c.templates[name]
			c.mu.Unlock()
		}
	}
	if !ok {
		return t, errdefs.NotFoundf("template %q (have: %s; build templates with `make setup`)", name, strings.Join(c.Names(), ", "))
	}
	return t, nil
}

// Names returns the template names, sorted.
func (c *Catalog) Names() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []string
	for n := range c.templates {
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
