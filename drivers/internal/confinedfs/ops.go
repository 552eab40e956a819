package confinedfs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/lib/statmode"
)

// ReadFile copies the regular file at p (symlinks followed inside the root)
// to w. Anything but a regular file is ErrInvalidArgument, refused before it
// is opened.
func (f *FS) ReadFile(ctx context.Context, p string, w io.Writer) error {
	const op = "read"
	rel, err := parse(op, p)
	if err != nil {
		return err
	}
	root, err := f.openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	opath, err := openat2(root, rel, unix.O_PATH, 0, inRoot)
	if err != nil {
		return wrap(op, p, err)
	}
	defer unix.Close(opath)
	fd, _, err := openRegular(opath)
	if err != nil {
		return wrapRegular(op, p, err)
	}
	file := os.NewFile(uintptr(fd), p)
	defer file.Close()
	if _, err := io.Copy(w, ctxReader{ctx, file}); err != nil {
		return wrap(op, p, err)
	}
	return nil
}

func wrapRegular(op, p string, err error) error {
	if errors.Is(err, errNotRegular) {
		return failf(op, p, errdefs.ErrInvalidArgument, "not a regular file")
	}
	return wrap(op, p, err)
}

// WriteFile replaces the file at p with the content of r, atomically:
// the content goes to a new temporary file in the same directory (created
// with O_EXCL|O_NOFOLLOW, so nothing existing is written through), which is
// chowned to the owner, chmodded to mode (0 means 0644; set-ID bits are
// dropped), fsynced, and renamed over p; then the directory is fsynced.
// A symlink at p is replaced, not followed. Missing parent directories are
// created (0755). A directory at p is ErrInvalidArgument.
func (f *FS) WriteFile(ctx context.Context, p string, r io.Reader, mode os.FileMode) error {
	const op = "write"
	rel, err := parse(op, p)
	if err != nil {
		return err
	}
	if rel == "" {
		return failf(op, p, errdefs.ErrInvalidArgument, "is the root directory")
	}
	root, err := f.openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	uid, gid := f.hostOwner()
	dir, base := split(rel)
	dfd, err := mkdirAll(root, dir, 0o755, uid, gid, inRoot)
	if err != nil {
		return wrap(op, p, err)
	}
	defer unix.Close(dfd)
	err = writeAt(ctx, dfd, base, r, writeOpts{perm: perm(unixPerm(mode), 0o644), uid: uid, gid: gid, sync: true, label: p})
	return wrap(op, p, err)
}

type writeOpts struct {
	perm     uint32
	uid, gid int
	mtime    time.Time // zero: leave as written
	sync     bool      // fsync the file and the directory
	label    string    // sandbox path, for error messages
}

