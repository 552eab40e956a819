package confinedfs

import (
	"archive/tar"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fuzzFixture has two sandbox roots, each with a marker directory beside it.
//
// The read root ("r") is as hostile as possible: symlinks to "/", to /etc,
// climbing with "..", to the host path of its own marker directory, loops,
// and (as root, outside fuzz workers) a procfs whose magic links lead to the
// host's root. Only read-only operations run against it.
//
// The write root ("w") gets WriteFile, Mkdir and Remove. Its symlinks,
// resolved naively on the host, lead at worst to its own marker directory —
// never above its host directory — so that a bug found by the fuzzer shows
// up as a changed marker directory, not as damage to the host.
type fuzzFixture struct {
	host              string
	r, rOut, w, wOut  string
	rMarker, wMarker  []byte
	rfs, wfs          *FS
	outsideIDs        map[[2]uint64]string
	rSymlinks, wLinks map[string]string
}

func newFuzzFixture(tb testing.TB) *fuzzFixture {
	// tmpfs when available: WriteFile fsyncs, and fsync on a disk makes
	// the fuzzer crawl.
	base := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm"
	}
	host, err := os.MkdirTemp(base, "amber-fuzz-confinedfs-")
	if err != nil {
		tb.Fatal(err)
	}
	fx := &fuzzFixture{
		host:    host,
		r:       filepath.Join(host, "r", "root"),
		rOut:    filepath.Join(host, "r", "outside"),
		w:       filepath.Join(host, "w", "root"),
		wOut:    filepath.Join(host, "w", "outside"),
		rMarker: []byte("HOST-R-SECRET-8c1d2f"),
		wMarker: []byte("HOST-W-SECRET-4b7e90"),
	}
	tb.Cleanup(func() { _ = os.RemoveAll(host) })
	mustMkdir(tb, fx.rOut, fx.wOut, fx.r+"/etc", fx.r+"/a/b/c", fx.w+"/etc", fx.w+"/a/b")
	mustWrite(tb, fx.rOut+"/marker", fx.rMarker)
	mustWrite(tb, fx.wOut+"/marker", fx.wMarker)
	mustWrite(tb, fx.r+"/etc/passwd", []byte("sandbox passwd"))
	fx.rSymlinks = map[string]string{
		"abs":        "/",
		"etclink":    "/etc",
		"climb":      strings.Repeat("../", 12),
		"sibling":    "../outside",
		"hostabs":    fx.rOut,
		"dotdot":     "..",
		"self":       ".",
		"loop1":      "loop2",
		"loop2":      "loop1",
		"a/b/c/deep": "../../../../../../../../../../etc",
		"a/b/up":     "../../../outside/marker",
		"pself":      "/proc/self/root",
		"pfd":        "/proc/self/fd",
		"empty":      "nonexistent/../../..",
	}
	for name, target := range fx.rSymlinks {
		if err := os.Symlink(target, filepath.Join(fx.r, name)); err != nil {
			tb.Fatal(err)
		}
	}
	fx.wLinks = map[string]string{
		"sibling": "../outside",
		"hostabs": fx.wOut,
		"dotdot":  "..",
		"self":    ".",
		"loop1":   "loop2",
		"loop2":   "loop1",
		"a/b/up":  "../../../outside",
	}
	fx.resetW(tb)

	// Outside the read root we can mount a procfs, when we are root and in
	// the parent test process (a fuzz worker may be killed before its
	// cleanups run; it must not leak mounts).
	if os.Geteuid() == 0 && !isFuzzWorker() {
		proc := filepath.Join(fx.r, "proc")
		mustMkdir(tb, proc)
		if err := unix.Mount("proc", proc, "proc", 0, ""); err == nil {
			tb.Cleanup(func() { _ = unix.Unmount(proc, unix.MNT_DETACH) })
		}
	}

	fx.outsideIDs = map[[2]uint64]string{}
	for _, p := range []string{"/", "/etc", "/etc/passwd", "/proc", "/tmp", "/dev/shm", host,
		filepath.Dir(fx.r), fx.rOut, fx.rOut + "/marker", filepath.Dir(fx.w), fx.wOut, fx.wOut + "/marker"} {
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil {
			fx.outsideIDs[[2]uint64{st.Dev, st.Ino}] = p
		}
	}
	if fx.rfs, err = New(fx.r); err != nil {
		tb.Fatal(err)
	}
	if fx.wfs, err = New(fx.w); err != nil {
		tb.Fatal(err)
	}
	return fx
}

func isFuzzWorker() bool {
	f := flag.Lookup("test.fuzzworker")
	return f != nil && f.Value.String() == "true"
}

