// Package confinedfs implements core/sandbox.FS over a host directory that
// is a sandbox's root (a layer's merged directory), for drivers whose
// sandboxes keep their root filesystem on the host.
//
// # Threat model
//
// The tenant chooses every path passed in, and the sandbox's processes can
// change anything inside the root at any moment: replace a directory with a
// symlink to "/", point a symlink at /proc/self/root, create FIFOs and device
// nodes, rename things while we walk them. The daemon runs as host root. A
// mistake here lets a tenant read or write any host file, so the rules are:
//
//  1. Every tenant path is resolved by the kernel with openat2(2) and
//     RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS against a file descriptor of the
//     root. The kernel treats the root as "/" for the whole walk: ".." at the
//     root stays at the root and absolute symlinks restart at the root, so the
//     result is what a process chrooted into the sandbox would see, and a
//     symlink swapped in during the walk is resolved the same way (there is no
//     check-then-use window). /proc/*/root style "magic links" are refused.
//     filepath.Join(root, p) followed by os.Open is never used: the host kernel
//     would follow the sandbox's symlinks out of the root.
//  2. Lexical ".." that climbs above "/" and relative paths are refused up
//     front (ErrInvalidArgument) so the tenant gets a clear error.
//  3. The last component is operated on through its parent's descriptor with
//     a single-name *at call that never follows a symlink (unlinkat, mkdirat,
//     renameat, readlinkat, fstatat with AT_SYMLINK_NOFOLLOW, openat with
//     O_NOFOLLOW|O_EXCL). Permissions and owners are set with fchmod/fchown on
//     an open descriptor, never by path.
//  4. Nothing but a regular file is ever opened for reading or writing: the
//     path is opened with O_PATH (which opens nothing), checked with fstat,
//     and only then re-opened through /proc/self/fd — the same inode, so a
//     swap after the check cannot substitute a device or a FIFO (a host disk,
//     or a read that blocks forever).
//  5. Error messages carry the sandbox path and the errno text, never the
//     host path, so the host's layout does not leak to tenants.
//  6. Directory walks (Remove, TarOut) go from descriptor to descriptor with
//     O_NOFOLLOW: they never follow a symlink, and they are bounded in depth.
//  7. TarIn resolves every entry beneath the target directory
//     (RESOLVE_BENEATH): an entry cannot be written through a symlink that
//     leads out of that directory, including one an earlier entry of the same
//     archive created; absolute names and escaping ".." are refused; hard links
//     must point inside; device nodes are refused; the total size is bounded.
//
// The root is opened afresh for each call (an FS holds no descriptor, so it
// never keeps a layer busy) and checked against the device and inode it had
// when New was called, so an FS never silently works on a directory that has
// been remounted or replaced.
//
// # Ownership
//
// Files and directories this package creates belong to the sandbox's root
// (uid 0, gid 0 inside the sandbox) unless WithOwner says otherwise; tar
// headers' owners are ignored. WithIDMap translates for a user-namespaced
// sandbox in which sandbox uid 0 is host uid N. Set-user-ID and set-group-ID
// bits are dropped from modes given by the caller or an archive.
package confinedfs

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

var _ sandbox.FS = (*FS)(nil)

// Defaults for the bounds; see WithTarLimits.
const (
	DefaultMaxTarBytes   = 4 << 30
	DefaultMaxTarEntries = 1 << 20
	// maxListEntries bounds List, and one directory in TarOut.
	maxListEntries = 1 << 20
	// maxDepth bounds the depth of directory walks (each level holds a
	// descriptor).
	maxDepth = 512
)

// FS is a sandbox's filesystem rooted at a host directory.
type FS struct {
	root     string
	dev, ino uint64

	ownerUID, ownerGID uint32 // sandbox-side owner of created files
	idmap              *idMap

	maxTarBytes   int64
	maxTarEntries int
}

type idMap struct{ hostUID, hostGID, size uint32 }

// Option configures New.
type Option func(*FS)

// WithIDMap says the sandbox runs in a user namespace where sandbox uid u
// (gid g), for u < size, is host uid hostUID+u (gid hostGID+g). Created files
// are chowned to the host ids of their sandbox owner, and TarOut reports
// sandbox ids.
func WithIDMap(hostUID, hostGID, size uint32) Option {
	return func(f *FS) { f.idmap = &idMap{hostUID, hostGID, size} }
}

// WithOwner makes created files belong to sandbox uid:gid instead of the
// sandbox's root (for a template whose user is not root).
func WithOwner(uid, gid uint32) Option {
	return func(f *FS) { f.ownerUID, f.ownerGID = uid, gid }
}

// WithTarLimits bounds what one TarIn may create: the sum of the entries'
// sizes (as declared, which for sparse entries is their expanded size — the
// "decompression bomb" case) and the number of entries. Zero keeps the
// default.
func WithTarLimits(maxBytes int64, maxEntries int) Option {
	return func(f *FS) {
		if maxBytes > 0 {
			f.maxTarBytes = maxBytes
		}
		if maxEntries > 0 {
			f.maxTarEntries = maxEntries
		}
	}
}

