package layer

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestXattrsReadsOwnAttributesNotLinkTargets(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lsetxattr(f, "user.amber", []byte("v1"), 0); err != nil {
		t.Skipf("this filesystem takes no user xattrs: %v", err)
	}
	got, err := Xattrs(f)
	if err != nil || got["user.amber"] != "v1" {
		t.Fatalf("Xattrs(f) = %v, %v", got, err)
	}
	l := filepath.Join(dir, "l")
	if err := os.Symlink(f, l); err != nil {
		t.Fatal(err)
	}
	got, err = Xattrs(l)
	if err != nil || got["user.amber"] != "" {
		t.Fatalf("Xattrs followed the symlink: %v, %v", got, err)
	}
}