// resetW rebuilds the write root's content (keeping the root directory, so
// the FS's device and inode check holds).
func (fx *fuzzFixture) resetW(tb testing.TB) {
	ents, _ := os.ReadDir(fx.w)
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(fx.w, e.Name())); err != nil {
			tb.Fatal(err)
		}
	}
	mustMkdir(tb, fx.w+"/etc", fx.w+"/a/b")
	mustWrite(tb, fx.w+"/etc/passwd", []byte("sandbox passwd"))
	for name, target := range fx.wLinks {
		if err := os.Symlink(target, filepath.Join(fx.w, name)); err != nil {
			tb.Fatal(err)
		}
	}
}

// checkConfined fails if fd (from a confined open) refers to a file outside
// root: by its device and inode against the known outside files, and by
// the kernel's name for it.
func (fx *fuzzFixture) checkConfined(t *testing.T, fd int, root, p string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if what, bad := fx.outsideIDs[[2]uint64{st.Dev, st.Ino}]; bad {
		t.Fatalf("path %q opened host file %s", p, what)
	}
	name, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		t.Fatal(err)
	}
	if name != root && !strings.HasPrefix(name, root+"/") {
		t.Fatalf("path %q opened %s, outside the root %s", p, name, root)
	}
}

func (fx *fuzzFixture) checkW(t *testing.T, p string) {
	t.Helper()
	ents, err := os.ReadDir(fx.wOut)
	if err != nil || len(ents) != 1 || ents[0].Name() != "marker" {
		t.Fatalf("after %q: outside directory changed (%v, %v)", p, ents, err)
	}
	if b, err := os.ReadFile(fx.wOut + "/marker"); err != nil || !bytes.Equal(b, fx.wMarker) {
		t.Fatalf("after %q: marker changed: %q %v", p, b, err)
	}
	ents, err = os.ReadDir(filepath.Dir(fx.w))
	if err != nil || len(ents) != 2 {
		t.Fatalf("after %q: host directory changed: %v %v", p, ents, err)
	}
}

func (fx *fuzzFixture) checkErr(t *testing.T, err error, p string) {
	t.Helper()
	if err == nil {
		return
	}
	// The message may quote the tenant's path (escaped, or cut), which may
	// itself name host paths: a leak is any host path beyond those.
	if strings.Count(err.Error(), fx.host) > strings.Count(p, fx.host) {
		t.Fatalf("error for %q leaks the host path: %v", p, err)
	}
}

