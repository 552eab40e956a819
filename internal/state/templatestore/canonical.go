package templatestore

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

// Tree describes a canonical stream: its digest and what it holds.
type Tree struct {
	// Digest is "sha256:<hex>" of the canonical tar stream.
	Digest  string `json:"digest"`
	Entries int64  `json:"entries"`
	Bytes   int64  `json:"bytes"`
}

// epoch is the time written for entries whose time is not content
// (directories and symlinks: a directory's mtime changes whenever an entry
// is added, which says nothing about what the template holds).
var epoch = time.Unix(0, 0)

// WriteCanonical writes the tree under root to w as the canonical tar
// stream and returns its digest. The stream is a pure function of the
// tree's content:
//
//   - entries in lexical path order (filepath.WalkDir's order), paths
//     relative and "/"-separated, directories with a trailing "/";
//   - for every entry its type, permission bits (with setuid, setgid,
//     sticky), numeric owner and group (no user or group names), and its
//     extended attributes (sorted, as PAX SCHILY.xattr records);
//   - regular files with their content and mtime in whole seconds;
//     directories and symlinks with a zero mtime; symlinks with their target
//     as stored; a file with several links once as a file, then as hard
//     links to the first path; character and block devices with their
//     numbers, FIFOs; sockets are refused;
//   - PAX format; access and change times are never written.
//
// The same tree therefore always gives the same bytes, and any change of a
// file, mode, owner, link target or xattr gives another digest.
func WriteCanonical(root string, w io.Writer) (Tree, error) {
	var t Tree
	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(w, h))
	links := map[[2]uint64]string{} // (dev, ino) → first path
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		hdr := &tar.Header{
			Name: name, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
			ModTime: epoch, Format: tar.FormatPAX,
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		case unix.S_IFLNK:
			hdr.Typeflag = tar.TypeSymlink
			if hdr.Linkname, err = os.Readlink(p); err != nil {
				return err
			}
		case unix.S_IFREG:
			key := [2]uint64{uint64(st.Dev), st.Ino}
			if first, ok := links[key]; ok && st.Nlink > 1 {
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
				break
			}
			if st.Nlink > 1 {
				links[key] = name
			}
			hdr.Typeflag, hdr.Size, hdr.ModTime = tar.TypeReg, st.Size, time.Unix(st.Mtim.Sec, 0)
		case unix.S_IFCHR, unix.S_IFBLK:
			hdr.Typeflag = tar.TypeChar
			if st.Mode&unix.S_IFMT == unix.S_IFBLK {
				hdr.Typeflag = tar.TypeBlock
			}
			hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		case unix.S_IFIFO:
			hdr.Typeflag = tar.TypeFifo
		default:
			return errdefs.InvalidArgumentf("%s: sockets and other special files cannot be part of a template", p)
		}
		xa, err := xattrs(p)
		if err != nil {
			return fmt.Errorf("%s: xattrs: %w", p, err)
		}
		if len(xa) > 0 {
			hdr.PAXRecords = map[string]string{}
			for k, v := range xa {
				hdr.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		t.Entries++
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			n, err := io.Copy(tw, f)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			if n != hdr.Size {
				return errdefs.Conflictf("%s changed while it was read", p)
			}
			t.Bytes += n
		}
		return nil
	})
	if err != nil {
		return t, err
	}
	if err := tw.Close(); err != nil {
		return t, err
	}
	t.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	return t, nil
}

// xattrs returns p's extended attributes (without following a symlink).
func xattrs(p string) (map[string]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Llistxattr(p, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		buf = buf[:n]
		break
	}
	var names []string
	for _, s := range strings.Split(string(buf), "\x00") {
		if s != "" {
			names = append(names, s)
		}
	}
	sort.Strings(names)
	out := map[string]string{}
	for _, k := range names {
		val := make([]byte, 256)
		for {
			n, err := unix.Lgetxattr(p, k, val)
			if errors.Is(err, unix.ERANGE) {
				val = make([]byte, len(val)*4)
				continue
			}
			if errors.Is(err, unix.ENODATA) {
				val = nil
				break
			}
			if err != nil {
				return nil, err
			}
			val = val[:n]
			break
		}
		if val != nil {
			out[k] = string(val)
		}
	}
	return out, nil
}

