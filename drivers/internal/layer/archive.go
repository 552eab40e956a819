package layer

// The layer archive: layer.tar, the upper directory of a layer as a
// checkpoint carries it, written at the cut and read at restore by both
// drivers.
//
// # Format
//
// An uncompressed PAX tar. The upper directory itself is the first entry,
// "./"; then every entry under it, depth first, the names of a directory
// sorted, directories named with a trailing "/". Each entry has its mode
// (permission bits, set-ID and sticky bits included), owner (see IDMap),
// modification and access times, and every extended attribute as a
// SCHILY.xattr.NAME record (the overlay's trusted.overlay.opaque among
// them). Regular files carry their bytes; a regular file with more than one
// link is stored once, its other names as hard links to the first; symlinks
// are stored as symlinks (never followed); overlay whiteouts are 0/0
// character devices and, like other device nodes and FIFOs, are stored with
// their major and minor numbers. Sockets are left out: nothing can restore a
// bound socket from a file (CRIU binds a restored unix socket again, making
// the file). Checkpoints written by the drivers' earlier copies of this code
// (gvisor's tarLayer, criu's writeLayerTar) have the same layout and are
// read by ExtractArchive (TestArchiveReadsOldArchives).
//
// # Threat model
//
// The upper directory is the tenant's: the sandbox and the files API
// (drivers/internal/confinedfs) can put a symlink wherever a directory was, and the
// daemon archives and extracts as host root. So no tenant-controlled name
// is ever resolved as a host path. The walk opens each directory with
// openat(O_DIRECTORY|O_NOFOLLOW) relative to its parent's descriptor, reads
// each entry with fstatat(AT_SYMLINK_NOFOLLOW) and opens a regular file
// with O_PATH|O_NOFOLLOW before reading it through that very inode: a
// directory swapped for a symlink after its parent was listed is archived
// as the symlink it now is (TestArchiveWalkIgnoresSwappedSymlink), never
// walked into. Extraction creates every entry with a single-name *at call
// (mkdirat, openat(O_CREAT|O_EXCL|O_NOFOLLOW), symlinkat, mknodat, linkat)
// in a directory reached from the root descriptor one name at a time with
// O_NOFOLLOW, and sets owners, modes, xattrs and times on the entry's own
// descriptor (or, for a symlink, with AT_SYMLINK_NOFOLLOW in its pinned
// parent): an archive entry below a symlink, a name with "..", an absolute
// name, and a hard link whose target is not inside the layer are refused
// as ErrDataLoss (TestExtractArchiveHostile, FuzzLayerArchive). The
// engine also keeps the files API out while a cut archives or a restore
// extracts (internal/engine, Engine.Files); the descriptor walk is what holds
// when something else still writes.

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/lib/failpoint"
)

// Failpoints of the archive (ArchiveOptions.Failpoints); the subject is the
// entry's name in the archive ("." for the upper directory itself).
const (
	// FPArchiveListed: a directory's names are read, none of its
	// entries archived yet.
	FPArchiveListed = "layer.archive.listed"
	// FPExtractMkdir: a directory entry is created (or found), its owner,
	// mode and xattrs not yet set.
	FPExtractMkdir = "layer.archive.extract-mkdir"
)

// maxArchiveDepth bounds the depth of directories in an archive, both
// ways: each level holds a descriptor. (The drivers' earlier path-based
// walk failed at PATH_MAX, about 2,000 levels.)
const maxArchiveDepth = 2048

// xattrRecord is how tar (PAX, GNU tar and bsdtar alike) records an
// extended attribute.
const xattrRecord = "SCHILY.xattr."

// Nobody is the archive's owner of a file whose host owner is outside an
// IDMap's range, and the owner of an archive id outside it.
const Nobody = 65534

// IDMap translates owners between the host and an archive. The zero IDMap
// stores host ids as they are (gvisor: a sandbox's ids are host ids). With
// Size > 0 (criu: a user-namespaced sandbox whose id u is host id Host+u)
// the archive holds sandbox ids: host id h in [Host, Host+Size) is stored
// as h-Host, any other as Nobody; archive id a in [0, Size) is extracted
// as Host+a, any other as Host+Nobody.
type IDMap struct{ Host, Size int }

func (m IDMap) toArchive(h uint32) int {
	if m.Size <= 0 {
		return int(h)
	}
	if int(h) >= m.Host && int(h) < m.Host+m.Size {
		return int(h) - m.Host
	}
	return Nobody
}

