package confinedfs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

// TarOut writes a tar (PAX) of p to w: a file, or a directory with
// everything under it, named after p's last component ("." for the root).
// A symlink at p or inside it is stored as a symlink, never followed;
// symlinks in p's parents are followed inside the root. Regular files,
// directories and symlinks are stored; device nodes, FIFOs and sockets are
// skipped, and the archive ends with a PAX global header whose "comment"
// record lists what was skipped (tar tools ignore it). Owners are reported
// as sandbox ids. A file that changes size while it is read is stored
// with the size it had when opened (cut or zero-padded).
func (f *FS) TarOut(ctx context.Context, p string, w io.Writer) error {
	const op = "tar out"
	rel, err := parse(op, p)
	if err != nil {
		return err
	}
	root, err := f.openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	t := &tarOut{f: f, ctx: ctx, tw: tar.NewWriter(w)}
	if rel == "" {
		// The root: walk "." of the root descriptor.
		err = t.walk(root, ".", ".", "/", 0)
	} else {
		dfd, base, perr := parent(root, rel, inRoot)
		if perr != nil {
			return wrap(op, p, perr)
		}
		defer unix.Close(dfd)
		err = t.walk(dfd, base, base, p, 0)
	}
	if err != nil {
		return err
	}
	if len(t.skipped) > 0 {
		note := "amber: skipped (not a regular file, directory or symlink): " + strings.Join(t.skipped, ", ")
		if t.moreSkipped > 0 {
			note += fmt.Sprintf(" and %d more", t.moreSkipped)
		}
		if err := t.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "amber-skipped", PAXRecords: map[string]string{"comment": note}}); err != nil {
			return wrap(op, p, err)
		}
	}
	return wrap(op, p, t.tw.Close())
}

type tarOut struct {
	f           *FS
	ctx         context.Context
	tw          *tar.Writer
	skipped     []string
	moreSkipped int
}

// walk archives the entry name in dfd under the archive name tname; spath
// is its sandbox path (for errors and notes).
func (t *tarOut) walk(dfd int, name, tname, spath string, depth int) error {
	const op = "tar out"
	if err := t.ctx.Err(); err != nil {
		return wrap(op, spath, err)
	}
	if depth > maxDepth {
		return failf(op, spath, errdefs.ErrResourceExhausted, "deeper than %d levels", maxDepth)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if depth > 0 && err == unix.ENOENT {
			return nil // removed while we walk
		}
		return wrap(op, spath, err)
	}
	race("tarout", dfd, name)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		opath, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return t.vanished(spath, depth, err)
		}
		fd, st, err := openRegular(opath)
		unix.Close(opath)
		if errors.Is(err, errNotRegular) || err == unix.EISDIR {
			return nil // swapped for something else since fstatat: skip
		}
		if err != nil {
			return t.vanished(spath, depth, err)
		}
		file := os.NewFile(uintptr(fd), spath)
		defer file.Close()
		if err := t.tw.WriteHeader(t.header(tname, &st, tar.TypeReg, "")); err != nil {
			return wrap(op, spath, err)
		}
		n, err := io.CopyN(t.tw, ctxReader{t.ctx, file}, st.Size)
		if err != nil && !errors.Is(err, io.EOF) {
			return wrap(op, spath, err)
		}
		if n < st.Size { // shrank while we read: pad
			if _, err := io.CopyN(t.tw, zeros{}, st.Size-n); err != nil {
				return wrap(op, spath, err)
			}
		}
	case unix.S_IFLNK:
		link, err := readlinkat(dfd, name)
		if err != nil {
			return t.vanished(spath, depth, err)
		}
		if err := t.tw.WriteHeader(t.header(tname, &st, tar.TypeSymlink, link)); err != nil {
			return wrap(op, spath, err)
		}
	case unix.S_IFDIR:
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return t.vanished(spath, depth, err)
		}
		d := os.NewFile(uintptr(fd), spath)
		defer d.Close()
		if err := unix.Fstat(fd, &st); err != nil {
			return wrap(op, spath, err)
		}
		if err := t.tw.WriteHeader(t.header(tname+"/", &st, tar.TypeDir, "")); err != nil {
			return wrap(op, spath, err)
		}
		names, err := readNames(t.ctx, d)
		if err != nil {
			return wrap(op, spath, err)
		}
		for _, n := range names {
			if err := t.walk(fd, n, path.Join(tname, n), path.Join(spath, n), depth+1); err != nil {
				return err
			}
		}
	default:
		if len(t.skipped) < 100 {
			t.skipped = append(t.skipped, fmt.Sprintf("%s (%s)", spath, kindName(st.Mode)))
		} else {
			t.moreSkipped++
		}
	}
	return nil
}

