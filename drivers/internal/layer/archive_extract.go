package layer

// Extracting the layer archive (see archive.go for its format and threat
// model): every entry created by a single-name *at call in a directory
// reached from the root descriptor one name at a time.

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

// ExtractArchiveFile extracts the archive in file path (see
// ExtractArchive), its blobs (if o.BlobDir is empty) read from BlobDirName
// beside it; a missing file is ErrDataLoss.
func ExtractArchiveFile(path, upper string, o ArchiveOptions) (int, error) {
	if o.BlobDir == "" {
		o.BlobDir = filepath.Join(filepath.Dir(path), BlobDirName)
	}
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, errdefs.DataLossf("checkpoint image: %s missing", path)
		}
		return 0, err
	}
	defer f.Close()
	return ExtractArchive(bufio.NewReaderSize(f, 1<<20), upper, o)
}

// ExtractArchive extracts an archive made by WriteArchive into upper (the
// empty upper directory of an unmounted overlay: nothing else may write
// into it meanwhile) and returns its number of entries. The archive is
// data from the blob store: a name that is absolute or climbs with "..",
// an entry whose parent is not a directory (a symlink among them), a hard
// link to a name outside upper, an unknown entry type and an unreadable
// archive are ErrDataLoss, and so is a blob reference (blobs.go) whose
// blob in o.BlobDir is missing, not a regular file, or not of the size and
// digest the archive records. Owners are translated by o.IDs; set-ID bits are
// kept (they act inside the sandbox only). Directory times are set last.
// Extraction is not atomic: on error the entries before stay.
func ExtractArchive(r io.Reader, upper string, o ArchiveOptions) (int, error) {
	root, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("layer archive: open %s: %w", upper, err)
	}
	x := &extractor{o: o, stack: []dirRef{{fd: root}}, blobs: &blobReader{dir: o.BlobDir, fd: -1}}
	defer x.close()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return x.entries, errdefs.DataLossf("layer archive: %v", err)
		}
		if err := x.extract(hdr, tr); err != nil {
			return x.entries, err
		}
		x.entries++
	}
	// Directory times last (creating entries inside changed them),
	// deepest first.
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		if err := x.setDirTimes(d.name, d.ts); err != nil {
			return x.entries, fmt.Errorf("layer archive: times %s: %w", d.name, err)
		}
	}
	if o.BlobCache != "" {
		seedBlobCache(o.BlobCache, root, x.blobs.fd, x.seeds)
	}
	return x.entries, nil
}

type dirRef struct {
	name string // the last name of the directory ("" for the root)
	fd   int    // O_PATH (the root: O_RDONLY)
}

type extractor struct {
	o ArchiveOptions
	// stack holds the root, then the directories of the path last
	// resolved, one per name: stack[i] is the directory named by the
	// first i names. Archives list a directory's entries together, so
	// most entries find their parent open already.
	stack   []dirRef
	dirs    []dirTimes
	blobs   *blobReader
	seeds   []seed // with o.BlobCache: the blobs copied (blobseed.go)
	entries int
}

// noteSeed records the restored file name, open as fd, whose bytes are
// the blob hdr references (checked by copyBlob), to seed the cache with.
func (x *extractor) noteSeed(fd int, name string, hdr *tar.Header) {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return
	}
	x.seeds = append(x.seeds, seed{name: name, key: hdr.PAXRecords[paxBlob], sha256: hdr.PAXRecords[paxBlobSHA256],
		size: st.Size, dev: st.Dev, ino: st.Ino})
}

type dirTimes struct {
	name string
	ts   [2]unix.Timespec
}

func (x *extractor) close() {
	for _, d := range x.stack {
		unix.Close(d.fd)
	}
	x.stack = nil
	x.blobs.close()
}

// cleanName is an archive name relative to the root ("." for the root
// itself); absolute names and names that climb out are refused.
func cleanName(name string) (string, error) {
	n := path.Clean(name)
	if path.IsAbs(n) || n == ".." || strings.HasPrefix(n, "../") || strings.IndexByte(n, 0) >= 0 {
		return "", errdefs.DataLossf("layer archive: bad name %q", name)
	}
	return n, nil
}

func split(n string) (dir, base string) {
	i := strings.LastIndexByte(n, '/')
	if i < 0 {
		return "", n
	}
	return n[:i], n[i+1:]
}