func (m IDMap) toHost(a int) (int, error) {
	if a < 0 || a > 1<<32-2 {
		return 0, errdefs.DataLossf("layer archive: owner %d", a)
	}
	if m.Size <= 0 {
		return a, nil
	}
	if a >= m.Size {
		a = Nobody
	}
	return m.Host + a, nil
}

// ArchiveOptions are WriteArchive's and ExtractArchive's.
type ArchiveOptions struct {
	IDs IDMap
	// Failpoints, when set (tests), are evaluated at FPArchiveListed and
	// FPExtractMkdir; an error one returns ends the walk with it.
	Failpoints *failpoint.Set
	// BlobCache, for WriteArchiveFile, is the sandbox's blob cache
	// directory (blobs.go): set, regular files of BlobMinSize bytes or
	// more are blobs of the image, copied only when they changed since
	// the previous cut that used the same cache. Empty: every file's
	// bytes are in the archive, as before. For ExtractArchive, the
	// (removed) cache of the restored layer, which the blobs it copied
	// seed (blobseed.go); empty: the next cut copies every large file.
	BlobCache string
	// BlobDir, for ExtractArchive, is the directory of the blobs the
	// archive references (ExtractArchiveFile: BlobDirName beside the
	// archive). Empty: a reference is ErrDataLoss.
	BlobDir string
}

// WriteArchiveFile writes the archive of the upper directory upper into a
// new file at path (an existing one is replaced) and returns its number of
// entries and its size (the archive's, blobs not counted). The archive is
// not fsynced: the caller syncs the image directory it belongs to. With
// o.BlobCache set it is CutArchiveFile and Commit at once.
func WriteArchiveFile(path, upper string, o ArchiveOptions) (entries int, size int64, err error) {
	c, err := CutArchiveFile(path, upper, o)
	if err != nil {
		return 0, 0, err
	}
	if err := c.Commit(); err != nil {
		return 0, 0, err
	}
	return c.Entries, c.Size, nil
}

// ArchiveCut is an archive file written by CutArchiveFile whose blob cache
// is not updated yet.
type ArchiveCut struct {
	Entries int
	Size    int64 // of the archive file, blobs not counted
	// BlobBytes is the size of the blobs (Size+BlobBytes: the layer's,
	// as an archive of every byte would have had it, about); Reused and
	// Copied count the blobs linked from the cache and the ones copied
	// into it (blobs.go).
	BlobBytes      int64
	Reused, Copied int
	blobs          *blobWriter
}

// CutArchiveFile is the part of WriteArchiveFile that must see the frozen
// layer: the archive, and, with o.BlobCache set, the large files as blobs
// in BlobDirName beside path (blobs.go), those changed since the cache's
// last cut copied into new cache files, not yet fsynced. The caller thaws
// the sandbox, then calls Commit (fsync of the new cache files, the
// cache's index replaced, unreferenced cache files removed) before the
// image counts as written, or Abort if the cut fails; until Commit the
// cache's previous state stands. On error nothing needs undoing.
func CutArchiveFile(path, upper string, o ArchiveOptions) (_ *ArchiveCut, err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c := &ArchiveCut{}
	if o.BlobCache != "" {
		if c.blobs, err = newBlobWriter(o.BlobCache, filepath.Dir(path)); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				c.blobs.abort()
			}
		}()
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	if c.Entries, err = writeArchive(bw, upper, o, c.blobs); err != nil {
		return nil, err
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	c.Size = fi.Size()
	if c.blobs != nil {
		c.Reused, c.Copied, c.BlobBytes = c.blobs.reused, c.blobs.copied, c.blobs.bytes
	}
	return c, nil
}

// Commit makes the cut's blobs the cache's (see CutArchiveFile). A second
// call does nothing.
func (c *ArchiveCut) Commit() error {
	b := c.blobs
	c.blobs = nil
	if b == nil {
		return nil
	}
	if err := b.commit(); err != nil {
		b.abort()
		return err
	}
	return nil
}

// Abort removes the cache files the cut made; the cache stays as it was
// before the cut. After Commit it does nothing.
func (c *ArchiveCut) Abort() {
	if c != nil && c.blobs != nil {
		c.blobs.abort()
		c.blobs = nil
	}
}