// writeAt atomically replaces name in the directory dfd (an O_PATH
// descriptor) with r's content; see WriteFile.
func writeAt(ctx context.Context, dfd int, name string, r io.Reader, o writeOpts) error {
	var tmp string
	fd := -1
	var err error
	for range 8 {
		tmp = tempName()
		fd, err = unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != unix.EEXIST {
			break
		}
	}
	if err != nil {
		return err
	}
	file := os.NewFile(uintptr(fd), o.label)
	done := false
	defer func() {
		file.Close()
		if !done {
			_ = unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	if err := unix.Fchown(fd, o.uid, o.gid); err != nil {
		return err
	}
	if _, err := io.Copy(file, ctxReader{ctx, r}); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, o.perm); err != nil {
		return err
	}
	if !o.mtime.IsZero() {
		ts := unix.NsecToTimespec(o.mtime.UnixNano())
		if err := unix.UtimesNanoAt(fd, "", []unix.Timespec{ts, ts}, unix.AT_EMPTY_PATH); err != nil {
			return err
		}
	}
	if o.sync {
		if err := unix.Fsync(fd); err != nil {
			return err
		}
	}
	if err := unix.Renameat(dfd, tmp, dfd, name); err != nil {
		return err
	}
	done = true
	if o.sync {
		return syncDir(dfd)
	}
	return nil
}

// syncDir fsyncs the directory an O_PATH descriptor refers to.
func syncDir(opath int) error {
	fd, err := unix.Openat(opath, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsync(fd)
}

// tempName names temporary files; a variable so that tests can make the
// name predictable, as an attacker who guessed it would.
var tempName = func() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return ".amber-" + hex.EncodeToString(b[:]) + ".tmp"
}

// Stat describes p without following a symlink at p (lstat); a symlink's
// target is read with readlinkat and reported as stored, never resolved.
// Symlinks in the parent directories are followed inside the root.
func (f *FS) Stat(ctx context.Context, p string) (sandbox.FileInfo, error) {
	const op = "stat"
	rel, err := parse(op, p)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	root, err := f.openRoot()
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	defer unix.Close(root)
	var st unix.Stat_t
	if rel == "" {
		if err := unix.Fstat(root, &st); err != nil {
			return sandbox.FileInfo{}, wrap(op, p, err)
		}
		return fileInfo("/", &st), nil
	}
	dfd, base, err := parent(root, rel, inRoot)
	if err != nil {
		return sandbox.FileInfo{}, wrap(op, p, err)
	}
	defer unix.Close(dfd)
	return statAt(op, p, dfd, base)
}

func statAt(op, p string, dfd int, name string) (sandbox.FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return sandbox.FileInfo{}, wrap(op, p, err)
	}
	fi := fileInfo(name, &st)
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		link, err := readlinkat(dfd, name)
		if err != nil {
			return sandbox.FileInfo{}, wrap(op, p, err)
		}
		fi.Link = link
	}
	return fi, nil
}