// dirFD returns a descriptor of the directory dir (a clean name relative to
// the root, "" for the root), reached from the root one name at a time
// with O_NOFOLLOW|O_DIRECTORY: a symlink or a non-directory on the way is
// ErrDataLoss. The descriptor belongs to x (valid until the next call).
func (x *extractor) dirFD(dir string) (int, error) {
	var names []string
	if dir != "" {
		names = strings.Split(dir, "/")
	}
	if len(names) > maxArchiveDepth {
		return -1, errdefs.DataLossf("layer archive: %s: deeper than %d directories", dir, maxArchiveDepth)
	}
	k := 0
	for k < len(names) && k+1 < len(x.stack) && x.stack[k+1].name == names[k] {
		k++
	}
	for _, d := range x.stack[k+1:] {
		unix.Close(d.fd)
	}
	x.stack = x.stack[:k+1]
	for _, n := range names[k:] {
		fd, err := unix.Openat(x.stack[len(x.stack)-1].fd, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, notDir(dir, err)
		}
		x.stack = append(x.stack, dirRef{name: n, fd: fd})
	}
	return x.stack[len(x.stack)-1].fd, nil
}

func notDir(name string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR):
		return errdefs.DataLossf("layer archive: %s is not a directory", name)
	case errors.Is(err, unix.ENOENT):
		return errdefs.DataLossf("layer archive: directory %s is not in the archive before its entries", name)
	}
	return fmt.Errorf("layer archive: %s: %w", name, err)
}

func timespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	}
	return unix.NsecToTimespec(t.UnixNano())
}

// times is an entry's access and modification times; an archive without
// access times (the criu driver's, before) gets the modification time.
func times(hdr *tar.Header) [2]unix.Timespec {
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	return [2]unix.Timespec{timespec(at), timespec(hdr.ModTime)}
}

// futimens sets the times of the file open as fd (utimensat with a NULL
// path: the descriptor's inode, no lookup).
func futimens(fd int, ts *[2]unix.Timespec) error {
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(ts)), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func (x *extractor) setDirTimes(name string, ts [2]unix.Timespec) error {
	if name == "." {
		return futimens(x.stack[0].fd, &ts)
	}
	dir, base := split(name)
	pfd, err := x.dirFD(dir)
	if err != nil {
		return err
	}
	return unix.UtimesNanoAt(pfd, base, ts[:], unix.AT_SYMLINK_NOFOLLOW)
}