// New returns the FS of the sandbox whose root is the host directory root.
// It fails with ErrNotImplemented on kernels without openat2 (< 5.6).
func New(root string, opts ...Option) (*FS, error) {
	f := &FS{root: root, maxTarBytes: DefaultMaxTarBytes, maxTarEntries: DefaultMaxTarEntries}
	for _, o := range opts {
		o(f)
	}
	if f.idmap != nil && (f.ownerUID >= f.idmap.size || f.ownerGID >= f.idmap.size) {
		return nil, errdefs.InvalidArgumentf("confinedfs: owner %d:%d outside the id map (size %d)", f.ownerUID, f.ownerGID, f.idmap.size)
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("confinedfs: open root %s: %w", root, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("confinedfs: stat root %s: %w", root, err)
	}
	f.dev, f.ino = st.Dev, st.Ino
	// Probe openat2 once so that an old kernel fails here, clearly.
	probe, err := unix.Openat2(fd, ".", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: inRoot})
	if errors.Is(err, unix.ENOSYS) {
		return nil, errdefs.NotImplementedf("confinedfs: openat2 unavailable (Linux >= 5.6 needed)")
	}
	if err != nil {
		return nil, fmt.Errorf("confinedfs: openat2 on root %s: %w", root, err)
	}
	unix.Close(probe)
	return f, nil
}

// openRoot opens the root for one call and checks it is still the
// directory New saw.
func (f *FS) openRoot() (int, error) {
	fd, err := unix.Open(f.root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, errdefs.Unavailablef("sandbox filesystem unavailable: %v", errnoText(err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, errdefs.Unavailablef("sandbox filesystem unavailable: %v", errnoText(err))
	}
	if st.Dev != f.dev || st.Ino != f.ino {
		unix.Close(fd)
		return -1, errdefs.Unavailablef("sandbox filesystem was remounted or replaced")
	}
	return fd, nil
}

// hostOwner returns the host uid and gid that created files get.
func (f *FS) hostOwner() (int, int) {
	if f.idmap == nil {
		return int(f.ownerUID), int(f.ownerGID)
	}
	return int(f.idmap.hostUID + f.ownerUID), int(f.idmap.hostGID + f.ownerGID)
}

// sandboxIDs maps host ids to sandbox ids (65534, "nobody", for host ids
// the sandbox cannot see).
func (f *FS) sandboxIDs(uid, gid uint32) (int, int) {
	if f.idmap == nil {
		return int(uid), int(gid)
	}
	m := f.idmap
	su, sg := 65534, 65534
	if uid >= m.hostUID && uid-m.hostUID < m.size {
		su = int(uid - m.hostUID)
	}
	if gid >= m.hostGID && gid-m.hostGID < m.size {
		sg = int(gid - m.hostGID)
	}
	return su, sg
}

// Error is the error of an FS operation. It names the sandbox path only.
// errors.Is matches both its kind (errdefs.ErrNotFound, …) and its cause
// (an errno, hence also fs.ErrNotExist and friends).
type Error struct {
	Op   string
	Path string // sandbox path
	kind error
	err  error
}

func (e *Error) Error() string {
	msg := "failed"
	switch {
	case e.err != nil:
		msg = errnoText(e.err)
	case e.kind != nil:
		msg = e.kind.Error()
	}
	return fmt.Sprintf("%s %q: %s", e.Op, e.Path, msg)
}

// Unwrap returns the kind and the cause.
func (e *Error) Unwrap() []error {
	var out []error
	if e.kind != nil {
		out = append(out, e.kind)
	}
	if e.err != nil {
		out = append(out, e.err)
	}
	return out
}

// wrap makes err an *Error for op on the sandbox path p, classifying
// errnos. Errors that already are *Error or carry an errdefs kind pass
// through.
func wrap(op, p string, err error) error {
	if err == nil {
		return nil
	}
	var fe *Error
	if errors.As(err, &fe) {
		return err
	}
	// Strip *os.PathError and friends: their path may be a host path.
	var errno unix.Errno
	if errors.As(err, &errno) {
		return &Error{Op: op, Path: p, kind: kindOf(errno), err: errno}
	}
	if errdefs.Kind(err) != "internal" {
		return &Error{Op: op, Path: p, kind: err}
	}
	return &Error{Op: op, Path: p, err: err}
}

// failf returns an *Error of the given kind with a message.
func failf(op, p string, kind error, format string, args ...any) error {
	return &Error{Op: op, Path: p, kind: kind, err: fmt.Errorf(format, args...)}
}

func kindOf(e unix.Errno) error {
	switch e {
	case unix.ENOENT:
		return errdefs.ErrNotFound
	case unix.EEXIST:
		return errdefs.ErrAlreadyExists
	case unix.ENOTEMPTY, unix.EBUSY:
		return errdefs.ErrFailedPrecondition
	case unix.EACCES, unix.EPERM, unix.EROFS:
		return errdefs.ErrPermissionDenied
	case unix.EXDEV:
		// RESOLVE_BENEATH reports an escape with EXDEV.
		return errdefs.ErrPermissionDenied
	case unix.ELOOP, unix.ENOTDIR, unix.EISDIR, unix.ENAMETOOLONG, unix.EINVAL:
		return errdefs.ErrInvalidArgument
	case unix.ENOSPC, unix.EDQUOT, unix.EFBIG, unix.EMFILE, unix.ENFILE:
		return errdefs.ErrResourceExhausted
	case unix.EAGAIN:
		return errdefs.ErrUnavailable
	}
	return nil
}

// errnoText is the message of err without any path it may carry.
func errnoText(err error) string {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err.Error()
	}
	return err.Error()
}
