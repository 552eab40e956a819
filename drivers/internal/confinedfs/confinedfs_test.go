package confinedfs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

var bg = context.Background()

func TestPathTraversalRefused(t *testing.T) {
	fx := newFixture(t)
	for _, p := range []string{
		"../../etc/passwd", "etc/passwd", "", // relative or empty
		"/../../etc/shadow", "/..", "/etc/../../etc/shadow", "/home/user/../../../x",
		"/etc/\x00passwd", "/" + strings.Repeat("a", 300),
	} {
		_, err := fx.read(t, p)
		wantKind(t, err, errdefs.ErrInvalidArgument, "ReadFile "+p)
		_, err = fx.fs.Stat(bg, p)
		fx.checkErr(t, err)
		wantKind(t, err, errdefs.ErrInvalidArgument, "Stat "+p)
		_, err = fx.fs.List(bg, p)
		wantKind(t, err, errdefs.ErrInvalidArgument, "List "+p)
		err = fx.fs.WriteFile(bg, p, strings.NewReader("x"), 0o644)
		wantKind(t, err, errdefs.ErrInvalidArgument, "WriteFile "+p)
		err = fx.fs.Mkdir(bg, p, 0o755)
		wantKind(t, err, errdefs.ErrInvalidArgument, "Mkdir "+p)
		err = fx.fs.Remove(bg, p, true)
		wantKind(t, err, errdefs.ErrInvalidArgument, "Remove "+p)
		err = fx.fs.TarOut(bg, p, &bytes.Buffer{})
		wantKind(t, err, errdefs.ErrInvalidArgument, "TarOut "+p)
		err = fx.fs.TarIn(bg, p, bytes.NewReader(tarOf(t, tarFile("x", "x"))))
		wantKind(t, err, errdefs.ErrInvalidArgument, "TarIn "+p)
	}
	fx.checkOutside(t)
	if b, _ := os.ReadFile(filepath.Join(fx.root, "etc/passwd")); string(b) != "sandbox passwd\n" {
		t.Fatalf("root's passwd changed: %q", b)
	}
	// ".." that stays inside is fine.
	if b, err := fx.read(t, "/home/user/../../etc/passwd"); err != nil || string(b) != "sandbox passwd\n" {
		t.Fatalf("in-root ..: %q %v", b, err)
	}
}