// Extract unpacks a canonical stream (WriteCanonical's output) into dst,
// which must be an empty directory, restoring types, modes, owners, file
// mtimes, hard links, device numbers and xattrs. Every entry's parent must
// be a directory the stream created before it, and no path may climb out
// ("..", absolute); anything else is errdefs.ErrDataLoss. The caller
// verifies the result by digesting it again (Store does).
func Extract(r io.Reader, dst string) error {
	tr := tar.NewReader(r)
	dirs := map[string]bool{".": true}
	type dirMode struct {
		p    string
		mode uint32
	}
	var fixDirs []dirMode
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return errdefs.DataLossf("template stream: %v", err)
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		if name == "" || path.Clean(name) != name || strings.HasPrefix(name, "/") || name == ".." || strings.HasPrefix(name, "../") {
			return errdefs.DataLossf("template stream: bad path %q", hdr.Name)
		}
		if !dirs[path.Dir(name)] {
			return errdefs.DataLossf("template stream: %q comes before its directory", hdr.Name)
		}
		p := filepath.Join(dst, filepath.FromSlash(name))
		mode := uint32(hdr.Mode & 0o7777)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			dirs[name] = true
			fixDirs = append(fixDirs, dirMode{p, mode})
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return errdefs.DataLossf("template stream: %s: %v", name, err)
			}
			if err := f.Close(); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, p); err != nil {
				return err
			}
		case tar.TypeLink:
			target := path.Clean(hdr.Linkname)
			if strings.HasPrefix(target, "/") || target == ".." || strings.HasPrefix(target, "../") {
				return errdefs.DataLossf("template stream: bad hard link %q → %q", name, hdr.Linkname)
			}
			if err := os.Link(filepath.Join(dst, filepath.FromSlash(target)), p); err != nil {
				return err
			}
			continue // owner, mode and xattrs are the first path's
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			m := uint32(unix.S_IFIFO)
			switch hdr.Typeflag {
			case tar.TypeChar:
				m = unix.S_IFCHR
			case tar.TypeBlock:
				m = unix.S_IFBLK
			}
			if err := unix.Mknod(p, m|0o600, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))); err != nil {
				return fmt.Errorf("mknod %s: %w", p, err)
			}
		default:
			return errdefs.DataLossf("template stream: %s: unsupported type %q", name, hdr.Typeflag)
		}
		if err := os.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
		for k, v := range hdr.PAXRecords {
			if x, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
				if err := unix.Lsetxattr(p, x, []byte(v), 0); err != nil {
					return fmt.Errorf("set xattr %s on %s: %w", x, p, err)
				}
			}
		}
		if hdr.Typeflag == tar.TypeSymlink {
			continue
		}
		if hdr.Typeflag != tar.TypeDir {
			// After chown, which clears setuid and setgid.
			if err := unix.Fchmodat(unix.AT_FDCWD, p, mode, 0); err != nil {
				return err
			}
		}
		if hdr.Typeflag == tar.TypeReg {
			if err := os.Chtimes(p, hdr.ModTime, hdr.ModTime); err != nil {
				return err
			}
		}
	}
	// Directories last: a read-only directory is filled before it is made
	// read-only; its mtime is not content.
	for i := len(fixDirs) - 1; i >= 0; i-- {
		if err := unix.Fchmodat(unix.AT_FDCWD, fixDirs[i].p, fixDirs[i].mode, 0); err != nil {
			return err
		}
	}
	return nil
}

// TreeDigest digests root's canonical stream without keeping it.
func TreeDigest(root string) (Tree, error) { return WriteCanonical(root, io.Discard) }
