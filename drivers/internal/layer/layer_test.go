package layer

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

func requireLoop(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (loop devices, mounts)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("no /dev/loop-control")
	}
}

// makeLower builds a small template root filesystem.
func makeLower(t testing.TB) string {
	t.Helper()
	lower := filepath.Join(t.TempDir(), "rootfs")
	for _, d := range []string{"etc", "bin", "home/user"} {
		if err := os.MkdirAll(filepath.Join(lower, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(lower, "etc/hostname"), []byte("template\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return lower
}

// newLayer creates a layer and registers its Destroy and a check that
// nothing is left behind, also when the test fails.
func newLayer(t testing.TB, lower string, size int64) *Layer {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layer")
	t.Cleanup(func() {
		if err := Destroy(dir); err != nil {
			t.Errorf("cleanup: Destroy: %v", err)
		}
		assertGone(t, dir)
	})
	l, err := Create(dir, lower, size)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return l
}

// assertGone checks that dir has no mounts under it, no loop device backed
// by its image (sysfs and losetup -a), and does not exist.
func assertGone(t testing.TB, dir string) {
	t.Helper()
	mounts, err := readMounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			t.Errorf("still mounted: %s (%s)", m.point, m.fstype)
		}
	}
	img := filepath.Join(dir, imageName)
	if devs, _ := loopsBackedBy(img); len(devs) > 0 {
		t.Errorf("loop devices still backed by %s: %v", img, devs)
	}
	if out, err := exec.Command("losetup", "-a").CombinedOutput(); err == nil && strings.Contains(string(out), img) {
		t.Errorf("losetup -a still lists %s:\n%s", img, out)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists (%v)", dir, err)
	}
}

func assertMounted(t testing.TB, l *Layer) {
	t.Helper()
	mounts, err := readMounts()
	if err != nil {
		t.Fatal(err)
	}
	if !isMounted(mounts, l.Merged()) || !isMounted(mounts, l.fs()) {
		t.Fatalf("layer not mounted (merged %v, fs %v)", isMounted(mounts, l.Merged()), isMounted(mounts, l.fs()))
	}
}

func TestCreateWriteDestroy(t *testing.T) {
	requireLoop(t)
	lower := makeLower(t)
	l := newLayer(t, lower, 64<<20)
	assertMounted(t, l)
	if devs, _ := loopsBackedBy(l.image()); len(devs) != 1 {
		t.Fatalf("want one loop device for the image, got %v", devs)
	}

	// The template shows through.
	b, err := os.ReadFile(filepath.Join(l.Merged(), "etc/hostname"))
	if err != nil || string(b) != "template\n" {
		t.Fatalf("read template file through merged: %q %v", b, err)
	}
	// Writes land in upper; the template is untouched.
	if err := os.WriteFile(filepath.Join(l.Merged(), "etc/hostname"), []byte("sandbox\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.Merged(), "home/user/new"), []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(l.Merged(), "bin")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(l.Upper(), "etc/hostname")); string(b) != "sandbox\n" {
		t.Errorf("upper etc/hostname = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(l.Upper(), "home/user/new")); string(b) != "new" {
		t.Errorf("upper home/user/new = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(lower, "etc/hostname")); string(b) != "template\n" {
		t.Errorf("template changed: etc/hostname = %q", b)
	}
	if _, err := os.Stat(filepath.Join(lower, "home/user/new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("template gained home/user/new: %v", err)
	}
	if _, err := os.Stat(filepath.Join(lower, "bin")); err != nil {
		t.Errorf("template lost bin: %v", err)
	}
	// The overlay root has the template root's mode.
	st, err := os.Stat(l.Merged())
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("merged root mode %v %v", st.Mode(), err)
	}

	dir := l.Dir()
	if err := l.Destroy(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, dir)
	if err := l.Destroy(); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}
}

func TestCreateRefusesBadArguments(t *testing.T) {
	requireLoop(t)
	lower := makeLower(t)
	dir := filepath.Join(t.TempDir(), "l")
	if _, err := Create(dir, lower, 1<<20); !errdefs.IsInvalidArgument(err) {
		t.Errorf("tiny disk: %v", err)
	}
	if _, err := Create(dir, filepath.Join(lower, "nope"), 64<<20); !errdefs.IsInvalidArgument(err) {
		t.Errorf("missing lower: %v", err)
	}
	if _, err := Create(filepath.Join(t.TempDir(), "a,b"), lower, 64<<20); !errdefs.IsInvalidArgument(err) {
		t.Errorf("comma in dir: %v", err)
	}
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(full, lower, 64<<20); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("non-empty dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(full, "x")); err != nil {
		t.Errorf("Create touched an existing directory: %v", err)
	}
}

// TestDiskLimit fills the layer until ENOSPC: the filler stops at the
// limit, the image never grows past it, and the layer stays usable.
func TestDiskLimit(t *testing.T) {
	requireLoop(t)
	const size = 64 << 20
	l := newLayer(t, makeLower(t), size)

	var before unix.Statfs_t
	if err := unix.Statfs(l.Dir(), &before); err != nil {
		t.Fatal(err)
	}
	// dd if=/dev/zero of=merged/fill bs=1M, as a sandbox would.
	out, err := exec.Command("dd", "if=/dev/zero", "of="+filepath.Join(l.Merged(), "fill"), "bs=1M", "conv=fsync").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "No space left on device") {
		t.Fatalf("dd did not stop with ENOSPC: %v\n%s", err, out)
	}
	st, err := os.Stat(filepath.Join(l.Merged(), "fill"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > size || st.Size() < size*8/10 {
		t.Errorf("filler wrote %d bytes; want between 80%% and 100%% of %d", st.Size(), size)
	}
	var img unix.Stat_t
	if err := unix.Stat(l.image(), &img); err != nil {
		t.Fatal(err)
	}
	if alloc := img.Blocks * 512; alloc > size {
		t.Errorf("image allocates %d bytes on the host, more than the %d limit", alloc, size)
	}
	var after unix.Statfs_t
	if err := unix.Statfs(l.Dir(), &after); err != nil {
		t.Fatal(err)
	}
	// Other processes share the host filesystem; allow them 64 MiB of noise.
	if drop := (int64(before.Bavail) - int64(after.Bavail)) * before.Bsize; drop > size+64<<20 {
		t.Errorf("host filesystem lost %d bytes for a %d-byte layer", drop, size)
	}
	used, usable, err := l.Usage()
	if err != nil || usable > size || used < usable*9/10 {
		t.Errorf("Usage = %d/%d, %v", used, usable, err)
	}
	// Still usable after the filler is removed.
	if err := os.Remove(filepath.Join(l.Merged(), "fill")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.Merged(), "after"), []byte("ok"), 0o644); err != nil {
		t.Fatalf("write after ENOSPC: %v", err)
	}
}

// TestOpenRemounts: Open of a mounted layer does nothing; after Unmount (or
// a reboot, which also unbinds the loop device) it mounts it again with its
// content.
func TestOpenRemounts(t *testing.T) {
	requireLoop(t)
	lower := makeLower(t)
	l := newLayer(t, lower, 64<<20)
	if err := os.WriteFile(filepath.Join(l.Merged(), "keep"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(l.Dir()); err != nil {
		t.Fatalf("Open of a mounted layer: %v", err)
	}
	mounts, _ := readMounts()
	n := 0
	for _, m := range mounts {
		if m.point == l.Merged() {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("merged mounted %d times after Open, want 1", n)
	}

	for _, reboot := range []bool{false, true} {
		if err := l.Unmount(); err != nil {
			t.Fatal(err)
		}
		if err := l.Unmount(); err != nil {
			t.Fatalf("second Unmount: %v", err)
		}
		mounts, _ := readMounts()
		if isMounted(mounts, l.Merged()) || isMounted(mounts, l.fs()) {
			t.Fatal("still mounted after Unmount")
		}
		if reboot {
			if err := detachLoops(l.image(), time.Second); err != nil {
				t.Fatal(err)
			}
		}
		l2, err := Open(l.Dir())
		if err != nil {
			t.Fatalf("Open after Unmount (reboot=%v): %v", reboot, err)
		}
		assertMounted(t, l2)
		if b, err := os.ReadFile(filepath.Join(l2.Merged(), "keep")); string(b) != "kept" {
			t.Fatalf("content after remount: %q %v", b, err)
		}
		if l2.Lower() != lower || l2.DiskBytes() != 64<<20 {
			t.Errorf("Open: lower %q size %d", l2.Lower(), l2.DiskBytes())
		}
	}
	if _, err := Open(filepath.Join(t.TempDir(), "none")); !errdefs.IsNotFound(err) {
		t.Errorf("Open of nothing: %v", err)
	}
}

var createSteps = []string{"dir", "image", "loop", "mount-fs", "upper", "overlay", "meta"}

// TestCreateFailureCleansUp: a Create that fails at any step leaves nothing.
func TestCreateFailureCleansUp(t *testing.T) {
	requireLoop(t)
	lower := makeLower(t)
	for _, step := range createSteps {
		t.Run(step, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "layer")
			t.Cleanup(func() { _ = Destroy(dir) })
			boom := errors.New("injected")
			setHook(t, step, boom)
			if _, err := Create(dir, lower, 64<<20); !errors.Is(err, boom) {
				t.Fatalf("Create: %v, want the injected error", err)
			}
			assertGone(t, dir)
		})
	}
}

// TestDestroyHalfCreated: a daemon that crashes at any step of Create leaves
// a half-created layer; Open refuses it (until the commit record exists) and
// Destroy removes it.
func TestDestroyHalfCreated(t *testing.T) {
	requireLoop(t)
	lower := makeLower(t)
	for _, step := range createSteps {
		t.Run(step, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "layer")
			t.Cleanup(func() { _ = Destroy(dir) })
			setHook(t, step, errSimulatedCrash)
			if _, err := Create(dir, lower, 64<<20); !errors.Is(err, errSimulatedCrash) {
				t.Fatalf("Create: %v", err)
			}
			testHook = nil
			_, err := Open(dir)
			if step == "meta" {
				if err != nil {
					t.Fatalf("Open after the commit record: %v", err)
				}
			} else if !errdefs.IsNotFound(err) {
				t.Fatalf("Open of a half-created layer: %v, want NotFound", err)
			}
			if err := Destroy(dir); err != nil {
				t.Fatalf("Destroy: %v", err)
			}
			assertGone(t, dir)
		})
	}
}

// TestDestroyForeignLoop: a half-created layer whose image was attached the
// old way (losetup, no autoclear) and mounted, with nothing else: Destroy
// unmounts it and unbinds the device.
func TestDestroyForeignLoop(t *testing.T) {
	requireLoop(t)
	dir := filepath.Join(t.TempDir(), "layer")
	t.Cleanup(func() { _ = Destroy(dir) })
	if err := os.MkdirAll(filepath.Join(dir, fsName), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := writeImage(filepath.Join(dir, imageName), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	out, err := exec.Command("losetup", "-f", "--show", filepath.Join(dir, imageName)).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	if out, err := exec.Command("mount", dev, filepath.Join(dir, fsName)).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v %s", err, out)
	}
	if err := Destroy(dir); err != nil {
		t.Fatal(err)
	}
	assertGone(t, dir)
}

// TestDestroyBusy: while something holds a file open in the overlay,
// Unmount refuses and Destroy detaches the mounts but reports the loop
// device still in use and keeps the directory; once released, Destroy
// finishes.
func TestDestroyBusy(t *testing.T) {
	requireLoop(t)
	old := loopReleaseWait
	loopReleaseWait = 200 * time.Millisecond
	t.Cleanup(func() { loopReleaseWait = old })
	l := newLayer(t, makeLower(t), 64<<20)
	f, err := os.Create(filepath.Join(l.Merged(), "held"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := l.Unmount(); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Unmount of a busy layer: %v", err)
	}
	if err := l.Destroy(); !errdefs.IsUnavailable(err) {
		t.Fatalf("Destroy of a busy layer: %v, want Unavailable", err)
	}
	if _, err := os.Stat(l.image()); err != nil {
		t.Fatalf("Destroy removed the image while its loop device is held: %v", err)
	}
	f.Close()
	if err := l.Destroy(); err != nil {
		t.Fatalf("Destroy after release: %v", err)
	}
	assertGone(t, l.Dir())
}

func TestConcurrentCreate(t *testing.T) {
	requireLoop(t)
	lower := makeLower(t)
	const n = 12
	var wg sync.WaitGroup
	layers := make([]*Layer, n)
	errs := make([]error, n)
	base := t.TempDir()
	// The parent first: Create makes only the layer's own directory.
	if err := os.MkdirAll(filepath.Join(base, "l"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		dir := filepath.Join(base, "l", string(rune('a'+i)))
		t.Cleanup(func() {
			if err := Destroy(dir); err != nil {
				t.Error(err)
			}
			assertGone(t, dir)
		})
		wg.Go(func() {
			layers[i], errs[i] = Create(dir, lower, int64(64+i%3*32)<<20)
		})
	}
	wg.Wait()
	var devs []string
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Create %d: %v", i, errs[i])
		}
		d, _ := loopsBackedBy(layers[i].image())
		if len(d) != 1 {
			t.Fatalf("layer %d: loop devices %v", i, d)
		}
		devs = append(devs, d[0])
	}
	slices.Sort(devs)
	if len(slices.Compact(devs)) != n {
		t.Fatalf("layers share loop devices: %v", devs)
	}
}

// TestCreateTime reports Create's p50 and p95 over 20 layers (the
// prototype for the size is made once, before timing, as in a running
// daemon).
func TestCreateTime(t *testing.T) {
	requireLoop(t)
	lower := makeLower(t)
	start := time.Now()
	if _, err := prototype(1<<30 + 1<<20); err != nil { // a size no other test used
		t.Fatal(err)
	}
	t.Logf("first Create of a size formats it once (mke2fs into a memfd): %v", time.Since(start))
	if _, err := prototype(1 << 30); err != nil {
		t.Fatal(err)
	}
	var d []time.Duration
	for range 20 {
		start := time.Now()
		l := newLayer(t, lower, 1<<30)
		d = append(d, time.Since(start))
		_ = l
	}
	slices.Sort(d)
	t.Logf("Create (1 GiB layer): p50 %v, p95 %v, max %v", d[len(d)/2], d[len(d)*95/100], d[len(d)-1])
	if d[len(d)/2] > 500*time.Millisecond {
		t.Errorf("Create p50 %v: something is badly slow", d[len(d)/2])
	}
}

func setHook(t *testing.T, step string, err error) {
	t.Helper()
	testHook = func(s string) error {
		if s == step {
			return err
		}
		return nil
	}
	t.Cleanup(func() { testHook = nil })
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/a\040b`:   "/a b",
		`/a\134b`:   `/a\b`,
		`/plain`:    "/plain",
		`/trail\04`: `/trail\04`,
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestHandleLower: a lower given as a per-process handle (/proc/self/fd/N,
// as for an idmapped mount) is used for one mount; re-mounting needs a
// fresh one through Open(WithLower).
func TestHandleLower(t *testing.T) {
	requireLoop(t)
	lower := makeLower(t)
	d, err := os.Open(lower)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	handle := "/proc/self/fd/" + strconv.Itoa(int(d.Fd()))
	l := newLayer(t, handle, 64<<20)
	if b, err := os.ReadFile(filepath.Join(l.Merged(), "etc/hostname")); string(b) != "template\n" {
		t.Fatalf("through a handle lower: %q %v", b, err)
	}
	if _, err := Open(l.Dir()); err != nil {
		t.Fatalf("Open of a mounted layer needs no lower: %v", err)
	}
	if err := l.Unmount(); err != nil {
		t.Fatal(err)
	}
	if err := l.Mount(); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Mount with a used handle: %v", err)
	}
	if _, err := Open(l.Dir()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Open with a recorded handle: %v", err)
	}
	l2, err := Open(l.Dir(), WithLower(lower))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(l2.Merged(), "etc/hostname")); string(b) != "template\n" {
		t.Fatalf("after Open WithLower: %q %v", b, err)
	}
}

// TestGrow grows a mounted, in-use layer and fills it to the new limit.
func TestGrow(t *testing.T) {
	requireLoop(t)
	l := newLayer(t, makeLower(t), 64<<20)
	f, err := os.Create(filepath.Join(l.Merged(), "held")) // in use while it grows
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := l.Grow(32 << 20); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("shrink: %v", err)
	}
	const size = 320 << 20
	if !hasCap(unix.CAP_SYS_RESOURCE) {
		if err := l.Grow(size); !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Fatalf("Grow without CAP_SYS_RESOURCE: %v", err)
		}
		if st, _ := os.Stat(l.image()); st.Size() != 64<<20 {
			t.Fatalf("refused Grow changed the image to %d bytes", st.Size())
		}
		t.Skip("no CAP_SYS_RESOURCE: online ext4 resize is refused by the kernel here")
	}
	if err := l.Grow(size); err != nil {
		t.Fatal(err)
	}
	_, usable, err := l.Usage()
	if err != nil || usable < size*9/10 || usable > size {
		t.Fatalf("usable after Grow: %d (%v)", usable, err)
	}
	out, err := exec.Command("dd", "if=/dev/zero", "of="+filepath.Join(l.Merged(), "fill"), "bs=1M").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "No space left on device") {
		t.Fatalf("dd: %v %s", err, out)
	}
	if st, _ := os.Stat(filepath.Join(l.Merged(), "fill")); st.Size() < 64<<20 || st.Size() > size {
		t.Fatalf("filled %d bytes after growing to %d", st.Size(), size)
	}
	f.Close()
	if err := l.Unmount(); err != nil {
		t.Fatal(err)
	}
	l2, err := Open(l.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if l2.DiskBytes() != size {
		t.Fatalf("recorded size %d", l2.DiskBytes())
	}
	if err := l2.Unmount(); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("e2fsck", "-fn", l.image()).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck after Grow: %v\n%s", err, out)
	}
}
