package layer

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

// Mount points inside a sandbox's root.
//
// Every name below a sandbox's root is the tenant's: the sandbox itself,
// the files API and a restored checkpoint's layer can each make /tmp a
// symlink. A host path built as root+"/tmp" and handed to a runtime (or to
// mount(2)) is resolved by the host kernel, through the tenant's link, to
// whatever host directory it names. So the drivers never do that: a
// directory of the root that is to be mounted, or mounted on, is opened
// here by descriptor, with openat2 resolving inside the root and refusing
// any symlink (RESOLVE_IN_ROOT|RESOLVE_NO_SYMLINKS) or mount crossing
// (RESOLVE_NO_XDEV), and a layer whose mount point is anything but a real
// directory is refused with an error naming it.

// resolveMountPoint is how a mount point is looked up below a root.
const resolveMountPoint = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// OpenMountPoint opens directory p (an absolute path inside the root, such
// as "/tmp") below the directory open as rootfd, as an O_PATH descriptor.
// It fails with errdefs.ErrFailedPrecondition naming p when p or one of its
// parents is not a real directory of the root's filesystem (a symlink, a
// file, a device, another mount), and with errdefs.ErrNotFound when it
// does not exist.
func OpenMountPoint(rootfd int, p string) (*os.File, error) {
	rel, err := mountRel(p)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Openat2(rootfd, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: resolveMountPoint,
	})
	if err == nil {
		return os.NewFile(uintptr(fd), p), nil
	}
	if errors.Is(err, unix.ENOENT) {
		// A parent may be the culprit (a dangling symlink is ELOOP).
		if cerr := classify(rootfd, rel); cerr != nil {
			return nil, cerr
		}
		return nil, errdefs.NotFoundf("layer: %s does not exist", p)
	}
	if cerr := classify(rootfd, rel); cerr != nil {
		return nil, cerr
	}
	return nil, fmt.Errorf("layer: open %s: %w", p, err)
}

// CheckMountPoints opens the tree at root and checks that each of paths
// is a real directory of it or does not exist (a runtime creates a missing
// mount point inside the root). See OpenMountPoint.
func CheckMountPoints(root string, paths ...string) error {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("layer: open root: %w", err)
	}
	defer unix.Close(rfd)
	for _, p := range paths {
		f, err := OpenMountPoint(rfd, p)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		f.Close()
	}
	return nil
}

// BindMountPoint binds directory p of the tree at root onto target, an
// existing empty directory of the daemon's that no tenant can reach, with
// nosuid and nodev and private propagation. The directory is opened by
// descriptor (OpenMountPoint) and the bind's source is that descriptor
// (/proc/self/fd/N, which the kernel follows to the very directory opened,
// not by name). So once it returns, target is that directory whatever the
// tenant does to the name p afterwards: a runtime given target as a mount
// source cannot be steered to a host path. Undo with UnbindMountPoint.
func BindMountPoint(root, p, target string) (err error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("layer: open root: %w", err)
	}
	defer unix.Close(rfd)
	f, err := OpenMountPoint(rfd, p)
	if errdefs.IsNotFound(err) {
		return errdefs.FailedPreconditionf("layer: %s does not exist: refusing to mount", p)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	src := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("layer: bind %s at %s: %w", p, target, err)
	}
	defer func() {
		if err != nil {
			_, _ = unmount(target, true)
		}
	}()
	// A bind ignores every flag but MS_REC; the remount sets them (the
	// atime flags are kept when none is given).
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|MountFlags, ""); err != nil {
		return fmt.Errorf("layer: bind %s at %s: nosuid,nodev: %w", p, target, err)
	}
	if err := unix.Mount("", target, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("layer: bind %s at %s: private: %w", p, target, err)
	}
	return nil
}

// UnbindMountPoint removes what BindMountPoint mounted at target (detached
// lazily if busy). Nothing mounted there is not an error.
func UnbindMountPoint(target string) error {
	_, err := unmount(target, true)
	return err
}

// mountRel turns "/tmp" into "tmp", refusing what is not a plain absolute
// path (the paths are the drivers' own constants).
func mountRel(p string) (string, error) {
	rel, ok := strings.CutPrefix(p, "/")
	if !ok || rel == "" {
		return "", errdefs.InvalidArgumentf("layer: mount point %q: want an absolute path below /", p)
	}
	for _, c := range strings.Split(rel, "/") {
		if c == "" || c == "." || c == ".." {
			return "", errdefs.InvalidArgumentf("layer: mount point %q: want a clean path", p)
		}
	}
	return rel, nil
}

// classify walks rel below rootfd one component at a time, without
// following anything, and returns the error naming the first component
// that is not a real directory of the root's filesystem; nil when every
// existing component is one (the rest is missing).
func classify(rootfd int, rel string) error {
	var root unix.Stat_t
	if err := unix.Fstat(rootfd, &root); err != nil {
		return fmt.Errorf("layer: stat root: %w", err)
	}
	dir, err := unix.Dup(rootfd)
	if err != nil {
		return err
	}
	defer func() { unix.Close(dir) }()
	cur := ""
	for _, c := range strings.Split(rel, "/") {
		cur += "/" + c
		var st unix.Stat_t
		if err := unix.Fstatat(dir, c, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return fmt.Errorf("layer: stat %s: %w", cur, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return errdefs.FailedPreconditionf("layer: %s is not a directory (%s): refusing to mount", cur, kindOf(st.Mode))
		}
		if st.Dev != root.Dev {
			return errdefs.FailedPreconditionf("layer: %s is another mount: refusing to mount", cur)
		}
		next, err := unix.Openat(dir, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("layer: open %s: %w", cur, err)
		}
		unix.Close(dir)
		dir = next
	}
	return nil
}

func kindOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return "a symlink"
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	}
	return fmt.Sprintf("mode %#o", mode&unix.S_IFMT)
}

// MountFlags are the per-mount flags of every mount of a layer (the ext4
// image and the overlay) and of the binds made from it: no set-id or
// file-capability bits take effect and no device node opens through them,
// on the host or in a sandbox whose root is the layer. A sandbox never
// needs either (the criu driver sets no_new_privs, the gvisor driver
// NoNewPrivileges; device nodes come from the runtime's /dev), and a layer
// is written by tenants: a device node or set-id file restored from a
// checkpoint or unpacked from a tar must stay inert.
const MountFlags = unix.MS_NOSUID | unix.MS_NODEV

// hardenMount gives the mount at path MountFlags if it lacks them (a layer
// mounted by an older daemon, found mounted by Open).
func hardenMount(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", path, err)
	}
	if st.Flags&unix.ST_NOSUID != 0 && st.Flags&unix.ST_NODEV != 0 {
		return nil
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	err := unix.MountSetattr(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, &attr)
	if errors.Is(err, unix.ENOSYS) {
		// Before Linux 5.12: a bind remount sets the per-mount flags
		// given and clears the others, so keep what was set.
		flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | MountFlags)
		for _, f := range []struct{ st, ms int64 }{
			{unix.ST_RDONLY, unix.MS_RDONLY}, {unix.ST_NOEXEC, unix.MS_NOEXEC},
			{unix.ST_NOATIME, unix.MS_NOATIME}, {unix.ST_NODIRATIME, unix.MS_NODIRATIME},
			{unix.ST_RELATIME, unix.MS_RELATIME},
		} {
			if int64(st.Flags)&f.st != 0 {
				flags |= uintptr(f.ms)
			}
		}
		err = unix.Mount("", path, "", flags, "")
	}
	if err != nil {
		return fmt.Errorf("nosuid,nodev on %s: %w", path, err)
	}
	return nil
}