// List describes the entries of the directory p (a symlink at p is
// followed inside the root), sorted by name, each as Stat would.
func (f *FS) List(ctx context.Context, p string) ([]sandbox.FileInfo, error) {
	const op = "list"
	rel, err := parse(op, p)
	if err != nil {
		return nil, err
	}
	root, err := f.openRoot()
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	// O_DIRECTORY: the kernel refuses a non-directory before opening it.
	fd, err := openat2(root, rel, unix.O_RDONLY|unix.O_DIRECTORY, 0, inRoot)
	if err != nil {
		return nil, wrap(op, p, err)
	}
	d := os.NewFile(uintptr(fd), p)
	defer d.Close()
	names, err := readNames(ctx, d)
	if err != nil {
		return nil, wrap(op, p, err)
	}
	out := make([]sandbox.FileInfo, 0, len(names))
	for _, n := range names {
		fi, err := statAt(op, p, fd, n)
		if errdefs.IsNotFound(err) {
			continue // removed since readdir
		}
		if err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	return out, nil
}

// readNames returns the sorted names in the directory d (without stat:
// os.DirEntry.Info would lstat by path, on the host). At most
// maxListEntries.
func readNames(ctx context.Context, d *os.File) ([]string, error) {
	var names []string
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		batch, err := d.Readdirnames(1024)
		names = append(names, batch...)
		if len(names) > maxListEntries {
			return nil, errdefs.ResourceExhaustedf("more than %d entries", maxListEntries)
		}
		if errors.Is(err, io.EOF) || (err == nil && len(batch) == 0) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	slices.Sort(names)
	return names, nil
}

// Mkdir makes the directory p and any missing parents (MkdirAll), each
// with mode (0 means 0755), owned by the owner. An existing directory (or a
// symlink to one, inside the root) is not an error.
func (f *FS) Mkdir(ctx context.Context, p string, mode os.FileMode) error {
	const op = "mkdir"
	rel, err := parse(op, p)
	if err != nil {
		return err
	}
	root, err := f.openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	if rel == "" {
		return nil
	}
	uid, gid := f.hostOwner()
	fd, err := mkdirAll(root, rel, perm(unixPerm(mode), 0o755), uid, gid, inRoot)
	if err != nil {
		if err == unix.ENOTDIR {
			return failf(op, p, errdefs.ErrAlreadyExists, "a path component exists and is not a directory")
		}
		return wrap(op, p, err)
	}
	unix.Close(fd)
	return nil
}

// Remove removes p: a symlink is removed, never followed. A directory must
// be empty unless recursive; recursive removal walks it through directory
// descriptors opened with O_NOFOLLOW and removes entries with unlinkat, so
// it stays inside the tree even while the sandbox renames or swaps things
// in it. Removing a missing path is ErrNotFound; removing "/" is refused.
func (f *FS) Remove(ctx context.Context, p string, recursive bool) error {
	const op = "remove"
	rel, err := parse(op, p)
	if err != nil {
		return err
	}
	if rel == "" {
		return failf(op, p, errdefs.ErrInvalidArgument, "cannot remove the root directory")
	}
	root, err := f.openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	dfd, base, err := parent(root, rel, inRoot)
	if err != nil {
		return wrap(op, p, err)
	}
	defer unix.Close(dfd)
	err = unix.Unlinkat(dfd, base, 0)
	if err != unix.EISDIR {
		return wrap(op, p, err)
	}
	if !recursive {
		err = unix.Unlinkat(dfd, base, unix.AT_REMOVEDIR)
		if err == unix.ENOTEMPTY || err == unix.EEXIST {
			return failf(op, p, errdefs.ErrFailedPrecondition, "directory not empty")
		}
		return wrap(op, p, err)
	}
	return wrap(op, p, removeTree(ctx, dfd, base, 0))
}

// removeTree removes the directory name in dfd and everything under it.
func removeTree(ctx context.Context, dfd int, name string, depth int) error {
	if depth > maxDepth {
		return errdefs.ResourceExhaustedf("deeper than %d levels", maxDepth)
	}
	race("remove", dfd, name)
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ELOOP || err == unix.ENOTDIR {
		// Swapped for a symlink or a file since we looked: unlink that.
		return unix.Unlinkat(dfd, name, 0)
	}
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	for pass := 0; ; pass++ {
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			names, err := d.Readdirnames(1024)
			for _, n := range names {
				err := unix.Unlinkat(fd, n, 0)
				if err == unix.EISDIR {
					err = removeTree(ctx, fd, n, depth+1)
				}
				if err != nil && err != unix.ENOENT {
					return err
				}
			}
			if errors.Is(err, io.EOF) || (err == nil && len(names) == 0) {
				break
			}
			if err != nil {
				return err
			}
		}
		err := unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR)
		if err == nil || err == unix.ENOENT {
			return nil
		}
		// Entries appeared while we walked (the sandbox is writing):
		// start over a few times, then give up.
		if (err != unix.ENOTEMPTY && err != unix.EEXIST) || pass >= 8 {
			return err
		}
		if _, err := d.Seek(0, io.SeekStart); err != nil {
			return err
		}
	}
}

// ctxReader stops a copy when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func fileInfo(name string, st *unix.Stat_t) sandbox.FileInfo {
	return sandbox.FileInfo{
		Name:    name,
		Size:    st.Size,
		Mode:    statmode.FileMode(st.Mode),
		ModTime: time.Unix(st.Mtim.Unix()),
	}
}

// unixPerm converts an os.FileMode's permission and sticky bits to st_mode
// bits (set-ID bits are not carried; see perm).
func unixPerm(m os.FileMode) uint32 {
	p := uint32(m.Perm())
	if m&os.ModeSticky != 0 {
		p |= unix.S_ISVTX
	}
	return p
}

// kindName names a non-regular, non-directory, non-symlink file type.
func kindName(m uint32) string {
	switch m & unix.S_IFMT {
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	}
	return "special file"
}