// WriteArchive writes the archive of the upper directory upper (a path the
// daemon chose; nothing under it is resolved by name) to w and returns its
// number of entries. Nothing may write to upper meanwhile (the sandbox is
// frozen, the files API held off): an entry found changed between two
// looks at it is ErrConflict. o.BlobCache must be empty (blobs are files
// beside an archive file: WriteArchiveFile).
func WriteArchive(w io.Writer, upper string, o ArchiveOptions) (int, error) {
	if o.BlobCache != "" {
		return 0, errdefs.InvalidArgumentf("layer archive: blobs need an archive file (WriteArchiveFile)")
	}
	return writeArchive(w, upper, o, nil)
}

func writeArchive(w io.Writer, upper string, o ArchiveOptions, blobs *blobWriter) (int, error) {
	fd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("layer archive: open %s: %w", upper, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return 0, err
	}
	a := &archiver{tw: tar.NewWriter(w), o: o, links: map[[2]uint64]string{}, blobs: blobs}
	if err := a.dir(fd, ".", &st, 0); err != nil {
		return 0, err
	}
	if err := a.tw.Close(); err != nil {
		return 0, err
	}
	return a.entries, nil
}

type archiver struct {
	tw      *tar.Writer
	o       ArchiveOptions
	links   map[[2]uint64]string // (dev, ino) → first name, of files with more than one link
	blobs   *blobWriter          // nil: no blobs
	entries int
}

func (a *archiver) header(typ byte, name string, st *unix.Stat_t) *tar.Header {
	return &tar.Header{
		Typeflag:   typ,
		Name:       name,
		Mode:       int64(st.Mode & 0o7777),
		Uid:        a.o.IDs.toArchive(st.Uid),
		Gid:        a.o.IDs.toArchive(st.Gid),
		ModTime:    time.Unix(st.Mtim.Unix()),
		AccessTime: time.Unix(st.Atim.Unix()),
		Format:     tar.FormatPAX,
	}
}

func (a *archiver) write(hdr *tar.Header, xs map[string]string) error {
	if len(xs) > 0 {
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = make(map[string]string, len(xs))
		}
		for k, v := range xs {
			hdr.PAXRecords[xattrRecord+k] = v
		}
	}
	if err := a.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("layer archive: %s: %w", hdr.Name, err)
	}
	a.entries++
	return nil
}

// dir archives the directory open as fd (which it closes), named name,
// and everything under it.
func (a *archiver) dir(fd int, name string, st *unix.Stat_t, depth int) error {
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	xs, err := fdXattrs(fd)
	if err != nil {
		return fmt.Errorf("layer archive: %s: %w", name, err)
	}
	if err := a.write(a.header(tar.TypeDir, name+"/", st), xs); err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("layer archive: %s: %w", name, err)
	}
	slices.Sort(names)
	if err := a.o.Failpoints.EvalFor(FPArchiveListed, name); err != nil {
		return err
	}
	for _, n := range names {
		child := n
		if name != "." {
			child = name + "/" + n
		}
		if err := a.entry(fd, n, child, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// changed is the error of an entry that is not what it was a moment ago.
func changed(name string, err error) error {
	return errdefs.Conflictf("layer archive: %s changed while it was archived (%v)", name, err)
}

func sameInode(a, b *unix.Stat_t) bool {
	return a.Dev == b.Dev && a.Ino == b.Ino && a.Mode&unix.S_IFMT == b.Mode&unix.S_IFMT
}

// entry archives the entry n of the directory dfd, named name.
func (a *archiver) entry(dfd int, n, name string, depth int) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return changed(name, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
		return nil
	case unix.S_IFDIR:
		if depth > maxArchiveDepth {
			return errdefs.ResourceExhaustedf("layer archive: %s: deeper than %d directories", name, maxArchiveDepth)
		}
		fd, err := unix.Openat(dfd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return changed(name, err)
		}
		var now unix.Stat_t
		if err := unix.Fstat(fd, &now); err != nil || !sameInode(&st, &now) {
			unix.Close(fd)
			return changed(name, err)
		}
		return a.dir(fd, name, &now, depth)
	case unix.S_IFREG:
		return a.file(dfd, n, name, &st)
	case unix.S_IFLNK:
		target, err := readlinkat(dfd, n)
		if err != nil {
			return changed(name, err)
		}
		xs, err := atXattrs(dfd, n)
		if err != nil {
			return fmt.Errorf("layer archive: %s: %w", name, err)
		}
		hdr := a.header(tar.TypeSymlink, name, &st)
		hdr.Linkname = target
		return a.write(hdr, xs)
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
		typ := byte(tar.TypeFifo)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			typ = tar.TypeChar
		case unix.S_IFBLK:
			typ = tar.TypeBlock
		}
		xs, err := atXattrs(dfd, n)
		if err != nil {
			return fmt.Errorf("layer archive: %s: %w", name, err)
		}
		hdr := a.header(typ, name, &st)
		if typ != tar.TypeFifo {
			hdr.Devmajor = int64(unix.Major(st.Rdev))
			hdr.Devminor = int64(unix.Minor(st.Rdev))
		}
		return a.write(hdr, xs)
	default:
		return errdefs.FailedPreconditionf("layer archive: %s: file type %#o", name, st.Mode&unix.S_IFMT)
	}
}