func TestAbsoluteSymlinkMeansTheRoot(t *testing.T) {
	fx := newFixture(t)
	b, err := fx.read(t, "/etclink/passwd")
	if err != nil || string(b) != "sandbox passwd\n" {
		t.Fatalf("ReadFile(/etclink/passwd) = %q, %v; want the root's /etc/passwd", b, err)
	}
	// hostabs names the host's outside directory; inside the root it means
	// ROOT/HOST/outside, which does not exist.
	_, err = fx.read(t, "/hostabs/marker")
	wantKind(t, err, errdefs.ErrNotFound, "ReadFile /hostabs/marker")
	ls, err := fx.fs.List(bg, "/etclink")
	if err != nil || len(ls) != 2 || ls[0].Name != "passwd" || ls[1].Name != "shadow" {
		t.Fatalf("List(/etclink) = %v, %v", ls, err)
	}
	_, err = fx.fs.List(bg, "/hostabs")
	wantKind(t, err, errdefs.ErrNotFound, "List /hostabs")
	st, err := fx.fs.Stat(bg, "/etclink")
	if err != nil || st.Mode&os.ModeSymlink == 0 || st.Link != "/etc" {
		t.Fatalf("Stat(/etclink) = %+v, %v; want a symlink to /etc", st, err)
	}
	st, err = fx.fs.Stat(bg, "/etclink/passwd") // parent followed inside the root
	if err != nil || !st.Mode.IsRegular() || st.Size != int64(len("sandbox passwd\n")) {
		t.Fatalf("Stat(/etclink/passwd) = %+v, %v", st, err)
	}
	// Writes through absolute symlinks stay in the root too: while
	// ROOT/HOST/outside does not exist, hostabs dangles (as os.MkdirAll,
	// WriteFile does not create a dangling symlink's target)…
	err = fx.fs.WriteFile(bg, "/hostabs/marker", strings.NewReader("pwned"), 0o644)
	wantKind(t, err, errdefs.ErrNotFound, "WriteFile through a dangling hostabs")
	fx.checkOutside(t)
	// …and once it exists, the write lands there.
	mustMkdir(t, filepath.Join(fx.root, fx.outside))
	if err := fx.fs.WriteFile(bg, "/hostabs/marker", strings.NewReader("pwned"), 0o644); err != nil {
		t.Fatalf("WriteFile through hostabs: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(fx.root, fx.outside, "marker")); err != nil || string(b) != "pwned" {
		t.Fatalf("write through hostabs should land in ROOT%s/marker: %q %v", fx.outside, b, err)
	}
	fx.checkOutside(t)
}

func TestRelativeSymlinkClimbingOut(t *testing.T) {
	fx := newFixture(t)
	// climb -> ../../../…: clamped at the root, so climb/etc/passwd is the
	// root's.
	b, err := fx.read(t, "/climb/etc/passwd")
	if err != nil || string(b) != "sandbox passwd\n" {
		t.Fatalf("ReadFile(/climb/etc/passwd) = %q, %v", b, err)
	}
	b, err = fx.read(t, "/climb"+fx.outside+"/marker")
	wantKind(t, err, errdefs.ErrNotFound, "ReadFile via climb")
	_, err = fx.read(t, "/sibling/marker")
	wantKind(t, err, errdefs.ErrNotFound, "ReadFile /sibling/marker")
	_, err = fx.read(t, "/loop1/x")
	wantKind(t, err, errdefs.ErrInvalidArgument, "ReadFile through a symlink loop")
	_ = b

	// Mutations through climbing links stay inside.
	err = fx.fs.Mkdir(bg, "/sibling/newdir", 0o700)
	wantKind(t, err, errdefs.ErrNotFound, "Mkdir through a dangling sibling")
	fx.checkOutside(t)
	mustMkdir(t, filepath.Join(fx.root, "outside"))
	if err := fx.fs.Mkdir(bg, "/sibling/newdir", 0o700); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(fx.root, "outside/newdir")); err != nil || !st.IsDir() {
		t.Fatalf("Mkdir via sibling should create ROOT/outside/newdir: %v", err)
	}
	if err := fx.fs.WriteFile(bg, "/sibling/marker", strings.NewReader("pwned"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fx.fs.Remove(bg, "/sibling", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(fx.root, "sibling")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Remove(/sibling) left the link: %v", err)
	}
	if err := fx.fs.Remove(bg, "/hostabs", true); err != nil {
		t.Fatal(err)
	}
	if err := fx.fs.Remove(bg, "/climb", true); err != nil {
		t.Fatal(err)
	}
	fx.checkOutside(t)
}

// TestMagicLinksRefused mounts a procfs inside the root: /proc/self/root
// and friends would jump to the host's root, and must be refused.
func TestMagicLinksRefused(t *testing.T) {
	requireRoot(t)
	fx := newFixture(t)
	proc := filepath.Join(fx.root, "proc")
	mustMkdir(t, proc)
	if err := unix.Mount("proc", proc, "proc", 0, ""); err != nil {
		t.Skipf("mount proc: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(proc, unix.MNT_DETACH) })
	if err := os.Symlink("/proc/self/root", filepath.Join(fx.root, "selfroot")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{
		"/proc/self/root" + fx.outside + "/marker",
		"/proc/1/root" + fx.outside + "/marker",
		"/proc/self/cwd/marker",
		"/proc/thread-self/root" + fx.outside + "/marker",
		"/selfroot" + fx.outside + "/marker",
	} {
		_, err := fx.read(t, p)
		if err == nil {
			t.Fatalf("ReadFile(%q) succeeded", p)
		}
		if _, err := fx.fs.List(bg, filepath.Dir(p)); err == nil && strings.Contains(p, "root") {
			t.Errorf("List(%q) succeeded", filepath.Dir(p))
		}
		if err := fx.fs.WriteFile(bg, p+"2", strings.NewReader("x"), 0o644); err == nil {
			t.Errorf("WriteFile(%q) succeeded", p+"2")
		}
	}
	fx.checkOutside(t)
}

// TestSymlinkSwapRace flips /d between a directory and a symlink to "/"
// (and one that climbs with "..") with renameat2(RENAME_EXCHANGE) while
// readers and writers go through /d. The path they use names the host's
// marker when /d is a symlink resolved on the host, so a naive
// implementation returns it (checked below as a control); ours must never.
func TestSymlinkSwapRace(t *testing.T) {
	fx := newFixture(t)
	mk := func(rel, content string) {
		p := filepath.Join(fx.root, rel, fx.outside, "marker")
		mustMkdir(t, filepath.Dir(p))
		mustWrite(t, p, []byte(content))
	}
	mk("d", "sandbox: d is a directory")
	mk("", "sandbox: d resolved inside the root")
	if err := os.Symlink("/", filepath.Join(fx.root, "d_abs")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(strings.Repeat("../", 12), filepath.Join(fx.root, "d_rel")); err != nil {
		t.Fatal(err)
	}
	target := "/d" + fx.outside + "/marker"

	var stop atomic.Bool
	var wg sync.WaitGroup
	var flips atomic.Int64
	for _, alt := range []string{"d_abs", "d_rel"} {
		wg.Go(func() {
			for !stop.Load() {
				err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(fx.root, "d"), unix.AT_FDCWD, filepath.Join(fx.root, alt), unix.RENAME_EXCHANGE)
				if err == nil {
					flips.Add(1)
				}
			}
		})
	}

	// Control: a naive filepath.Join + os.ReadFile does read the host's file.
	naive := 0
	for i := 0; i < 2000 && naive == 0; i++ {
		if b, err := os.ReadFile(filepath.Join(fx.root, target)); err == nil && bytes.Equal(b, fx.marker) {
			naive++
		}
	}
	if naive == 0 {
		t.Fatal("control failed: the naive reader never reached the host marker; the race does not exercise anything")
	}

	var reads, ok atomic.Int64
	deadline := time.Now().Add(time.Second)
	dir := "/d" + fx.outside
	for range 3 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				b, err := fx.read(t, target)
				reads.Add(1)
				if err == nil {
					ok.Add(1)
					if !strings.HasPrefix(string(b), "sandbox:") {
						t.Errorf("read %q", b)
					}
				}
				if st, err := fx.fs.Stat(bg, target); err == nil && st.Size == int64(len(fx.marker)) {
					t.Errorf("Stat saw the host marker's size")
				}
				// The host's marker has its own size; the sandbox's copies differ.
				if ls, err := fx.fs.List(bg, dir); err == nil {
					for _, e := range ls {
						if e.Name == "marker" && e.Size == int64(len(fx.marker)) {
							t.Errorf("List shows the host marker")
						}
					}
				}
			}
		})
	}
	wg.Go(func() {
		for time.Now().Before(deadline) {
			var out bytes.Buffer
			if err := fx.fs.TarOut(bg, dir, &out); err == nil && bytes.Contains(out.Bytes(), fx.marker) {
				t.Errorf("TarOut returned the host marker")
			}
		}
	})
	small := tarOf(t, tarFile("f", "x"))
	wg.Go(func() {
		for time.Now().Before(deadline) {
			_ = fx.fs.WriteFile(bg, dir+"/written", strings.NewReader("x"), 0o644)
			_ = fx.fs.Mkdir(bg, dir+"/dir/sub", 0o755)
			_ = fx.fs.Remove(bg, dir+"/dir", true)
			_ = fx.fs.TarIn(bg, dir+"/t", bytes.NewReader(small))
		}
	})
	time.Sleep(time.Until(deadline))
	stop.Store(true)
	wg.Wait()
	t.Logf("%d reads (%d ok), %d flips", reads.Load(), ok.Load(), flips.Load())
	if ok.Load() == 0 || flips.Load() == 0 {
		t.Fatal("race did not run")
	}
	fx.checkOutside(t)
}

func TestReadRefusesSpecialFiles(t *testing.T) {
	requireRoot(t)
	fx := newFixture(t)
	if err := unix.Mkfifo(filepath.Join(fx.root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A character device the sandbox made: /dev/zero's numbers. Reading it
	// would never end; reading a disk's would read the host's disk.
	if err := unix.Mknod(filepath.Join(fx.root, "zero"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 5))); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/zero", filepath.Join(fx.root, "zlink")); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, p := range []string{"/fifo", "/zero", "/zlink"} {
			_, err := fx.read(t, p)
			wantKind(t, err, errdefs.ErrInvalidArgument, "ReadFile "+p)
		}
		_, err := fx.read(t, "/etc")
		wantKind(t, err, errdefs.ErrInvalidArgument, "ReadFile of a directory")
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("ReadFile of a FIFO or device hangs")
	}
	var out bytes.Buffer
	if err := fx.fs.TarOut(bg, "/", &out); err != nil {
		t.Fatal(err)
	}
	ents := untar(t, out.Bytes())
	if _, ok := ents["./fifo"]; ok {
		t.Error("TarOut stored the FIFO")
	}
	if _, ok := ents["./zero"]; ok {
		t.Error("TarOut stored the device")
	}
	if !strings.Contains(ents["comment"].body, "/zero (character device)") || !strings.Contains(ents["comment"].body, "/fifo (fifo)") {
		t.Errorf("no note of skipped files: %q", ents["comment"].body)
	}
}

