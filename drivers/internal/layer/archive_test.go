package layer

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/lib/failpoint"
)

// The drivers' two ways of storing owners.
var archiveIDMaps = []struct {
	name string
	ids  IDMap
}{
	{"gvisor", IDMap{}},
	{"criu", IDMap{Host: 200000, Size: 65536}},
}

// The times of the test trees: an access time after the modification and
// the change time (an hour ahead), so that reading does not move it
// (relatime).
var (
	testMtime = time.Date(2024, 1, 2, 3, 4, 5, 123456789, time.UTC)
	testAtime = time.Now().Add(time.Hour).Truncate(time.Microsecond)
)

func setTestTimes(t testing.TB, p string) {
	t.Helper()
	ts := []unix.Timespec{unix.NsecToTimespec(testAtime.UnixNano()), unix.NsecToTimespec(testMtime.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
}

// makeUpper fills dir with what an overlay's upper directory holds: nested
// directories (one opaque), files (one set-user-ID, one empty, one with a
// user xattr), symlinks (relative, absolute, dangling), hard links, a
// whiteout (0/0 character device), a FIFO and a socket, owned by several
// ids of the sandbox's range (o.Host+u for criu) and one outside it.
func makeUpper(t testing.TB, dir string, ids IDMap) {
	t.Helper()
	own := func(p string, u int) {
		if ids.Size > 0 && u != 12345678 {
			u += ids.Host
		}
		if err := os.Lchown(p, u, u+1); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"etc", "home/user/.cache", "opaque/sub", "deep/a/b/c/d/e/f"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"etc/hosts":          "127.0.0.1 localhost\n",
		"home/user/notes":    strings.Repeat("notes ", 5000),
		"home/user/empty":    "",
		"opaque/sub/f":       "in an opaque dir",
		"deep/a/b/c/d/e/f/x": "deep",
		"setuid":             "#!/bin/sh\n",
	}
	for p, s := range files {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(s), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "setuid"), 0o4755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "home/user"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "etc/hosts"), filepath.Join(dir, "home/user/hosts-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "etc/hosts"), filepath.Join(dir, "zz-hosts-link")); err != nil {
		t.Fatal(err)
	}
	for p, target := range map[string]string{
		"etc/rel":      "hosts",
		"etc/abs":      "/etc/passwd",
		"home/dangle":  "../nowhere/at/all",
		"home/user/up": "../../etc",
	} {
		if err := os.Symlink(target, filepath.Join(dir, p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mknod(filepath.Join(dir, "etc/gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "home/fifo"), 0o620); err != nil {
		t.Fatal(err)
	}
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(sock, &unix.SockaddrUnix{Name: filepath.Join(dir, "home/sock")}); err != nil {
		t.Fatal(err)
	}
	unix.Close(sock)
	for p, x := range map[string][2]string{
		"opaque":          {"trusted.overlay.opaque", "y"},
		"home/user/notes": {"user.tag", "a value\x00with a NUL"},
		"etc/gone":        {"trusted.overlay.test", "on a whiteout"},
	} {
		if err := unix.Lsetxattr(filepath.Join(dir, p), x[0], []byte(x[1]), 0); err != nil {
			t.Fatal(err)
		}
	}
	i := 0
	err = filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		u := i % 3 * 1000
		if strings.HasSuffix(p, "/empty") {
			u = 12345678 // outside the sandbox's range
		}
		own(p, u)
		i++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Times last, deepest first (the chowns and writes above moved them).
	var all []string
	_ = filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		all = append(all, p)
		return err
	})
	for _, p := range slices.Backward(all) {
		setTestTimes(t, p)
	}
}

// node is what a tree comparison looks at.
type node struct {
	Kind     string
	Mode     uint32
	UID, GID uint32
	Size     int64
	Data     string // sha256 of a regular file
	Link     string
	Rdev     uint64
	Mtime    int64
	Atime    int64
	Xattrs   map[string]string
	Group    string // the first name of a hard-link group
}

// snapshot describes every entry of dir (dir itself as "."), without
// following a symlink. Owners are as extracting with ids gives them:
// compare trees of one IDMap only.
func snapshot(t testing.TB, dir string, withAtime bool) map[string]node {
	t.Helper()
	out := map[string]node{}
	first := map[uint64]string{}
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		n := node{Mode: st.Mode, UID: st.Uid, GID: st.Gid, Mtime: st.Mtim.Nano()}
		if withAtime {
			n.Atime = st.Atim.Nano()
		}
		xs, err := Xattrs(p)
		if err != nil {
			return err
		}
		if len(xs) > 0 {
			n.Xattrs = xs
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			n.Kind = "dir"
		case unix.S_IFREG:
			n.Kind, n.Size = "file", st.Size
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			n.Data = hex.EncodeToString(sum[:8])
			if st.Nlink > 1 {
				if f, ok := first[st.Ino]; ok {
					n.Group = f
				} else {
					first[st.Ino], n.Group = rel, rel
				}
			}
		case unix.S_IFLNK:
			n.Kind = "symlink"
			n.Link, _ = os.Readlink(p)
			n.Atime = 0 // readlink moves it
		case unix.S_IFSOCK:
			return nil // never archived
		default:
			n.Kind, n.Rdev = "node", st.Rdev
		}
		out[rel] = n
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diffTrees(t testing.TB, want, got map[string]node) {
	t.Helper()
	var names []string
	for k := range want {
		names = append(names, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	bad := 0
	for _, k := range names {
		w, wok := want[k]
		g, gok := got[k]
		switch {
		case !gok:
			t.Errorf("%s: missing", k)
		case !wok:
			t.Errorf("%s: not in the original (%+v)", k, g)
		case fmt.Sprint(w) != fmt.Sprint(g):
			t.Errorf("%s:\n want %+v\n  got %+v", k, w, g)
		default:
			continue
		}
		if bad++; bad > 20 {
			t.Fatal("too many differences")
		}
	}
}

func readArchive(t testing.TB, p string) []*tar.Header {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var hs []*tar.Header
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hs
		}
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
}

// TestArchiveRoundTrip: what WriteArchive stores, ExtractArchive puts back
// as it was — types, modes (set-ID and sticky bits), owners (translated by
// the IDMap; an owner outside the range becomes Nobody), times, xattrs
// (opaque directories, whiteouts), hard links, symlinks as stored — and
// sockets are left out.
func TestArchiveRoundTrip(t *testing.T) {
	for _, m := range archiveIDMaps {
		t.Run(m.name, func(t *testing.T) {
			src, dst := t.TempDir(), t.TempDir()
			makeUpper(t, src, m.ids)
			want := snapshot(t, src, true)
			ar := filepath.Join(t.TempDir(), "layer.tar")
			n, size, err := WriteArchiveFile(ar, src, ArchiveOptions{IDs: m.ids})
			if err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(ar); err != nil || fi.Size() != size {
				t.Fatalf("size %d, file %v %v", size, fi, err)
			}
			if n != len(want) {
				t.Fatalf("%d entries archived, the tree has %d (socket left out)", n, len(want))
			}
			hs := readArchive(t, ar)
			if hs[0].Name != "./" || hs[0].Typeflag != tar.TypeDir {
				t.Fatalf("first entry %q %q, want the root ./", hs[0].Name, hs[0].Typeflag)
			}
			got, err := ExtractArchiveFile(ar, dst, ArchiveOptions{IDs: m.ids})
			if err != nil {
				t.Fatal(err)
			}
			if got != n {
				t.Fatalf("extracted %d entries of %d", got, n)
			}
			if m.ids.Size > 0 {
				// The owner outside the range comes back as the
				// sandbox's nobody.
				e := want["home/user/empty"]
				e.UID, e.GID = uint32(m.ids.Host+Nobody), uint32(m.ids.Host+Nobody)
				want["home/user/empty"] = e
			}
			diffTrees(t, want, snapshot(t, dst, true))
		})
	}
}

// TestArchiveReadsOldArchives: archives the drivers wrote before the
// shared implementation (their code is kept in archive_old_test.go) are
// extracted as the old code extracted them, and the old code extracts the
// new archives the same (a rollback reads them); the headers of both
// writers match but for the access time the criu driver did not store.
func TestArchiveReadsOldArchives(t *testing.T) {
	for _, m := range archiveIDMaps {
		t.Run(m.name, func(t *testing.T) {
			src := t.TempDir()
			makeUpper(t, src, m.ids)
			dir := t.TempDir()
			oldAr, newAr := filepath.Join(dir, "old.tar"), filepath.Join(dir, "new.tar")
			oldWrite := func() error {
				if m.ids.Size == 0 {
					_, _, err := oldGvisorTar(src, oldAr)
					return err
				}
				_, _, err := oldCriuTar(oldAr, src, m.ids.Host)
				return err
			}
			oldRead := func(ar, dst string) error {
				var err error
				if m.ids.Size == 0 {
					_, err = oldGvisorUntar(ar, dst)
				} else {
					_, err = oldCriuUntar(ar, dst, m.ids.Host)
				}
				return err
			}
			if err := oldWrite(); err != nil {
				t.Fatal(err)
			}
			if _, _, err := WriteArchiveFile(newAr, src, ArchiveOptions{IDs: m.ids}); err != nil {
				t.Fatal(err)
			}
			oh, nh := readArchive(t, oldAr), readArchive(t, newAr)
			if len(oh) != len(nh) {
				t.Fatalf("old archive has %d entries, new %d", len(oh), len(nh))
			}
			for i := range oh {
				o, n := *oh[i], *nh[i]
				if m.ids.Size > 0 {
					n.AccessTime = time.Time{}
					delete(n.PAXRecords, "atime")
				}
				o.Format, n.Format = 0, 0
				if fmt.Sprint(o) != fmt.Sprint(n) {
					t.Errorf("entry %d:\n old %+v\n new %+v", i, o, n)
				}
			}

			// Old archive, new reader; new archive, old reader: the same
			// tree as the old reader makes of the old archive.
			ref, a, b := t.TempDir(), t.TempDir(), t.TempDir()
			if err := oldRead(oldAr, ref); err != nil {
				t.Fatal(err)
			}
			if _, err := ExtractArchiveFile(oldAr, a, ArchiveOptions{IDs: m.ids}); err != nil {
				t.Fatal(err)
			}
			if err := oldRead(newAr, b); err != nil {
				t.Fatal(err)
			}
			withAtime := m.ids.Size == 0
			want := snapshot(t, ref, withAtime)
			diffTrees(t, want, snapshot(t, a, withAtime))
			diffTrees(t, want, snapshot(t, b, withAtime))
		})
	}
}

// hostDir makes a host directory outside any layer holding a marker file,
// and returns it and a function that fails the test if anything in it, or
// it, changed (content, names, modes, owners, times, links).
func hostDir(t testing.TB) (string, func()) {
	t.Helper()
	h := filepath.Join(t.TempDir(), "host")
	if err := os.Mkdir(h, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h, "marker"), []byte("HOST-SECRET"), 0o644); err != nil {
		t.Fatal(err)
	}
	setTestTimes(t, filepath.Join(h, "marker"))
	setTestTimes(t, h)
	before := snapshot(t, h, false)
	return h, func() {
		t.Helper()
		diffTrees(t, before, snapshot(t, h, false))
	}
}

// TestArchiveWalkIgnoresSwappedSymlink: a directory of the layer swapped
// for a symlink to a host directory after the walk listed its parent (the
// files API racing a cut) is archived as that symlink, and the host
// directory's files are not in the archive; at restore, a directory
// swapped for such a symlink right after extraction created it is neither
// chowned, chmodded nor written into — the extraction is refused.
func TestArchiveWalkIgnoresSwappedSymlink(t *testing.T) {
	for _, m := range archiveIDMaps {
		t.Run(m.name+"/cut", func(t *testing.T) {
			host, unchanged := hostDir(t)
			upper := t.TempDir()
			if err := os.MkdirAll(filepath.Join(upper, "work/sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(upper, "work/sub/own"), []byte("the sandbox's"), 0o644); err != nil {
				t.Fatal(err)
			}
			fp := failpoint.New()
			fp.ArmFunc(FPArchiveListed, 1, func(subject string) error {
				if subject != "." {
					t.Errorf("first listed %q, want the root", subject)
				}
				// The racing files API: remove work, put a symlink to
				// the host directory in its place.
				if err := os.RemoveAll(filepath.Join(upper, "work")); err != nil {
					return err
				}
				return os.Symlink(host, filepath.Join(upper, "work"))
			})
			ar := filepath.Join(t.TempDir(), "layer.tar")
			_, _, err := WriteArchiveFile(ar, upper, ArchiveOptions{IDs: m.ids, Failpoints: fp})
			if fp.Hits(FPArchiveListed) == 0 {
				t.Fatal("the walk never reached the failpoint")
			}
			if err != nil {
				t.Fatalf("archive: %v", err)
			}
			b, err := os.ReadFile(ar)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(b, []byte("HOST-SECRET")) {
				t.Error("the archive holds the host directory's marker")
			}
			for _, h := range readArchive(t, ar) {
				if strings.Contains(h.Name, "marker") {
					t.Errorf("the archive has entry %q of the host directory", h.Name)
				}
				if h.Name == "work" && (h.Typeflag != tar.TypeSymlink || h.Linkname != host) {
					t.Errorf("work archived as %q -> %q, want the symlink it is", h.Typeflag, h.Linkname)
				}
			}
			unchanged()
		})
		t.Run(m.name+"/restore", func(t *testing.T) {
			host, unchanged := hostDir(t)
			src := t.TempDir()
			if err := os.MkdirAll(filepath.Join(src, "work/sub"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(src, "work/planted"), []byte("from the archive"), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{"work/sub", "work/planted", "work"} {
				if err := os.Chown(filepath.Join(src, p), m.ids.Host+4321, m.ids.Host+4321); err != nil {
					t.Fatal(err)
				}
			}
			ar := filepath.Join(t.TempDir(), "layer.tar")
			if _, _, err := WriteArchiveFile(ar, src, ArchiveOptions{IDs: m.ids}); err != nil {
				t.Fatal(err)
			}
			upper := t.TempDir()
			fp := failpoint.New()
			fp.ArmFunc(FPExtractMkdir, 1, func(subject string) error {
				if subject != "work" {
					t.Errorf("first directory made %q, want work", subject)
				}
				if err := os.Remove(filepath.Join(upper, "work")); err != nil {
					return err
				}
				return os.Symlink(host, filepath.Join(upper, "work"))
			})
			_, err := ExtractArchiveFile(ar, upper, ArchiveOptions{IDs: m.ids, Failpoints: fp})
			if fp.Hits(FPExtractMkdir) == 0 {
				t.Fatal("the extraction never reached the failpoint")
			}
			if !errdefs.IsDataLoss(err) {
				t.Errorf("extraction through the swapped symlink: %v, want a data-loss refusal", err)
			}
			unchanged()
		})
	}
}

type tarEnt struct {
	typ      byte
	name     string
	link     string
	data     string
	uid      int
	mode     int64
	maj, min int64
}

func tarBytes(t testing.TB, ents ...tarEnt) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Typeflag: e.typ, Name: e.name, Linkname: e.link, Mode: e.mode, Uid: e.uid, Gid: e.uid,
			Size: int64(len(e.data)), Devmajor: e.maj, Devminor: e.min, Format: tar.FormatPAX}
		if h.Mode == 0 {
			h.Mode = 0o755
		}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := io.WriteString(tw, e.data); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestExtractArchiveHostile: archives that try to reach out of the upper
// directory — "../x", absolute names, a symlink then a file or directory
// through it, hard links to /etc/passwd or through a symlink, a name
// climbing out after a prefix — are refused as ErrDataLoss, and the host
// directory a symlink points at, /etc/passwd and the upper directory's
// parent are unchanged.
func TestExtractArchiveHostile(t *testing.T) {
	var passwd unix.Stat_t
	if err := unix.Lstat("/etc/passwd", &passwd); err != nil {
		t.Fatal(err)
	}
	for _, m := range archiveIDMaps {
		for _, c := range []struct {
			name string
			ents func(host string) []tarEnt
		}{
			{"dotdot", func(string) []tarEnt { return []tarEnt{{typ: tar.TypeReg, name: "../x", data: "escaped"}} }},
			{"dotdot-dir", func(string) []tarEnt { return []tarEnt{{typ: tar.TypeDir, name: "../x/"}} }},
			{"prefix-then-dotdot", func(string) []tarEnt {
				return []tarEnt{{typ: tar.TypeDir, name: "a/"}, {typ: tar.TypeReg, name: "a/../../x", data: "escaped"}}
			}},
			{"absolute", func(host string) []tarEnt {
				return []tarEnt{{typ: tar.TypeReg, name: host + "/planted", data: "escaped"}}
			}},
			{"symlink-then-file", func(host string) []tarEnt {
				return []tarEnt{{typ: tar.TypeSymlink, name: "l", link: host}, {typ: tar.TypeReg, name: "l/planted", data: "escaped"}}
			}},
			{"symlink-then-overwrite", func(host string) []tarEnt {
				return []tarEnt{{typ: tar.TypeSymlink, name: "l", link: host + "/marker"}, {typ: tar.TypeReg, name: "l", data: "escaped"}}
			}},
			{"symlink-then-dir", func(host string) []tarEnt {
				// The old gvisor reader chmodded the symlink's target.
				return []tarEnt{{typ: tar.TypeSymlink, name: "l", link: host}, {typ: tar.TypeDir, name: "l/", mode: 0o777, uid: 4321}}
			}},
			{"symlink-then-deep", func(host string) []tarEnt {
				return []tarEnt{{typ: tar.TypeSymlink, name: "l", link: host}, {typ: tar.TypeDir, name: "l/d/"}}
			}},
			{"relative-symlink-then-file", func(host string) []tarEnt {
				return []tarEnt{{typ: tar.TypeSymlink, name: "l", link: "../host"}, {typ: tar.TypeReg, name: "l/planted", data: "escaped"}}
			}},
			{"hardlink-etc-passwd", func(string) []tarEnt {
				return []tarEnt{{typ: tar.TypeLink, name: "passwd", link: "/etc/passwd"}}
			}},
			{"hardlink-dotdot", func(string) []tarEnt {
				return []tarEnt{{typ: tar.TypeLink, name: "passwd", link: "../../../../../../../../etc/passwd"}}
			}},
			{"hardlink-through-symlink", func(host string) []tarEnt {
				return []tarEnt{{typ: tar.TypeSymlink, name: "l", link: host}, {typ: tar.TypeLink, name: "m", link: "l/marker"}}
			}},
			{"root-as-file", func(string) []tarEnt { return []tarEnt{{typ: tar.TypeReg, name: ".", data: "x"}} }},
		} {
			t.Run(m.name+"/"+c.name, func(t *testing.T) {
				host, unchanged := hostDir(t)
				parent := filepath.Join(filepath.Dir(host), "layer")
				upper := filepath.Join(parent, "upper")
				if err := os.MkdirAll(upper, 0o755); err != nil {
					t.Fatal(err)
				}
				_, err := ExtractArchive(bytes.NewReader(tarBytes(t, c.ents(host)...)), upper, ArchiveOptions{IDs: m.ids})
				if !errdefs.IsDataLoss(err) {
					t.Errorf("extraction: %v, want a data-loss refusal", err)
				}
				t.Log(err)
				unchanged()
				if ents, _ := os.ReadDir(parent); len(ents) != 1 {
					t.Errorf("the upper directory's parent holds %v", ents)
				}
				if ents, _ := os.ReadDir(filepath.Dir(host)); len(ents) != 2 {
					t.Errorf("the host directory's parent holds %v", ents)
				}
				var st unix.Stat_t
				if err := unix.Lstat("/etc/passwd", &st); err != nil || st.Nlink != passwd.Nlink || st.Ctim != passwd.Ctim {
					t.Errorf("/etc/passwd changed: %+v", st)
				}
			})
		}
	}
}

// TestExtractArchiveErrors: a truncated archive and an unknown entry type
// are ErrDataLoss naming the problem; a missing file too.
func TestExtractArchiveErrors(t *testing.T) {
	good := tarBytes(t, tarEnt{typ: tar.TypeDir, name: "./"}, tarEnt{typ: tar.TypeReg, name: "f", data: strings.Repeat("x", 4096)})
	for name, b := range map[string][]byte{
		"truncated": good[:1024],
		"sparse":    tarBytes(t, tarEnt{typ: tar.TypeGNUSparse, name: "s"}),
		"no-parent": tarBytes(t, tarEnt{typ: tar.TypeReg, name: "missing/f", data: "x"}),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ExtractArchive(bytes.NewReader(b), t.TempDir(), ArchiveOptions{})
			if !errdefs.IsDataLoss(err) {
				t.Errorf("%v, want data loss", err)
			}
		})
	}
	if _, err := ExtractArchiveFile(filepath.Join(t.TempDir(), "none.tar"), t.TempDir(), ArchiveOptions{}); !errdefs.IsDataLoss(err) {
		t.Errorf("missing archive: %v, want data loss", err)
	}
}

// TestArchiveChangedEntry: an entry that is not what the walk saw a
// moment ago (a regular file swapped for a FIFO between fstatat and open)
// fails the archive as ErrConflict, without opening the FIFO (which would
// block).
func TestArchiveChangedEntry(t *testing.T) {
	upper := t.TempDir()
	if err := os.WriteFile(filepath.Join(upper, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := &archiver{tw: tar.NewWriter(io.Discard), links: map[[2]uint64]string{}}
	fd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, "f", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(upper, "f")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(upper, "f"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.file(fd, "f", "f", &st) }()
	select {
	case err := <-done:
		if !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("%v, want a conflict", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the walk opened the FIFO")
	}
}

// FuzzLayerArchive extracts arbitrary bytes as a layer archive into a
// temporary upper directory and asserts that nothing outside it is created
// or changed: the host directory beside it (its marker's content, mode,
// owner, times, link count), the blob directory the archive's references
// read from, and /etc/passwd.
func FuzzLayerArchive(f *testing.F) {
	host := "/nonexistent-fuzz-host" // seeds name it; the fixture's is below
	for _, ents := range [][]tarEnt{
		{{typ: tar.TypeDir, name: "./"}, {typ: tar.TypeDir, name: "a/"}, {typ: tar.TypeReg, name: "a/f", data: "x"},
			{typ: tar.TypeSymlink, name: "a/l", link: "f"}, {typ: tar.TypeLink, name: "a/h", link: "a/f"},
			{typ: tar.TypeChar, name: "a/wh"}, {typ: tar.TypeFifo, name: "a/p"}},
		{{typ: tar.TypeReg, name: "../x", data: "x"}},
		{{typ: tar.TypeReg, name: "/x", data: "x"}},
		{{typ: tar.TypeSymlink, name: "l", link: "../host"}, {typ: tar.TypeReg, name: "l/planted", data: "x"}},
		{{typ: tar.TypeSymlink, name: "l", link: "../host"}, {typ: tar.TypeDir, name: "l/", mode: 0o777}},
		{{typ: tar.TypeSymlink, name: "l", link: "../host/marker"}, {typ: tar.TypeLink, name: "h", link: "l"}},
		{{typ: tar.TypeLink, name: "h", link: "../host/marker"}},
		{{typ: tar.TypeLink, name: "h", link: "/etc/passwd"}},
		{{typ: tar.TypeDir, name: "d/"}, {typ: tar.TypeSymlink, name: "d/up", link: ".."}, {typ: tar.TypeReg, name: "d/up/up/host/x", data: "x"}},
		{{typ: tar.TypeSymlink, name: "abs", link: host}, {typ: tar.TypeReg, name: "abs/x", data: "x"}},
	} {
		f.Add(tarBytes(f, ents...))
	}
	blobKey := strings.Repeat("ab", 16)
	blobSum := sha256.Sum256([]byte("blob bytes"))
	for _, k := range []string{blobKey, "../host/marker", "/etc/passwd", strings.Repeat("0", 32)} {
		f.Add(refTar(f, map[string]string{paxBlob: k, paxBlobSize: "10", paxBlobSHA256: hex.EncodeToString(blobSum[:])}))
	}
	base := f.TempDir()
	if err := os.Mkdir(filepath.Join(base, "blobs"), 0o700); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "blobs", blobKey), []byte("blob bytes"), 0o600); err != nil {
		f.Fatal(err)
	}
	hostd := filepath.Join(base, "host")
	if err := os.Mkdir(hostd, 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostd, "marker"), []byte("HOST-SECRET"), 0o644); err != nil {
		f.Fatal(err)
	}
	before := snapshot(f, base, false)
	var passwd unix.Stat_t
	if err := unix.Lstat("/etc/passwd", &passwd); err != nil {
		f.Fatal(err)
	}
	upper := filepath.Join(base, "upper")
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<20 {
			return
		}
		if err := os.RemoveAll(upper); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(upper, 0o755); err != nil {
			t.Fatal(err)
		}
		setTestTimes(t, upper)
		_, _ = ExtractArchive(bytes.NewReader(data), upper, ArchiveOptions{IDs: IDMap{Host: 200000, Size: 65536}, BlobDir: filepath.Join(base, "blobs")})
		if err := os.RemoveAll(upper); err != nil {
			t.Fatal(err)
		}
		after := snapshot(t, base, false)
		delete(after, ".") // removing upper moved the base's times
		b := maps.Clone(before)
		delete(b, ".")
		diffTrees(t, b, after)
		var st unix.Stat_t
		if err := unix.Lstat("/etc/passwd", &st); err != nil || st.Nlink != passwd.Nlink || st.Ctim != passwd.Ctim {
			t.Fatalf("/etc/passwd changed: %+v", st)
		}
	})
}
