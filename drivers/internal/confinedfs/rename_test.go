package confinedfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

// TestRename: a file, over a file, a directory; refusals with the
// contract's kinds; symlinks that point or climb out are resolved inside
// the root; a parent swapped for a symlink to the host after it was
// resolved changes nothing.
func TestRename(t *testing.T) {
	fx := newFixture(t)
	r := func(p string) string { return filepath.Join(fx.root, p) }
	mustMkdir(t, r("a/d/x"), r("a/e"))
	mustWrite(t, r("a/f"), []byte("one"))
	mustWrite(t, r("a/h"), []byte("two"))
	for _, c := range [][2]string{{"/a/f", "/a/g"}, {"/a/h", "/a/g"}, {"/a/e", "/e2"}} {
		if err := fx.fs.Rename(bg, c[0], c[1]); err != nil {
			t.Fatalf("Rename(%s, %s): %v", c[0], c[1], err)
		}
	}
	if b, _ := os.ReadFile(r("a/g")); string(b) != "two" {
		t.Fatalf("after a rename over a file: %q", b)
	}
	if st, err := os.Stat(r("e2")); err != nil || !st.IsDir() {
		t.Fatalf("renamed directory: %v", err)
	}
	for _, c := range []struct {
		from, to string
		kind     error
	}{
		{"/a/no-such", "/a/x", errdefs.ErrNotFound},
		{"a/g", "/a/x", errdefs.ErrInvalidArgument},
		{"/a/g", "../x", errdefs.ErrInvalidArgument},
		{"/a/g", "/../../x", errdefs.ErrInvalidArgument},
		{"/", "/x", errdefs.ErrInvalidArgument},
		{"/a/g", "/", errdefs.ErrInvalidArgument},
		{"/e2", "/a/d", errdefs.ErrFailedPrecondition}, // over a non-empty directory
		{"/a/g", "/a/d", errdefs.ErrInvalidArgument},   // a file over a directory
		{"/a/d", "/a/d/x/in", errdefs.ErrInvalidArgument},
		{"/hostabs/marker", "/stolen", errdefs.ErrNotFound}, // the host's path, inside the root: nothing there
		{"/a/g", "/hostabs/planted", errdefs.ErrNotFound},
		{"/a/g", "/sibling/planted", errdefs.ErrNotFound},
		{"/loop1/x", "/a/x", errdefs.ErrInvalidArgument},
	} {
		err := fx.fs.Rename(bg, c.from, c.to)
		fx.checkErr(t, err)
		wantKind(t, err, c.kind, "Rename "+c.from+" → "+c.to)
	}
	// A relative symlink that climbs above the root lands at the root.
	if err := fx.fs.Rename(bg, "/a/g", "/climb/g-at-root"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(r("g-at-root")); string(b) != "two" {
		t.Fatalf("rename through a climbing symlink: %q", b)
	}
	// A symlink itself is renamed, not its target.
	if err := fx.fs.Rename(bg, "/hostabs", "/hostabs2"); err != nil {
		t.Fatal(err)
	}
	if l, err := os.Readlink(r("hostabs2")); err != nil || l != fx.outside {
		t.Fatalf("renamed symlink: %q %v", l, err)
	}
	fx.checkOutside(t)

	// The target's parent becomes a symlink to the host directory after
	// it was resolved: the rename goes into the directory resolved.
	mustMkdir(t, r("p"))
	raceHook = func(point string, dirfd int, name string) {
		if point == "rename" {
			_ = os.Rename(r("p"), r("p-swapped"))
			_ = os.Symlink(fx.outside, r("p"))
		}
	}
	t.Cleanup(func() { raceHook = nil })
	err := fx.fs.Rename(bg, "/g-at-root", "/p/moved")
	raceHook = nil
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(r("p-swapped/moved")); err != nil {
		t.Fatalf("the rename did not go into the resolved directory: %v", err)
	}
	fx.checkOutside(t)
	var st unix.Stat_t
	if unix.Lstat(filepath.Join(fx.outside, "moved"), &st) == nil {
		t.Fatal("the rename reached the host directory")
	}
}
