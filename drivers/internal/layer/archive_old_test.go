package layer

// Copies of the drivers' layer archive code as it was before the shared
// implementation (bb41709: drivers/gvisor/checkpoint.go tarLayer,
// untarLayer; drivers/criu/checkpoint.go writeLayerTar, extractLayerTar),
// kept to prove that archives they wrote are read by ExtractArchive, and
// that theirs read WriteArchive's (a rollback). Renamed, otherwise
// unchanged.

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

const oldIDsPerSandbox = 65536

const oldXattrPrefix = "SCHILY.xattr."

func oldGvisorTar(dir, out string) (int64, int, error) {
	f, err := os.OpenFile(out, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	entries := 0
	err = filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		fi, err := de.Info()
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSocket != 0 {
			return nil
		}
		target := ""
		if fi.Mode()&os.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return err
		}
		hdr.Format = tar.FormatPAX
		hdr.Name = rel
		if fi.IsDir() {
			hdr.Name = rel + "/"
		}
		hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
		hdr.Uname, hdr.Gname = "", ""
		hdr.ModTime = time.Unix(st.Mtim.Unix())
		hdr.AccessTime = time.Unix(st.Atim.Unix())
		hdr.ChangeTime = time.Time{}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR || st.Mode&unix.S_IFMT == unix.S_IFBLK {
			hdr.Devmajor = int64(unix.Major(st.Rdev))
			hdr.Devminor = int64(unix.Minor(st.Rdev))
		}
		if fi.Mode().IsRegular() && st.Nlink > 1 {
			k := inode{st.Dev, st.Ino}
			if first, ok := links[k]; ok {
				hdr.Typeflag = tar.TypeLink
				hdr.Linkname = first
				hdr.Size = 0
			} else {
				links[k] = rel
			}
		}
		xs, err := Xattrs(p)
		if err != nil {
			return err
		}
		if len(xs) > 0 {
			hdr.PAXRecords = map[string]string{}
			for k, v := range xs {
				hdr.PAXRecords[oldXattrPrefix+k] = v
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		entries++
		if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
			src, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.CopyN(tw, src, hdr.Size)
			src.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	if err := tw.Close(); err != nil {
		return 0, 0, err
	}
	if err := bw.Flush(); err != nil {
		return 0, 0, err
	}
	if err := f.Sync(); err != nil {
		return 0, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	return fi.Size(), entries, nil
}
func oldGvisorUntar(archive, dir string) (int, error) {
	f, err := os.Open(archive)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	tr := tar.NewReader(bufio.NewReaderSize(f, 1<<20))
	type dirTimes struct {
		path         string
		atime, mtime time.Time
	}
	var dirs []dirTimes
	entries := 0
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return entries, err
		}
		name := filepath.Clean(hdr.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return entries, errdefs.DataLossf("layer archive: bad name %q", hdr.Name)
		}
		p := filepath.Join(dir, name)
		if name != "." {
			// The parent must be a real directory inside dir.
			if err := oldCheckNoSymlink(dir, filepath.Dir(name)); err != nil {
				return entries, err
			}
		}
		mode := uint32(hdr.Mode & 0o7777)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if name != "." {
				if err := unix.Mkdir(p, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
					return entries, fmt.Errorf("mkdir %s: %w", name, err)
				}
			}
			dirs = append(dirs, dirTimes{p, hdr.AccessTime, hdr.ModTime})
		case tar.TypeReg:
			out, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
			if err != nil {
				return entries, err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return entries, fmt.Errorf("%s: %w", name, err)
			}
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, p); err != nil {
				return entries, err
			}
		case tar.TypeLink:
			ln := filepath.Clean(hdr.Linkname)
			if filepath.IsAbs(ln) || ln == ".." || strings.HasPrefix(ln, "../") {
				return entries, errdefs.DataLossf("layer archive: bad link %q", hdr.Linkname)
			}
			if err := oldCheckNoSymlink(dir, ln); err != nil {
				return entries, err
			}
			if err := os.Link(filepath.Join(dir, ln), p); err != nil {
				return entries, err
			}
			entries++
			continue
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			kind := uint32(unix.S_IFCHR)
			switch hdr.Typeflag {
			case tar.TypeBlock:
				kind = unix.S_IFBLK
			case tar.TypeFifo:
				kind = unix.S_IFIFO
			}
			dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
			if err := unix.Mknod(p, kind|0o600, int(dev)); err != nil {
				return entries, fmt.Errorf("mknod %s: %w", name, err)
			}
		default:
			return entries, errdefs.DataLossf("layer archive: %s: unsupported type %q", hdr.Name, hdr.Typeflag)
		}
		if err := unix.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
			return entries, fmt.Errorf("chown %s: %w", name, err)
		}
		for k, v := range hdr.PAXRecords {
			if x, ok := strings.CutPrefix(k, oldXattrPrefix); ok {
				if err := unix.Lsetxattr(p, x, []byte(v), 0); err != nil {
					return entries, fmt.Errorf("setxattr %s %s: %w", name, x, err)
				}
			}
		}
		if hdr.Typeflag != tar.TypeSymlink {
			// After chown, which clears set-id bits.
			if err := unix.Fchmodat(unix.AT_FDCWD, p, mode, 0); err != nil {
				return entries, fmt.Errorf("chmod %s: %w", name, err)
			}
		}
		if hdr.Typeflag != tar.TypeDir {
			if err := oldSetTimes(p, hdr.AccessTime, hdr.ModTime); err != nil {
				return entries, fmt.Errorf("times %s: %w", name, err)
			}
		}
		entries++
	}
	// Directory times last (creating entries inside changed them),
	// deepest first.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := oldSetTimes(dirs[i].path, dirs[i].atime, dirs[i].mtime); err != nil {
			return entries, err
		}
	}
	return entries, nil
}

