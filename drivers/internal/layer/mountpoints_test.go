package layer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
)

// TestCheckMountPoints: each kind of non-directory at a mount point, or
// at one of its parents, is refused naming the path; a real directory and
// a missing one pass; a mount crossing is refused.
func TestCheckMountPoints(t *testing.T) {
	root := t.TempDir()
	host := t.TempDir()
	for _, d := range []string{"ok", "parent/child", "var"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(host, filepath.Join(root, "abs")))        // to a host dir
	must(os.Symlink("ok", filepath.Join(root, "rel")))        // to a dir inside
	must(os.Symlink("/nowhere", filepath.Join(root, "dang"))) // dangling
	must(os.WriteFile(filepath.Join(root, "file"), nil, 0o644))
	must(unix.Mkfifo(filepath.Join(root, "fifo"), 0o644))
	must(os.Symlink(host, filepath.Join(root, "var", "tmp")))
	for _, c := range []struct{ path, want string }{
		{"/ok", ""},
		{"/parent/child", ""},
		{"/missing", ""},
		{"/ok/missing/deeper", ""},
		{"/abs", "layer: /abs is not a directory (a symlink): refusing to mount"},
		{"/rel", "layer: /rel is not a directory (a symlink): refusing to mount"},
		{"/dang", "layer: /dang is not a directory (a symlink): refusing to mount"},
		{"/file", "layer: /file is not a directory (a regular file): refusing to mount"},
		{"/fifo", "layer: /fifo is not a directory (a FIFO): refusing to mount"},
		{"/var/tmp", "layer: /var/tmp is not a directory (a symlink): refusing to mount"},
		{"/var/tmp/x", "layer: /var/tmp is not a directory (a symlink): refusing to mount"},
		{"/abs/x", "layer: /abs is not a directory (a symlink): refusing to mount"},
		{"/file/x", "layer: /file is not a directory (a regular file): refusing to mount"},
	} {
		err := CheckMountPoints(root, c.path)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.path, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !errorsIsPrecondition(err)):
			t.Errorf("%s: %v; want %q (FailedPrecondition)", c.path, err, c.want)
		}
	}
	for _, bad := range []string{"tmp", "/", "/a/../b", "/a//b", "/./a"} {
		if err := CheckMountPoints(root, bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v, want InvalidArgument", bad, err)
		}
	}
	// Another filesystem mounted at a mount point is refused too.
	mnt := filepath.Join(root, "ok")
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	if err := CheckMountPoints(root, "/ok"); err == nil || !strings.Contains(err.Error(), "/ok is another mount") {
		t.Errorf("a mount at /ok: %v", err)
	}
}

func errorsIsPrecondition(err error) bool {
	return strings.Contains(err.Error(), errdefs.ErrFailedPrecondition.Error())
}

// TestBindMountPointSwap: the bind is of the directory that was checked,
// by descriptor. Replacing the name afterwards with a symlink to a host
// directory (what the files API could do between a check by name and a
// runtime's mount) changes nothing at the bind's target; the bind is
// nosuid,nodev; and a name that is a symlink when the bind is made is
// refused, with nothing mounted.
func TestBindMountPointSwap(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount)")
	}
	root := t.TempDir()
	host := t.TempDir()
	target := filepath.Join(t.TempDir(), "src")
	for _, d := range []string{filepath.Join(root, "tmp"), target} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "tmp", "layer-file"), []byte("layer"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(host, "host-secret"), []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := BindMountPoint(root, "/tmp", target); err != nil {
		t.Fatal(err)
	}
	defer UnbindMountPoint(target)
	// The swap: /tmp renamed away, a symlink to the host directory in
	// its place.
	if err := os.Rename(filepath.Join(root, "tmp"), filepath.Join(root, "old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(root, "tmp")); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(target)
	if err != nil || len(ents) != 1 || ents[0].Name() != "layer-file" {
		t.Fatalf("bind target after the swap holds %v (%v); want the layer's layer-file only", ents, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		t.Fatal(err)
	}
	if st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 {
		t.Errorf("bind flags %#x, want nosuid,nodev", st.Flags)
	}
	if err := UnbindMountPoint(target); err != nil {
		t.Fatal(err)
	}
	// Now /tmp is the symlink: refused, nothing mounted.
	err = BindMountPoint(root, "/tmp", target)
	if err == nil || !strings.Contains(err.Error(), "layer: /tmp is not a directory (a symlink): refusing to mount") {
		t.Fatalf("bind of a symlinked /tmp: %v", err)
	}
	if ents, _ := os.ReadDir(target); len(ents) != 0 {
		t.Errorf("target holds %v after a refused bind", ents)
	}
	if err := UnbindMountPoint(target); err != nil {
		t.Errorf("unbind of nothing: %v", err)
	}
}
