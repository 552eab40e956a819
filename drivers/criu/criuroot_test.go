package criu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/sandbox"
	"golang.org/x/sys/unix"
)

// TestDestroyAfterCutOffRestore: a restore a daemon kill cut off leaves
// libcontainer's bind mount of the rootfs at <state>/criu-root. Destroy
// (the start-up reconcile's, or a later restore's clearForRestore) takes
// it down and succeeds; before, RemoveAll met EBUSY, the destroy failed,
// and every later restore of the sandbox was refused (chaos seed 9501,
// criu: "destroy half-created sandbox: unlinkat …/criu-root: device or
// resource busy").
func TestDestroyAfterCutOffRestore(t *testing.T) {
	td := newTestDriver(t)
	ctx := context.Background()
	id := "sbx-criuroot"
	if _, err := td.Create(ctx, sandbox.Spec{ID: id, Template: sandbox.Template{RootFS: minimalRootfs(t)}}); err != nil {
		t.Fatal(err)
	}
	// What the cut-off restore left: the bind mount, twice stacked.
	root := filepath.Join(td.runc, id, "criu-root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	for i := 0; i < 2; i++ {
		if err := unix.Mount(src, root, "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind mount: %v", err)
		}
	}
	t.Cleanup(func() { unmountCriuRoot(root) })
	if err := td.Destroy(ctx, id); err != nil {
		t.Fatalf("destroy with a leftover criu-root mount: %v", err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), root) {
		t.Fatalf("criu-root still mounted after the destroy")
	}
	if _, err := os.Stat(filepath.Join(td.runc, id)); !os.IsNotExist(err) {
		t.Fatalf("state directory left: %v", err)
	}
}
