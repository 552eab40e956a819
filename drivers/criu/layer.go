package criu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/drivers/internal/layer"
)

// The sandbox's root filesystem is an drivers/internal/layer overlay (a writable,
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

// rootfsPath is where the sandbox's root is mounted for its processes: a
// bind mount of the layer's merged directory under RunDir (see
// Options.RunDir for why not the merged directory itself).
func (d *Driver) rootfsPath(id string) string { return filepath.Join(d.opts.RunDir, id) }

// mountRootfs creates and mounts the sandbox's layer, binds it at
// rootfsPath and returns that path. The layer's upper directory takes the
// owner of the lower root, which the idmapping shows as sandbox root: the
// sandbox owns its "/".
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
	return d.bindRootfs(rec.ID, l.Merged())
}

func (d *Driver) bindRootfs(id, merged string) (string, error) {
	dst := d.rootfsPath(id)
	if err := os.Mkdir(dst, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	if err := unix.Mount(merged, dst, "", unix.MS_BIND, ""); err != nil {
		return "", fmt.Errorf("bind %s at %s: %w", merged, dst, err)
	}
	return dst, nil
}

// ensureRootfs returns the sandbox's root, mounting its layer and binding
// it again when they are not mounted (after a host reboot). Mounts outlive
// the daemon, so after a mere daemon restart this only checks.
func (d *Driver) ensureRootfs(rec *record) (string, error) {
	dst := d.rootfsPath(rec.ID)
	if isMountPoint(dst) {
		return dst, nil
	}
	merged := filepath.Join(d.layerDir(rec.ID), "merged")
	if !isMountPoint(merged) {
		err := withIdmappedTemplate(rec, func(lower string) error {
			l, err := layer.Open(d.layerDir(rec.ID), layer.WithLower(lower))
			if err == nil {
				merged = l.Merged()
			}
			return err
		})
		if err != nil {
			return "", fmt.Errorf("remount layer: %w", err)
		}
	}
	return d.bindRootfs(rec.ID, merged)
}

// unmountRootfs removes the bind mount at rootfsPath (detaching it lazily
// when busy) and its mount point; nil when it is already gone.
func (d *Driver) unmountRootfs(id string) error {
	dst := d.rootfsPath(id)
	for i := 0; i < 8 && isMountPoint(dst); i++ {
		err := unix.Unmount(dst, 0)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(dst, unix.MNT_DETACH)
		}
		if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w", dst, err)
		}
	}
	if err := os.Remove(dst); err != nil && !isNotExist(err) {
		return err
	}
	return nil
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