// checkNoSymlink fails when any component of rel (a clean relative path)
// under dir is a symlink or not a directory.
func oldCheckNoSymlink(dir, rel string) error {
	if rel == "." || rel == "" {
		return nil
	}
	p := dir
	for _, c := range strings.Split(rel, "/") {
		p = filepath.Join(p, c)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if !fi.IsDir() && !(fi.Mode().IsRegular() && p == filepath.Join(dir, rel)) {
			return errdefs.DataLossf("layer archive: %s is not a directory", rel)
		}
	}
	return nil
}
func oldSetTimes(p string, atime, mtime time.Time) error {
	ts := []unix.Timespec{oldTimespec(atime), oldTimespec(mtime)}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
}

func oldTimespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	}
	return unix.NsecToTimespec(t.UnixNano())
}

func oldCriuTar(path, upper string, hostID int) (int, int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	links := map[[2]uint64]string{}
	n := 0
	err = filepath.WalkDir(upper, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(upper, p)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		// A socket file is not content: CRIU binds a restored unix
		// socket to its path again (creating the file), and tar cannot
		// carry one (a server's socket, e.g. PostgreSQL's
		// /tmp/.s.PGSQL.5432, failed the whole checkpoint).
		if fi.Mode()&os.ModeSocket != 0 {
			return nil
		}
		var target string
		if fi.Mode()&os.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		hdr.Format = tar.FormatPAX
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		hdr.Uid = oldRelID(hdr.Uid, hostID)
		hdr.Gid = oldRelID(hdr.Gid, hostID)
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat", rel)
		}
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		if fi.Mode().IsRegular() && st.Nlink > 1 {
			key := [2]uint64{st.Dev, st.Ino}
			if first, ok := links[key]; ok {
				hdr.Typeflag = tar.TypeLink
				hdr.Linkname = first
				hdr.Size = 0
			} else {
				links[key] = hdr.Name
			}
		}
		xa, err := Xattrs(p)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if len(xa) > 0 {
			hdr.PAXRecords = map[string]string{}
			for k, v := range xa {
				hdr.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		n++
		if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
			src, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.CopyN(tw, src, hdr.Size)
			src.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	if err := tw.Close(); err != nil {
		return 0, 0, err
	}
	if err := bw.Flush(); err != nil {
		return 0, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	return n, fi.Size(), f.Close()
}

func oldRelID(id, hostID int) int {
	if id >= hostID && id < hostID+oldIDsPerSandbox {
		return id - hostID
	}
	return 65534 // nobody: outside the sandbox's range
}
func oldCriuUntar(path, upper string, hostID int) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, errdefs.DataLossf("checkpoint image: %s missing", path)
		}
		return 0, err
	}
	defer f.Close()
	tr := tar.NewReader(bufio.NewReaderSize(f, 1<<20))
	type dirTimes struct {
		path string
		mt   time.Time
	}
	var dirs []dirTimes
	n := 0
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return n, errdefs.DataLossf("checkpoint image: %s: %v", path, err)
		}
		name := filepath.Clean(strings.TrimSuffix(hdr.Name, "/"))
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return n, errdefs.DataLossf("checkpoint image: %s: bad entry %q", path, hdr.Name)
		}
		p := filepath.Join(upper, name)
		mode := uint32(hdr.Mode & 0o7777)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if name != "." {
				if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
					return n, err
				}
			}
		case tar.TypeReg:
			out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return n, err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return n, fmt.Errorf("%s: %w", name, err)
			}
		case tar.TypeLink:
			if err := os.Link(filepath.Join(upper, filepath.Clean(hdr.Linkname)), p); err != nil {
				return n, err
			}
			n++
			continue // shares the first name's inode and metadata
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, p); err != nil {
				return n, err
			}
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			kind := uint32(unix.S_IFCHR)
			switch hdr.Typeflag {
			case tar.TypeBlock:
				kind = unix.S_IFBLK
			case tar.TypeFifo:
				kind = unix.S_IFIFO
			}
			if err := unix.Mknod(p, kind|mode, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))); err != nil {
				return n, fmt.Errorf("%s: mknod: %w", name, err)
			}
		default:
			return n, errdefs.DataLossf("checkpoint image: %s: entry %q of type %q", path, hdr.Name, hdr.Typeflag)
		}
		n++
		if err := os.Lchown(p, hostID+hdr.Uid, hostID+hdr.Gid); err != nil {
			return n, err
		}
		for k, v := range hdr.PAXRecords {
			if xn, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
				if err := unix.Lsetxattr(p, xn, []byte(v), 0); err != nil {
					return n, fmt.Errorf("%s: setxattr %s: %w", name, xn, err)
				}
			}
		}
		if hdr.Typeflag != tar.TypeSymlink {
			// After chown, which clears setuid/setgid.
			if err := unix.Fchmodat(unix.AT_FDCWD, p, mode, 0); err != nil {
				return n, err
			}
		}
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, dirTimes{p, hdr.ModTime})
			continue
		}
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return n, err
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		ts := []unix.Timespec{unix.NsecToTimespec(dirs[i].mt.UnixNano()), unix.NsecToTimespec(dirs[i].mt.UnixNano())}
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, dirs[i].path, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return n, nil
}