func TestWriteFile(t *testing.T) {
	fx := newFixture(t)
	if err := fx.fs.WriteFile(bg, "/home/user/a.txt", strings.NewReader("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(fx.root, "home/user/a.txt")
	if b, _ := os.ReadFile(p); string(b) != "hello" {
		t.Fatalf("content %q", b)
	}
	if uid, gid, mode := statOwner(t, p); uid != 0 || gid != 0 || mode&0o7777 != 0o600 {
		t.Fatalf("owner %d:%d mode %o, want 0:0 600", uid, gid, mode&0o7777)
	}
	// Replace, with a new mode; set-ID bits dropped; no temp file left.
	if err := fx.fs.WriteFile(bg, "/home/user/a.txt", strings.NewReader("bye"), 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	if _, _, mode := statOwner(t, p); mode&0o7777 != 0o755 {
		t.Fatalf("mode %o, want 755", mode&0o7777)
	}
	if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 1 {
		t.Fatalf("left behind: %v", ents)
	}
	// Missing parents are created.
	if err := fx.fs.WriteFile(bg, "/new/deep/f", strings.NewReader("x"), 0); err != nil {
		t.Fatal(err)
	}
	if _, _, mode := statOwner(t, filepath.Join(fx.root, "new/deep/f")); mode&0o7777 != 0o644 {
		t.Fatalf("default mode %o", mode&0o7777)
	}
	// A symlink at the path is replaced, not written through.
	if err := os.Symlink("/etc/passwd", filepath.Join(fx.root, "plink")); err != nil {
		t.Fatal(err)
	}
	if err := fx.fs.WriteFile(bg, "/plink", strings.NewReader("replaced"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(fx.root, "etc/passwd")); string(b) != "sandbox passwd\n" {
		t.Fatalf("wrote through a symlink: %q", b)
	}
	if st, _ := os.Lstat(filepath.Join(fx.root, "plink")); !st.Mode().IsRegular() {
		t.Fatal("symlink not replaced")
	}
	err := fx.fs.WriteFile(bg, "/etc", strings.NewReader("x"), 0o644)
	fx.checkErr(t, err)
	wantKind(t, err, errdefs.ErrInvalidArgument, "WriteFile over a directory")
	err = fx.fs.WriteFile(bg, "/etc/passwd/x", strings.NewReader("x"), 0o644)
	fx.checkErr(t, err)
	if err == nil {
		t.Fatal("WriteFile under a file succeeded")
	}
	// Cancelled context: nothing written.
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if err := fx.fs.WriteFile(ctx, "/cancelled", strings.NewReader("x"), 0o644); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled WriteFile: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(fx.root, "cancelled")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("cancelled WriteFile created the file")
	}
	fx.checkOutside(t)
}

func TestOwnershipMapping(t *testing.T) {
	requireRoot(t)
	fx := newFixture(t, WithIDMap(100000, 200000, 65536), WithOwner(1000, 1001))
	if err := fx.fs.WriteFile(bg, "/home/user/f", strings.NewReader("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fx.fs.Mkdir(bg, "/home/user/a/b", 0o750); err != nil {
		t.Fatal(err)
	}
	if err := fx.fs.TarIn(bg, "/home/user/t", bytes.NewReader(tarOf(t, tarDir("d"), tarFile("d/f", "x"), tarLink("d/l", "f")))); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"home/user/f", "home/user/a", "home/user/a/b", "home/user/t", "home/user/t/d", "home/user/t/d/f", "home/user/t/d/l"} {
		if uid, gid, _ := statOwner(t, filepath.Join(fx.root, p)); uid != 101000 || gid != 201001 {
			t.Errorf("%s owned by %d:%d, want 101000:201001", p, uid, gid)
		}
	}
	if _, _, mode := statOwner(t, filepath.Join(fx.root, "home/user/a/b")); mode&0o7777 != 0o750 {
		t.Errorf("Mkdir mode %o", mode&0o7777)
	}
	var out bytes.Buffer
	if err := fx.fs.TarOut(bg, "/home/user/f", &out); err != nil {
		t.Fatal(err)
	}
	if e := untar(t, out.Bytes())["f"]; e.hdr == nil || e.hdr.Uid != 1000 || e.hdr.Gid != 1001 {
		t.Fatalf("TarOut owner: %+v", e.hdr)
	}
	if _, err := New(fx.root, WithIDMap(1, 1, 10), WithOwner(10, 0)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("owner outside the map: %v", err)
	}
}

func TestStatListMkdirRemove(t *testing.T) {
	fx := newFixture(t)
	st, err := fx.fs.Stat(bg, "/")
	if err != nil || !st.Mode.IsDir() || st.Name != "/" {
		t.Fatalf("Stat(/) = %+v %v", st, err)
	}
	_, err = fx.fs.Stat(bg, "/nope")
	fx.checkErr(t, err)
	wantKind(t, err, errdefs.ErrNotFound, "Stat missing")
	if err != nil && !strings.Contains(err.Error(), `"/nope"`) {
		t.Errorf("error does not name the sandbox path: %v", err)
	}
	ls, err := fx.fs.List(bg, "/")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ls {
		names = append(names, e.Name)
	}
	if got := strings.Join(names, " "); got != "climb etc etclink home hostabs loop1 loop2 sibling" {
		t.Fatalf("List(/) = %s", got)
	}
	for _, e := range ls {
		if e.Name == "hostabs" && e.Link != fx.outside {
			t.Errorf("Link of hostabs = %q (stored target, as is)", e.Link)
		}
	}
	_, err = fx.fs.List(bg, "/etc/passwd")
	wantKind(t, err, errdefs.ErrInvalidArgument, "List of a file")

	if err := fx.fs.Mkdir(bg, "/a/b/c", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := fx.fs.Mkdir(bg, "/a/b/c", 0o700); err != nil {
		t.Fatalf("Mkdir of an existing dir: %v", err)
	}
	if _, _, mode := statOwner(t, filepath.Join(fx.root, "a/b")); mode&0o777 != 0o700 {
		t.Errorf("mode %o", mode&0o777)
	}
	err = fx.fs.Mkdir(bg, "/etc/passwd/x", 0o755)
	fx.checkErr(t, err)
	wantKind(t, err, errdefs.ErrAlreadyExists, "Mkdir under a file")
	if err := fx.fs.Mkdir(bg, "/etclink/sub", 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(fx.root, "etc/sub")); err != nil {
		t.Fatalf("Mkdir through etclink: %v", err)
	}

	// A tree with links out of the root in it.
	mustWrite(t, filepath.Join(fx.root, "a/b/c/f"), []byte("x"))
	for _, l := range []string{"a/out", "a/b/c/out"} {
		if err := os.Symlink(fx.outside, filepath.Join(fx.root, l)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../../../../outside", filepath.Join(fx.root, "a/b/up")); err != nil {
		t.Fatal(err)
	}
	err = fx.fs.Remove(bg, "/a", false)
	wantKind(t, err, errdefs.ErrFailedPrecondition, "Remove non-empty")
	if err := fx.fs.Remove(bg, "/a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(fx.root, "a")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("tree not removed")
	}
	err = fx.fs.Remove(bg, "/a", true)
	wantKind(t, err, errdefs.ErrNotFound, "Remove missing")
	err = fx.fs.Remove(bg, "/", true)
	wantKind(t, err, errdefs.ErrInvalidArgument, "Remove /")
	if err := fx.fs.Remove(bg, "/etc/shadow", false); err != nil {
		t.Fatal(err)
	}
	if err := fx.fs.Remove(bg, "/etclink/sub", false); err != nil {
		t.Fatal(err)
	}
	fx.checkOutside(t)
}

func TestRootReplaced(t *testing.T) {
	fx := newFixture(t)
	if err := os.Rename(fx.root, fx.root+".old"); err != nil {
		t.Fatal(err)
	}
	mustMkdir(t, fx.root)
	_, err := fx.read(t, "/etc/passwd")
	wantKind(t, err, errdefs.ErrUnavailable, "after the root was replaced")
}

// TestWriteFilePlantedTempName: a sandbox that guessed the temporary name
// and planted a symlink there does not get WriteFile to write through it.
func TestWriteFilePlantedTempName(t *testing.T) {
	fx := newFixture(t)
	old := tempName
	tempName = func() string { return ".amber-planted.tmp" }
	t.Cleanup(func() { tempName = old })
	// Resolved on the host, this relative link is the host's marker.
	if err := os.Symlink("../outside/marker", filepath.Join(fx.root, ".amber-planted.tmp")); err != nil {
		t.Fatal(err)
	}
	err := fx.fs.WriteFile(bg, "/f", strings.NewReader("pwned"), 0o644)
	wantKind(t, err, errdefs.ErrAlreadyExists, "WriteFile with a planted temp name")
	err = fx.fs.TarIn(bg, "/", bytes.NewReader(tarOf(t, tarFile("g", "pwned"))))
	wantKind(t, err, errdefs.ErrAlreadyExists, "TarIn with a planted temp name")
	fx.checkOutside(t)
}

// TestRemoveRace swaps a directory inside a tree being removed with a
// symlink to the host directory: the walk must unlink the symlink, never
// descend through it.
func TestRemoveRace(t *testing.T) {
	fx := newFixture(t)
	tree := filepath.Join(fx.root, "t")
	var stop atomic.Bool
	var wg sync.WaitGroup
	var setup sync.Mutex // the swapper pauses while the test builds the tree
	defer func() { stop.Store(true); wg.Wait() }()
	wg.Go(func() {
		for !stop.Load() {
			setup.Lock()
			_ = unix.Renameat2(unix.AT_FDCWD, tree+"/x/sub", unix.AT_FDCWD, tree+"/x/alt", unix.RENAME_EXCHANGE)
			setup.Unlock()
		}
	})
	deadline := time.Now().Add(300 * time.Millisecond)
	n := 0
	for ; time.Now().Before(deadline); n++ {
		// Build the tree while the swapper waits (the host's own calls
		// would follow the swapped-in symlink); Remove then races it.
		setup.Lock()
		mustMkdir(t, tree+"/x/sub/a", tree+"/x/sub/b")
		mustWrite(t, tree+"/x/sub/a/f", []byte("x"))
		_ = os.Symlink(fx.outside, tree+"/x/alt")
		setup.Unlock()
		err := fx.fs.Remove(bg, "/t", true)
		fx.checkErr(t, err)
		fx.checkOutside(t)
		setup.Lock()
		if err := os.RemoveAll(tree); err != nil {
			t.Fatal(err)
		}
		setup.Unlock()
	}
	t.Logf("%d removals", n)
}

func TestTarInHardLinkToSymlink(t *testing.T) {
	fx := newFixture(t)
	// s is a symlink to the host's marker by its host path; h is a hard
	// link to s: it must be another name for the symlink, not for the file
	// the host would resolve s to.
	if err := fx.fs.TarIn(bg, "/d", bytes.NewReader(tarOf(t, tarLink("s", fx.outside+"/marker"), tarHard("h", "s")))); err != nil {
		t.Fatal(err)
	}
	st, err := os.Lstat(filepath.Join(fx.root, "d/h"))
	if err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("h is %v (%v), want a symlink", st, err)
	}
	m, _ := os.Stat(filepath.Join(fx.outside, "marker"))
	if os.SameFile(st, m) {
		t.Fatal("h is a hard link to the host's marker")
	}
	fx.checkOutside(t)
}

// TestSwapAtEveryRacePoint swaps the entry about to be used for a symlink
// to the host's outside directory (or its marker) at each point where a
// sandbox could race us — deterministically, through raceHook.
func TestSwapAtEveryRacePoint(t *testing.T) {
	fx := newFixture(t)
	fired := 0
	swap := func(point, victim, target string) {
		raceHook = func(p string, dirfd int, name string) {
			if p != point || name != victim {
				return
			}
			fired++
			_ = unix.Renameat(dirfd, name, dirfd, ".swapped-"+name)
			_ = unix.Symlinkat(target, dirfd, name)
		}
	}
	t.Cleanup(func() { raceHook = nil })

	// Remove: the subdirectory becomes a symlink to the host directory.
	mustMkdir(t, filepath.Join(fx.root, "t/sub"))
	mustWrite(t, filepath.Join(fx.root, "t/sub/f"), []byte("x"))
	swap("remove", "sub", fx.outside)
	err := fx.fs.Remove(bg, "/t", true)
	fx.checkErr(t, err)
	fx.checkOutside(t)

	// TarOut: a file, and a directory, become symlinks to the host's.
	for _, c := range []struct{ name, target string }{{"file", fx.outside + "/marker"}, {"dir", fx.outside}} {
		mustMkdir(t, filepath.Join(fx.root, "o/dir"))
		mustWrite(t, filepath.Join(fx.root, "o/file"), []byte("x"))
		swap("tarout", c.name, c.target)
		var out bytes.Buffer
		if err := fx.fs.TarOut(bg, "/o", &out); err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(out.Bytes(), fx.marker) {
			t.Fatalf("TarOut (%s swapped) returned the host marker", c.name)
		}
		raceHook = nil
		_ = os.RemoveAll(filepath.Join(fx.root, "o"))
	}

	// Mkdir: the new directory becomes a symlink to the host directory
	// before its owner and mode are set.
	swap("mkdir", "n", fx.outside)
	_ = fx.fs.Mkdir(bg, "/m/n", 0o777)
	raceHook = nil
	if st, _ := os.Stat(fx.outside); st.Mode().Perm() != 0o755 {
		t.Fatalf("host directory's mode changed to %v", st.Mode())
	}
	fx.checkOutside(t)
	if fired != 4 {
		t.Fatalf("race hook fired %d times, want 4", fired)
	}
}