// file archives the regular file n of dfd: opened O_PATH|O_NOFOLLOW (which
// opens nothing), checked to be the inode fstatat saw, and only then opened
// for reading through that descriptor, so a swap cannot make us read a
// FIFO (blocking) or a device.
func (a *archiver) file(dfd int, n, name string, st *unix.Stat_t) error {
	opath, err := unix.Openat(dfd, n, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return changed(name, err)
	}
	var now unix.Stat_t
	if err := unix.Fstat(opath, &now); err != nil || !sameInode(st, &now) {
		unix.Close(opath)
		return changed(name, err)
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(opath), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	unix.Close(opath)
	if err != nil {
		return fmt.Errorf("layer archive: %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	xs, err := fdXattrs(fd)
	if err != nil {
		return fmt.Errorf("layer archive: %s: %w", name, err)
	}
	hdr := a.header(tar.TypeReg, name, &now)
	hdr.Size = now.Size
	if now.Nlink > 1 {
		k := [2]uint64{now.Dev, now.Ino}
		if first, ok := a.links[k]; ok {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
		} else {
			a.links[k] = name
		}
	}
	if a.blobs != nil && hdr.Typeflag == tar.TypeReg && hdr.Size >= BlobMinSize {
		if hdr.PAXRecords, err = a.blobs.ref(name, f, &now); err != nil {
			return err
		}
		hdr.Size = 0
	}
	if err := a.write(hdr, xs); err != nil {
		return err
	}
	if hdr.Size > 0 {
		if _, err := io.CopyN(a.tw, f, hdr.Size); err != nil {
			if errors.Is(err, io.EOF) {
				return changed(name, err)
			}
			return fmt.Errorf("layer archive: %s: %w", name, err)
		}
	}
	return nil
}

func readlinkat(dfd int, n string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		m, err := unix.Readlinkat(dfd, n, buf)
		if err != nil {
			return "", err
		}
		if m < size {
			return string(buf[:m]), nil
		}
	}
}

// atPath names the entry n of the directory open as dfd through
// /proc/self/fd: the kernel goes to that very directory (no path is
// resolved on the way), then looks up the single name n. Used only with
// calls that do not follow a final symlink (llistxattr, lgetxattr,
// lsetxattr), for entries that cannot be opened for reading (symlinks,
// device nodes, FIFOs).
func atPath(dfd int, n string) string { return "/proc/self/fd/" + strconv.Itoa(dfd) + "/" + n }

func fdXattrs(fd int) (map[string]string, error) {
	return readXattrs(
		func(buf []byte) (int, error) { return unix.Flistxattr(fd, buf) },
		func(name string, buf []byte) (int, error) { return unix.Fgetxattr(fd, name, buf) })
}

func atXattrs(dfd int, n string) (map[string]string, error) {
	p := atPath(dfd, n)
	return readXattrs(
		func(buf []byte) (int, error) { return unix.Llistxattr(p, buf) },
		func(name string, buf []byte) (int, error) { return unix.Lgetxattr(p, name, buf) })
}

// readXattrs reads every extended attribute with list and get. A
// filesystem without xattrs gives none; an attribute removed while listing
// is skipped.
func readXattrs(list func([]byte) (int, error), get func(string, []byte) (int, error)) (map[string]string, error) {
	buf := make([]byte, 1024)
	n, err := list(buf)
	if errors.Is(err, unix.ERANGE) {
		var sz int
		if sz, err = list(nil); err == nil {
			buf = make([]byte, sz)
			n, err = list(buf)
		}
	}
	if errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listxattr: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		sz, err := get(name, nil)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("getxattr %s: %w", name, err)
		}
		v := make([]byte, sz)
		if sz > 0 {
			if sz, err = get(name, v); err != nil {
				return nil, fmt.Errorf("getxattr %s: %w", name, err)
			}
		}
		out[name] = string(v[:sz])
	}
	return out, nil
}
