package criu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Interim writable layer: a plain overlay whose upper directory lives on the
// state directory's filesystem, without a disk limit. It is replaced by
// internal/layer (ext4 image with a size limit) once that package lands; the
// shape (create in a directory over a lower path, Merged, destroy by
// directory) is the same.

type overlayLayer struct{ dir string }

func (l overlayLayer) Merged() string { return filepath.Join(l.dir, "merged") }

func createLayer(dir, lower string, _ int64) (overlayLayer, error) {
	l := overlayLayer{dir: dir}
	for _, sub := range []string{"upper", "work", "merged"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return l, err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,xino=off",
		lower, filepath.Join(dir, "upper"), filepath.Join(dir, "work"))
	if err := unix.Mount("overlay", l.Merged(), "overlay", 0, opts); err != nil {
		return l, fmt.Errorf("mount overlay at %s: %w", l.Merged(), err)
	}
	return l, nil
}

func isMountPoint(path string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(path, &st) != nil || unix.Lstat(filepath.Dir(path), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// destroyLayer unmounts and removes a layer directory; it succeeds when the
// directory is already gone.
func destroyLayer(dir string) error {
	merged := filepath.Join(dir, "merged")
	for i := 0; i < 8 && isMountPoint(merged); i++ {
		if err := unix.Unmount(merged, 0); err != nil {
			if errors.Is(err, unix.EBUSY) {
				err = unix.Unmount(merged, unix.MNT_DETACH)
			}
			if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("unmount %s: %w", merged, err)
			}
		}
	}
	if err := os.RemoveAll(dir); err != nil && !isNotExist(err) {
		return err
	}
	return nil
}
