package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amber-run/amber/internal/enginetest"
)

// TestE2ETemplateImport: a rootfs tarball imported with `amber template
// import` while the daemon runs is usable at once; importing it again is a
// no-op; bad input is refused with a clear error.
func TestE2ETemplateImport(t *testing.T) {
	bin, dir := e2eSetup(t)
	src, _ := filepath.Glob(filepath.Join(enginetest.Cache(), "templates", "minimal-*", "rootfs"))
	if len(src) == 0 {
		t.Fatal("no minimal template (run `make setup`)")
	}
	name := fmt.Sprintf("e2e_%d", os.Getpid())
	t.Cleanup(func() {
		m, _ := filepath.Glob(filepath.Join(enginetest.Cache(), "templates", name+"-imported-*"))
		for _, p := range m {
			os.RemoveAll(p)
		}
	})
	// The tarball: the minimal rootfs plus a marker file.
	work := t.TempDir()
	tarPath := filepath.Join(work, "rootfs.tar")
	marker := "imported-" + name
	os.MkdirAll(filepath.Join(work, "extra/etc"), 0o755)
	os.WriteFile(filepath.Join(work, "extra/etc/amber-marker"), []byte(marker+"\n"), 0o644)
	for _, args := range [][]string{
		{"-C", src[len(src)-1], "-cf", tarPath, "."},
		{"-C", filepath.Join(work, "extra"), "-rf", tarPath, "./etc/amber-marker"},
	} {
		if out, err := exec.Command("tar", args...).CombinedOutput(); err != nil {
			t.Fatalf("tar %v: %v %s", args, err, out)
		}
	}

	d := startDaemon(t, bin, dir, freeAddr(t))
	out := d.must("template", "import", name, tarPath)
	if !strings.Contains(out, "imported") {
		t.Fatalf("import said %q", out)
	}
	if out := d.must("template", "import", name, tarPath); !strings.Contains(out, "already there") {
		t.Fatalf("second import of the same tarball said %q", out)
	}
	if out := d.must("template", "ls"); !strings.Contains(out, name) {
		t.Fatalf("template ls does not list %s: %q", name, out)
	}
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", name))
	if got := d.must("exec", id, "--", "cat", "/etc/amber-marker"); strings.TrimSpace(got) != marker {
		t.Fatalf("the sandbox from the imported template reads %q, want %q", got, marker)
	}
	d.must("sandbox", "rm", id)

	if _, errs, code := d.amber("template", "import", "Bad-Name", tarPath); code == 0 || !strings.Contains(errs, "template name") {
		t.Errorf("a bad name: exit %d, %q", code, errs)
	}
	garbage := filepath.Join(work, "garbage.tar")
	os.WriteFile(garbage, []byte("not a tarball"), 0o644)
	if _, errs, code := d.amber("template", "import", name+"x", garbage); code == 0 || !strings.Contains(errs, "does not extract") {
		t.Errorf("garbage: exit %d, %q", code, errs)
	}
}