// FuzzResolvePath feeds paths to every operation. In the input, "$OUT"
// stands for the host path of the read root's marker directory and "$ROOT"
// for the host path of the root, so that the fuzzer can splice real host
// paths in. It asserts that no open through the confined resolution lands
// outside the root (device and inode, and /proc/self/fd name), that no read
// returns the marker, that no write, mkdir or remove changes anything
// beside the write root, and that errors never show a host path.
func FuzzResolvePath(f *testing.F) {
	for _, s := range []string{
		"/", "/etc/passwd", "/../../etc/passwd", "../../etc/passwd", "/abs/etc/passwd",
		"/etclink/passwd", "/climb$OUT/marker", "/hostabs/marker", "/sibling/marker",
		"/a/b/c/deep/passwd", "/a/b/up", "/pself$OUT/marker", "/pfd/3", "/loop1/x",
		"/dotdot/dotdot/outside/marker", "/self/self/hostabs/../marker", "/$ROOT/etc/passwd",
		"/empty/etc", "/proc/self/root$OUT/marker", "/proc/1/cwd", "//etc//passwd/",
	} {
		f.Add(s)
	}
	fx := newFuzzFixture(f)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, in string) {
		if len(in) > 1024 {
			return
		}
		p := strings.ReplaceAll(in, "$OUT", fx.rOut)
		p = strings.ReplaceAll(p, "$ROOT", fx.r)

		// The resolution itself, as every operation uses it.
		if rel, err := parse("fuzz", p); err == nil {
			root, err := fx.rfs.openRoot()
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(root)
			for _, flags := range []int{unix.O_PATH, unix.O_PATH | unix.O_NOFOLLOW} {
				if fd, err := openat2(root, rel, flags, 0, inRoot); err == nil {
					fx.checkConfined(t, fd, fx.r, p)
					unix.Close(fd)
				}
			}
			if rel != "" {
				if fd, _, err := parent(root, rel, inRoot); err == nil {
					fx.checkConfined(t, fd, fx.r, p)
					unix.Close(fd)
				}
				if fd, err := openat2(root, rel, unix.O_PATH|unix.O_DIRECTORY, 0, beneath); err == nil {
					fx.checkConfined(t, fd, fx.r, p)
					unix.Close(fd)
				}
			}
		}

		// Read-only operations on the hostile root.
		var buf bytes.Buffer
		err := fx.rfs.ReadFile(ctx, p, &buf)
		fx.checkErr(t, err, p)
		if bytes.Contains(buf.Bytes(), fx.rMarker) {
			t.Fatalf("ReadFile(%q) returned the host marker", p)
		}
		st, err := fx.rfs.Stat(ctx, p)
		fx.checkErr(t, err, p)
		if err == nil && st.Name == "marker" && st.Size == int64(len(fx.rMarker)) {
			t.Fatalf("Stat(%q) saw the host marker", p)
		}
		ls, err := fx.rfs.List(ctx, p)
		fx.checkErr(t, err, p)
		for _, e := range ls {
			if e.Name == "marker" && e.Size == int64(len(fx.rMarker)) {
				t.Fatalf("List(%q) saw the host marker", p)
			}
		}
		buf.Reset()
		err = fx.rfs.TarOut(ctx, p, &buf)
		fx.checkErr(t, err, p)
		if bytes.Contains(buf.Bytes(), fx.rMarker) {
			t.Fatalf("TarOut(%q) returned the host marker", p)
		}

		// Mutations on the write root.
		wp := strings.ReplaceAll(in, "$OUT", fx.wOut)
		wp = strings.ReplaceAll(wp, "$ROOT", fx.w)
		fx.resetW(t)
		err = fx.wfs.WriteFile(ctx, wp, strings.NewReader("fuzz"), 0o644)
		fx.checkErr(t, err, wp)
		fx.checkW(t, wp)
		if err == nil {
			// What was written is inside the root. (The path may not resolve
			// any more: writing "/dotdot/dotdot" replaces the root's "dotdot"
			// link itself. The outside checks above cover that case.)
			rel, _ := parse("fuzz", wp)
			root, err := fx.wfs.openRoot()
			if err != nil {
				t.Fatal(err)
			}
			if fd, err := openat2(root, rel, unix.O_PATH|unix.O_NOFOLLOW, 0, inRoot); err == nil {
				fx.checkConfined(t, fd, fx.w, wp)
				unix.Close(fd)
			}
			unix.Close(root)
		}
		fx.checkErr(t, fx.wfs.Remove(ctx, wp, false), wp)
		fx.checkW(t, wp)
		fx.checkErr(t, fx.wfs.Mkdir(ctx, wp, 0o755), wp)
		fx.checkW(t, wp)
		fx.checkErr(t, fx.wfs.Remove(ctx, wp, true), wp)
		fx.checkW(t, wp)
	})
}

// FuzzTarIn extracts fuzzed archives into the write root's /dst and asserts
// that nothing beside the root changes, that the root's /etc/passwd (outside
// /dst) is untouched, and that errors show no host path.
func FuzzTarIn(f *testing.F) {
	for _, ents := range [][]tarEntry{
		{tarDir("a"), tarFile("a/f", "x"), tarLink("a/l", "f"), tarHard("a/h", "a/f")},
		{tarFile("../evil", "x")},
		{tarFile("/evil", "x")},
		{tarLink("l", "../../outside"), tarFile("l/marker", "pwned")},
		{tarLink("l", "/etc"), tarFile("l/passwd", "pwned")},
		{tarLink("l", "../etc"), tarDir("l/d")},
		{tarLink("l", "../../outside/marker"), tarHard("h", "l")},
		{tarHard("h", "../etc/passwd")},
		{tarDir("d"), tarLink("d/up", ".."), tarFile("d/up/up/etc/passwd", "pwned")},
		{tarEntry{hdr: &tar.Header{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3}}},
	} {
		f.Add(tarOf(f, ents...))
	}
	fx := newFuzzFixture(f)
	tfs, err := New(fx.w, WithTarLimits(1<<20, 256))
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<20 {
			return
		}
		fx.resetW(t)
		err := tfs.TarIn(ctx, "/dst", bytes.NewReader(data))
		if err != nil && strings.Contains(err.Error(), fx.host) {
			t.Fatalf("error leaks the host path: %v", err)
		}
		fx.checkW(t, "archive")
		if b, err := os.ReadFile(fx.w + "/etc/passwd"); err != nil || string(b) != "sandbox passwd" {
			t.Fatalf("/etc/passwd outside the target directory changed: %q %v", b, err)
		}
		ents, err := os.ReadDir(fx.w)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if _, ok := fx.wLinks[e.Name()]; !ok && e.Name() != "etc" && e.Name() != "a" && e.Name() != "dst" {
				t.Fatalf("archive created %q beside the target directory", e.Name())
			}
		}
	})
}