// vanished treats ENOENT below the top as "removed while we walk".
func (t *tarOut) vanished(spath string, depth int, err error) error {
	if depth > 0 && (err == unix.ENOENT || err == unix.ELOOP || err == unix.ENOTDIR) {
		return nil
	}
	return wrap("tar out", spath, err)
}

func (t *tarOut) header(name string, st *unix.Stat_t, typ byte, link string) *tar.Header {
	uid, gid := t.f.sandboxIDs(st.Uid, st.Gid)
	h := &tar.Header{
		Typeflag: typ,
		Name:     name,
		Linkname: link,
		Mode:     int64(st.Mode & 0o7777),
		Uid:      uid,
		Gid:      gid,
		ModTime:  time.Unix(st.Mtim.Unix()),
		Format:   tar.FormatPAX,
	}
	if typ == tar.TypeReg {
		h.Size = st.Size
	}
	return h
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TarIn extracts the tar read from r under the directory dir (created,
// with missing parents, if needed; symlinks in dir itself are followed
// inside the root).
//
// Each entry's name is cleaned lexically and must stay under dir: absolute
// names and ".." that climbs out are ErrInvalidArgument. Its parent
// directory is then resolved by the kernel beneath dir (RESOLVE_BENEATH):
// a symlink on the way — one already there or one an earlier entry
// created — may point anywhere under dir, but one that leads out of it
// (absolute, or climbing with "..") is ErrPermissionDenied. The entry
// itself is created under a temporary name and renamed into place, so an
// existing symlink there is replaced, never written through.
//
// Regular files, directories, symlinks (any target; a symlink is only
// data until something resolves it, and our resolution is confined) and
// hard links to earlier entries under dir are extracted; device nodes and
// FIFOs are refused. Modes are kept without set-ID bits; owners are the
// FS's owner (the archive's owners are ignored); modification times of
// files and symlinks are kept. The sum of entry sizes and the number of
// entries are bounded (WithTarLimits): ErrResourceExhausted. Files are not
// fsynced one by one; the filesystem is synced (syncfs) once at the end.
//
// Extraction is not atomic: when an entry fails, the entries before it stay.
func (f *FS) TarIn(ctx context.Context, dir string, r io.Reader) error {
	const op = "tar in"
	rel, err := parse(op, dir)
	if err != nil {
		return err
	}
	root, err := f.openRoot()
	if err != nil {
		return err
	}
	defer unix.Close(root)
	uid, gid := f.hostOwner()
	base, err := mkdirAll(root, rel, 0o755, uid, gid, inRoot)
	if err != nil {
		return wrap(op, dir, err)
	}
	defer unix.Close(base)

	tr := tar.NewReader(r)
	var total int64
	entries := 0
	for {
		if err := ctx.Err(); err != nil {
			return wrap(op, dir, err)
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return failf(op, dir, errdefs.ErrInvalidArgument, "bad archive: %v", err)
		}
		entries++
		if entries > f.maxTarEntries {
			return failf(op, dir, errdefs.ErrResourceExhausted, "archive has more than %d entries", f.maxTarEntries)
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		// Name the entry in errors as the tenant wrote it, but bounded.
		ename := h.Name
		if len(ename) > 256 {
			ename = ename[:256] + "..."
		}
		erel, err := entryPath(h.Name)
		if err != nil {
			return failf(op, ename, errdefs.ErrInvalidArgument, "archive entry: %v", err)
		}
		if h.Size < 0 || h.Size > f.maxTarBytes-total {
			return failf(op, ename, errdefs.ErrResourceExhausted, "archive expands to more than %d bytes", f.maxTarBytes)
		}
		total += h.Size
		if err := f.extract(ctx, base, erel, h, tr, uid, gid); err != nil {
			return wrap(op, ename, err)
		}
	}
	fd, err := unix.Openat(base, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return wrap(op, dir, err)
	}
	defer unix.Close(fd)
	return wrap(op, dir, unix.Syncfs(fd))
}

// entryPath cleans an archive name relative to the extraction directory,
// refusing absolute names and names that climb out.
func entryPath(name string) (string, error) {
	switch {
	case name == "":
		return "", errors.New("empty name")
	case strings.HasPrefix(name, "/"):
		return "", errors.New("absolute name")
	case len(name) > maxPath:
		return "", errors.New("name too long")
	case strings.IndexByte(name, 0) >= 0:
		return "", errors.New("NUL in name")
	}
	rel, err := cleanRel(name)
	if err != nil {
		return "", fmt.Errorf("%v (.. climbs out of the target directory)", err)
	}
	return rel, nil
}

// extract creates one archive entry at erel under base.
func (f *FS) extract(ctx context.Context, base int, erel string, h *tar.Header, r io.Reader, uid, gid int) error {
	mode := uint32(h.Mode)
	switch h.Typeflag {
	case tar.TypeDir:
		if erel == "" {
			return nil // the target directory itself
		}
		fd, err := mkdirAll(base, erel, perm(mode, 0o755), uid, gid, beneath)
		if err == nil {
			unix.Close(fd)
		}
		return err
	case tar.TypeChar, tar.TypeBlock:
		return errdefs.PermissionDeniedf("device nodes are refused")
	case tar.TypeReg, tar.TypeGNUSparse, tar.TypeSymlink, tar.TypeLink:
	default:
		return errdefs.InvalidArgumentf("unsupported entry type %q", h.Typeflag)
	}
	if erel == "" {
		return errdefs.InvalidArgumentf("entry names the target directory itself")
	}
	dir, name := split(erel)
	pfd, err := mkdirAll(base, dir, 0o755, uid, gid, beneath)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	switch h.Typeflag {
	case tar.TypeSymlink:
		if h.Linkname == "" || len(h.Linkname) > maxPath || strings.IndexByte(h.Linkname, 0) >= 0 {
			return errdefs.InvalidArgumentf("bad symlink target")
		}
		tmp := tempName()
		if err := unix.Symlinkat(h.Linkname, pfd, tmp); err != nil {
			return err
		}
		err := unix.Fchownat(pfd, tmp, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && !h.ModTime.IsZero() {
			ts := unix.NsecToTimespec(h.ModTime.UnixNano())
			err = unix.UtimesNanoAt(pfd, tmp, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
		}
		if err == nil {
			err = unix.Renameat(pfd, tmp, pfd, name)
		}
		if err != nil {
			_ = unix.Unlinkat(pfd, tmp, 0)
		}
		return err
	case tar.TypeLink:
		target, err := entryPath(h.Linkname)
		if err != nil || target == "" {
			return errdefs.InvalidArgumentf("hard link target %q: must name an entry under the target directory", h.Linkname)
		}
		tdir, tname := split(target)
		tfd, err := openat2(base, tdir, unix.O_PATH|unix.O_DIRECTORY, 0, beneath)
		if err != nil {
			return err
		}
		defer unix.Close(tfd)
		tmp := tempName()
		// No AT_SYMLINK_FOLLOW: a symlink target is linked itself.
		if err := unix.Linkat(tfd, tname, pfd, tmp, 0); err != nil {
			return err
		}
		if err := unix.Renameat(pfd, tmp, pfd, name); err != nil {
			_ = unix.Unlinkat(pfd, tmp, 0)
			return err
		}
		return nil
	default: // regular
		return writeAt(ctx, pfd, name, r, writeOpts{perm: perm(mode, 0o644), uid: uid, gid: gid, mtime: h.ModTime, label: erel})
	}
}
