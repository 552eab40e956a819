package layer

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Xattrs returns the extended attributes of p itself (never following a
// symlink), such as the overlay's trusted.overlay.opaque marker that a
// checkpoint of the upper directory must keep. A filesystem without xattr
// support gives none; an attribute removed while listing is skipped.
func Xattrs(p string) (map[string]string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if errors.Is(err, unix.ERANGE) {
		sz, err2 := unix.Llistxattr(p, nil)
		if err2 != nil {
			return nil, err2
		}
		buf = make([]byte, sz)
		n, err = unix.Llistxattr(p, buf)
	}
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, fmt.Errorf("listxattr %s: %w", p, err)
	}
	out := map[string]string{}
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		sz, err := unix.Lgetxattr(p, name, nil)
		if err != nil {
			if errors.Is(err, unix.ENODATA) {
				continue
			}
			return nil, fmt.Errorf("getxattr %s %s: %w", p, name, err)
		}
		v := make([]byte, sz)
		if sz > 0 {
			if sz, err = unix.Lgetxattr(p, name, v); err != nil {
				return nil, fmt.Errorf("getxattr %s %s: %w", p, name, err)
			}
		}
		out[name] = string(v[:sz])
	}
	return out, nil
}
