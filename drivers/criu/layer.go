package criu

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/internal/layer"
)

// The sandbox's root filesystem is an internal/layer overlay (a writable,
// size-bounded ext4 image on a loop device) over the template seen through
// an idmapped mount. The idmapped mount is detached: it is handed to the
// overlay as /proc/self/fd/N while the overlay is mounted and closed after,
// the overlay holding the only reference. So the host mount table gains the
// layer's two mounts and nothing else, and Destroy of the layer frees all.

// withIdmappedTemplate calls fn with the path of an idmapped, read-only view
// of rec's template in which host uid u appears as rec.HostID+u.
func withIdmappedTemplate(rec *record, fn func(lower string) error) error {
	ns, err := usernsFD(rec.HostID, idsPerSandbox)
	if err != nil {
		return err
	}
	defer ns.Close()
	tree, err := idmappedTree(rec.Template.RootFS, ns)
	if err != nil {
		return err
	}
	defer tree.Close()
	return fn(fmt.Sprintf("/proc/self/fd/%d", tree.Fd()))
}

// mountRootfs creates and mounts the sandbox's layer and returns the path of
// its root. The layer's upper directory takes the owner of the lower root,
// which the idmapping shows as sandbox root: the sandbox owns its "/".
func (d *Driver) mountRootfs(rec *record) (string, error) {
	var l *layer.Layer
	err := withIdmappedTemplate(rec, func(lower string) error {
		var err error
		l, err = layer.Create(d.layerDir(rec.ID), lower, rec.Limits.DiskBytes)
		return err
	})
	if err != nil {
		return "", err
	}
	return l.Merged(), nil
}

// ensureRootfs returns the sandbox's root, mounting its layer again when it
// is not mounted (after a host reboot). Mounts outlive the daemon, so after
// a mere daemon restart this only checks.
func (d *Driver) ensureRootfs(rec *record) (string, error) {
	merged := filepath.Join(d.layerDir(rec.ID), "merged")
	if isMountPoint(merged) {
		return merged, nil
	}
	var l *layer.Layer
	err := withIdmappedTemplate(rec, func(lower string) error {
		var err error
		l, err = layer.Open(d.layerDir(rec.ID), layer.WithLower(lower))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("remount layer: %w", err)
	}
	return l.Merged(), nil
}

func isMountPoint(path string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(path, &st) != nil || unix.Lstat(filepath.Dir(path), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// destroyLayer removes the layer directory; nil when it is already gone.
func destroyLayer(dir string) error {
	if _, err := os.Lstat(dir); isNotExist(err) {
		return nil
	}
	return layer.Destroy(dir)
}
