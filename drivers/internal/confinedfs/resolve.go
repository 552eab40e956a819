package confinedfs

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

const (
	// inRoot resolves a tenant path as a process chrooted into the root
	// would, with no /proc magic links.
	inRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS
	// beneath resolves an archive entry under the extraction directory:
	// absolute symlinks and ".." that would leave it fail with EXDEV.
	beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS

	maxPath = 4095 // PATH_MAX without the NUL
	maxName = 255  // NAME_MAX
)

// parse validates a tenant's sandbox path and returns it relative to the
// root, lexically cleaned ("" is the root itself). Relative paths, NUL
// bytes, over-long paths or names, and ".." that climbs above "/" are
// ErrInvalidArgument. Cleaning is lexical ("/a/b/../c" is "/a/c" even if b
// is a symlink), as Go's path.Clean and most file APIs do; symlinks in the
// cleaned path are then resolved by the kernel, inside the root.
func parse(op, p string) (string, error) {
	switch {
	case p == "":
		return "", failf(op, p, errdefs.ErrInvalidArgument, "empty path")
	case p[0] != '/':
		return "", failf(op, p, errdefs.ErrInvalidArgument, "path must be absolute")
	case len(p) > maxPath:
		return "", failf(op, p[:64]+"...", errdefs.ErrInvalidArgument, "path too long")
	case strings.IndexByte(p, 0) >= 0:
		return "", failf(op, strings.ReplaceAll(p, "\x00", `\x00`), errdefs.ErrInvalidArgument, "NUL in path")
	}
	rel, err := cleanRel(p[1:])
	if err != nil {
		return "", failf(op, p, errdefs.ErrInvalidArgument, "%v", err)
	}
	return rel, nil
}

// cleanRel cleans a relative path lexically, refusing ".." above its start
// and over-long names.
func cleanRel(p string) (string, error) {
	var out []string
	for c := range strings.SplitSeq(p, "/") {
		switch c {
		case "", ".":
		case "..":
			if len(out) == 0 {
				return "", errors.New("path escapes the root")
			}
			out = out[:len(out)-1]
		default:
			if len(c) > maxName {
				return "", errors.New("name too long")
			}
			out = append(out, c)
		}
	}
	return strings.Join(out, "/"), nil
}

// split returns the parent of a cleaned relative path and its last name.
func split(rel string) (dir, base string) {
	dir, base = path.Split(rel)
	return strings.TrimSuffix(dir, "/"), base
}

// openat2 is openat2(2) with O_CLOEXEC, retrying EINTR and, a bounded
// number of times, EAGAIN (which RESOLVE_IN_ROOT returns when a rename or
// mount races with a ".." during the walk — a sandbox can provoke it, so
// the bound turns a busy loop into ErrUnavailable).
func openat2(dirfd int, rel string, flags int, mode uint32, resolve uint64) (int, error) {
	if rel == "" {
		rel = "."
	}
	how := &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolve}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, rel, how)
		if err == unix.EINTR || (err == unix.EAGAIN && i < 128) {
			continue
		}
		return fd, err
	}
}

// parent opens (O_PATH) the directory holding rel's last name, resolved
// from start with the given resolve flags, and returns the name.
func parent(start int, rel string, resolve uint64) (int, string, error) {
	dir, base := split(rel)
	fd, err := openat2(start, dir, unix.O_PATH|unix.O_DIRECTORY, 0, resolve)
	if err != nil {
		return -1, "", err
	}
	return fd, base, nil
}

// reopen turns an O_PATH descriptor into a real one with flags, through
// /proc/self/fd (the kernel opens the very inode the O_PATH descriptor
// refers to; no path is looked up again), and checks that it did.
func reopen(opath int, flags int) (int, error) {
	fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", opath), flags|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return -1, err
	}
	var a, b unix.Stat_t
	if err := unix.Fstat(opath, &a); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Fstat(fd, &b); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if a.Dev != b.Dev || a.Ino != b.Ino {
		unix.Close(fd)
		return -1, errors.New("reopen: inode changed")
	}
	return fd, nil
}

// raceHook, when set (tests only), is called at the points where a
// sandbox could swap name in the directory dirfd between our look and our
// use: the tests swap in a symlink there, deterministically.
var raceHook func(point string, dirfd int, name string)

func race(point string, dirfd int, name string) {
	if raceHook != nil {
		raceHook(point, dirfd, name)
	}
}

// errNotRegular is returned for paths that are not regular files.
var errNotRegular = errors.New("not a regular file")

// openRegular opens, for reading, the regular file that the O_PATH
// descriptor opath refers to. It refuses (errNotRegular) anything else
// before opening it: opening a device node can have side effects or expose
// a host device, and opening a FIFO can block forever.
func openRegular(opath int) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Fstat(opath, &st); err != nil {
		return -1, st, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return -1, st, unix.EISDIR
		}
		return -1, st, errNotRegular
	}
	fd, err := reopen(opath, unix.O_RDONLY)
	return fd, st, err
}

// mkdirAll makes sure the directory rel (relative to start, resolved with
// resolve) exists, creating missing components with perm, owned by
// uid:gid, and returns an O_PATH descriptor of it.
//
// Each prefix is resolved afresh from start, so symlinked components behave
// as they would inside the sandbox and a swap between steps is resolved
// under the same confinement. A missing component is created with mkdirat
// in its resolved parent (a single name: nothing is followed), then opened
// with O_NOFOLLOW|O_DIRECTORY to set owner and mode on the descriptor.
func mkdirAll(start int, rel string, perm uint32, uid, gid int, resolve uint64) (int, error) {
	if fd, err := openat2(start, rel, unix.O_PATH|unix.O_DIRECTORY, 0, resolve); err == nil || err != unix.ENOENT {
		return fd, err
	}
	cur, err := unix.Dup(start)
	if err != nil {
		return -1, err
	}
	var prefix string
	for c := range strings.SplitSeq(rel, "/") {
		if prefix == "" {
			prefix = c
		} else {
			prefix += "/" + c
		}
		next, err := openat2(start, prefix, unix.O_PATH|unix.O_DIRECTORY, 0, resolve)
		if err == unix.ENOENT {
			err = unix.Mkdirat(cur, c, 0o700)
			if err == nil {
				race("mkdir", cur, c)
				err = fixupDir(cur, c, perm, uid, gid)
			} else if err == unix.EEXIST {
				err = nil // raced with someone: use theirs
			}
			if err == nil {
				next, err = openat2(start, prefix, unix.O_PATH|unix.O_DIRECTORY, 0, resolve)
			}
		}
		unix.Close(cur)
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

// fixupDir sets owner and mode of the directory name in dirfd through a
// descriptor opened with O_DIRECTORY|O_NOFOLLOW — never through a path, so
// a symlink swapped in cannot redirect the chown or chmod, and O_DIRECTORY
// makes the kernel refuse anything but a directory before opening it.
func fixupDir(dirfd int, name string, perm uint32, uid, gid int) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return err
	}
	return unix.Fchmod(fd, perm)
}

// readlinkat reads the target of the symlink name in dirfd, as stored.
func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size || size > maxPath {
			return string(buf[:n]), nil
		}
	}
}

// perm converts a caller's or an archive's mode to the permission bits we
// set: rwx bits and the sticky bit; set-user-ID and set-group-ID are
// dropped (a tenant must not be able to plant a set-ID binary owned by the
// sandbox's root).
func perm(mode uint32, dflt uint32) uint32 {
	p := mode & (0o777 | unix.S_ISVTX)
	if p == 0 {
		return dflt
	}
	return p
}