// setFD sets owner, xattrs and mode (after chown, which clears set-ID
// bits) of an entry open as fd.
func (x *extractor) setFD(fd int, hdr *tar.Header, uid, gid int) error {
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	for k, v := range hdr.PAXRecords {
		if n, ok := strings.CutPrefix(k, xattrRecord); ok {
			if err := unix.Fsetxattr(fd, n, []byte(v), 0); err != nil {
				return fmt.Errorf("setxattr %s: %w", n, err)
			}
		}
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return nil
}

// setAtXattrs sets the xattrs of the entry base of the directory pfd without
// following it (a symlink, a device node, a FIFO).
func setAtXattrs(pfd int, base string, hdr *tar.Header) error {
	var p string
	for k, v := range hdr.PAXRecords {
		if n, ok := strings.CutPrefix(k, xattrRecord); ok {
			if p == "" {
				p = atPath(pfd, base)
			}
			if err := unix.Lsetxattr(p, n, []byte(v), 0); err != nil {
				return fmt.Errorf("setxattr %s: %w", n, err)
			}
		}
	}
	return nil
}

// extract creates one archive entry.
func (x *extractor) extract(hdr *tar.Header, r io.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	uid, err := x.o.IDs.toHost(hdr.Uid)
	if err != nil {
		return err
	}
	gid, err := x.o.IDs.toHost(hdr.Gid)
	if err != nil {
		return err
	}
	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return errdefs.DataLossf("layer archive: %q names the root but is not a directory", hdr.Name)
		}
		if err := x.setFD(x.stack[0].fd, hdr, uid, gid); err != nil {
			return fmt.Errorf("layer archive: %s: %w", name, err)
		}
		x.dirs = append(x.dirs, dirTimes{name, times(hdr)})
		return nil
	}
	dir, base := split(name)
	pfd, err := x.dirFD(dir)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		if errors.Is(err, unix.EEXIST) {
			return errdefs.DataLossf("layer archive: %s: a second entry of that name", name)
		}
		return fmt.Errorf("layer archive: %s: %w", name, err)
	}
	ts := times(hdr)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return fail(fmt.Errorf("mkdir: %w", err))
		}
		if err := x.o.Failpoints.EvalFor(FPExtractMkdir, name); err != nil {
			return err
		}
		fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return notDir(name, err)
		}
		err = x.setFD(fd, hdr, uid, gid)
		unix.Close(fd)
		if err != nil {
			return fail(err)
		}
		x.dirs = append(x.dirs, dirTimes{name, ts})
	case tar.TypeReg:
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fail(err)
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		blob := isBlobRef(hdr)
		if blob {
			if err := x.blobs.copyBlob(f, name, hdr); err != nil {
				return err
			}
		} else if _, err := io.Copy(f, r); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return errdefs.DataLossf("layer archive: %s: %v", name, err)
			}
			return fail(err)
		}
		if err := x.setFD(fd, hdr, uid, gid); err != nil {
			return fail(err)
		}
		if err := futimens(fd, &ts); err != nil {
			return fail(fmt.Errorf("times: %w", err))
		}
		if blob && x.o.BlobCache != "" {
			x.noteSeed(fd, name, hdr)
		}
		return f.Close()
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fail(err)
		}
		if err := unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fail(fmt.Errorf("chown: %w", err))
		}
		if err := setAtXattrs(pfd, base, hdr); err != nil {
			return fail(err)
		}
		if err := unix.UtimesNanoAt(pfd, base, ts[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fail(fmt.Errorf("times: %w", err))
		}
	case tar.TypeLink:
		// Shares the first name's inode and metadata.
		return x.link(hdr, name, base)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		kind := uint32(unix.S_IFCHR)
		switch hdr.Typeflag {
		case tar.TypeBlock:
			kind = unix.S_IFBLK
		case tar.TypeFifo:
			kind = unix.S_IFIFO
		}
		dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
		if err := unix.Mknodat(pfd, base, kind|0o600, int(dev)); err != nil {
			return fail(err)
		}
		// Owner and mode through an O_PATH descriptor of the node (which
		// opens no device): fchownat(AT_EMPTY_PATH), and chmod of
		// /proc/self/fd/N, which goes to that very inode.
		opath, err := unix.Openat(pfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(err)
		}
		defer unix.Close(opath)
		var st unix.Stat_t
		if err := unix.Fstat(opath, &st); err != nil || st.Mode&unix.S_IFMT != kind {
			return fail(fmt.Errorf("node replaced after mknod (%v)", err))
		}
		if err := unix.Fchownat(opath, "", uid, gid, unix.AT_EMPTY_PATH); err != nil {
			return fail(fmt.Errorf("chown: %w", err))
		}
		if err := setAtXattrs(pfd, base, hdr); err != nil {
			return fail(err)
		}
		if err := unix.Fchmodat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(opath), uint32(hdr.Mode&0o7777), 0); err != nil {
			return fail(fmt.Errorf("chmod: %w", err))
		}
		if err := unix.UtimesNanoAt(pfd, base, ts[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fail(fmt.Errorf("times: %w", err))
		}
	default:
		return errdefs.DataLossf("layer archive: %s: unsupported type %q", hdr.Name, hdr.Typeflag)
	}
	return nil
}

// link makes the hard link name (base in the directory last resolved) to
// the archive's earlier entry hdr.Linkname, which must be inside the root
// and reached without a symlink; a symlink there is linked itself (no
// AT_SYMLINK_FOLLOW).
func (x *extractor) link(hdr *tar.Header, name, base string) error {
	target := path.Clean(hdr.Linkname)
	if hdr.Linkname == "" || target == "." || path.IsAbs(target) || target == ".." || strings.HasPrefix(target, "../") || strings.IndexByte(target, 0) >= 0 {
		return errdefs.DataLossf("layer archive: %s: bad link target %q", name, hdr.Linkname)
	}
	// The new name's directory, held while the target's is resolved.
	dir, _ := split(name)
	pfd, err := x.dirFD(dir)
	if err != nil {
		return err
	}
	pfd, err = unix.Dup(pfd)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	tdir, tbase := split(target)
	tfd, err := x.dirFD(tdir)
	if err != nil {
		return err
	}
	if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return errdefs.DataLossf("layer archive: %s: a second entry of that name", name)
		}
		return fmt.Errorf("layer archive: %s: link to %s: %w", name, target, err)
	}
	return nil
}
