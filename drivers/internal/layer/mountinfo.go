package layer

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// mount is one line of /proc/self/mountinfo.
type mount struct {
	point  string // mount point, unescaped
	fstype string
	source string
}

// readMounts parses /proc/self/mountinfo: the mounts of the daemon's mount
// namespace, the only one this package mounts in.
func readMounts() ([]mount, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	var out []mount
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
		line := sc.Text()
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f := strings.Fields(pre)
		g := strings.Fields(post)
		if len(f) < 5 || len(g) < 2 {
			continue
		}
		out = append(out, mount{point: unescapeMount(f[4]), fstype: g[0], source: unescapeMount(g[1])})
	}
	return out, sc.Err()
}

// unescapeMount undoes the kernel's octal escaping of space, tab, newline
// and backslash in mountinfo fields.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// isMounted reports whether something is mounted exactly at path.
func isMounted(mounts []mount, path string) bool {
	for _, m := range mounts {
		if m.point == path {
			return true
		}
	}
	return false
}

// mountsUnder returns the mount points strictly below dir, deepest (and
// most recently stacked) first, the order in which they can be unmounted.
func mountsUnder(mounts []mount, dir string) []string {
	prefix := strings.TrimSuffix(dir, "/") + "/"
	var out []string
	for i := len(mounts) - 1; i >= 0; i-- { // later lines are mounted on top
		if strings.HasPrefix(mounts[i].point, prefix) {
			out = append(out, mounts[i].point)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unmount unmounts path. It never follows a symlink at path. When the mount
// is busy and lazy is set it detaches it (MNT_DETACH): the mount disappears
// from the namespace at once and is released when its last user goes.
// Unmounting something that is not mounted is not an error.
func unmount(path string, lazy bool) (detached bool, err error) {
	err = unix.Unmount(path, unix.UMOUNT_NOFOLLOW)
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
		return false, nil // not a mount point (any more)
	case errors.Is(err, unix.EBUSY) && lazy:
		if err := unix.Unmount(path, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return false, fmt.Errorf("unmount %s (lazy): %w", path, err)
		}
		return true, nil
	default:
		return false, fmt.Errorf("unmount %s: %w", path, err)
	}
}
