package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/engine/enginetest"
)

// releaseTarball writes the minimal rootfs plus /etc/amber-marker reading
// marker (with a pinned file time: a reproducible build) as a tarball.
func releaseTarball(t *testing.T, marker string) string {
	t.Helper()
	src, _ := filepath.Glob(filepath.Join(enginetest.Cache(), "templates", "minimal-*", "rootfs"))
	if len(src) == 0 {
		t.Fatal("no minimal template (run `make setup`)")
	}
	work := t.TempDir()
	tarPath := filepath.Join(work, "rootfs.tar")
	os.MkdirAll(filepath.Join(work, "extra/etc"), 0o755)
	os.WriteFile(filepath.Join(work, "extra/etc/amber-marker"), []byte(marker+"\n"), 0o644)
	os.Chtimes(filepath.Join(work, "extra/etc/amber-marker"), time.Unix(1700000000, 0), time.Unix(1700000000, 0))
	for _, args := range [][]string{
		{"-C", src[len(src)-1], "-cf", tarPath, "."},
		{"-C", filepath.Join(work, "extra"), "-rf", tarPath, "./etc/amber-marker"},
	} {
		if out, err := exec.Command("tar", args...).CombinedOutput(); err != nil {
			t.Fatalf("tar %v: %v %s", args, err, out)
		}
	}
	return tarPath
}

// TestE2ETemplateImport: a rootfs tarball imported with `amber template
// import` while the daemon runs is usable at once; importing it again is a
// no-op; bad input is refused with a clear error.
func TestE2ETemplateImport(t *testing.T) {
	bin, dir := e2eSetup(t)
	name := fmt.Sprintf("e2e_%d", os.Getpid())
	marker := "imported-" + name
	tarPath := releaseTarball(t, marker)

	d := startDaemon(t, bin, dir, freeAddr(t))
	out := d.must("template", "import", name, tarPath)
	if !strings.Contains(out, "imported: sha256:") {
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

	// build: a build's output directory (rootfs + template.json defaults).
	bdir := t.TempDir()
	if out, err := exec.Command("tar", "-C", bdir, "--one-top-level=rootfs", "-xf", tarPath).CombinedOutput(); err != nil {
		t.Fatalf("unpack: %v %s", err, out)
	}
	os.WriteFile(filepath.Join(bdir, "template.json"), []byte(`{"cwd":"/tmp","env":["PATH=/bin:/usr/bin","BUILT=yes"]}`), 0o644)
	if out := d.must("template", "build", name+"_b", bdir); !strings.Contains(out, "imported: sha256:") {
		t.Fatalf("build said %q", out)
	}
	if out := d.must("template", "build", name+"_b", bdir); !strings.Contains(out, "already there") {
		t.Fatalf("rebuild of the same directory said %q", out)
	}
	var bv struct {
		Cwd string   `json:"cwd"`
		Env []string `json:"env"`
	}
	if err := json.Unmarshal([]byte(d.must("template", "inspect", name+"_b")), &bv); err != nil || bv.Cwd != "/tmp" {
		t.Fatalf("inspect of the built version: %+v %v", bv, err)
	}
	bid := strings.TrimSpace(d.must("sandbox", "create", "--template", name+"_b"))
	if got := d.must("exec", bid, "--", "sh", "-c", "pwd; echo $BUILT; cat /etc/amber-marker"); got != "/tmp\nyes\n"+marker+"\n" {
		t.Fatalf("a sandbox of the built template: %q", got)
	}
	d.must("sandbox", "rm", bid)

	if _, errs, code := d.amber("template", "import", "Bad-Name", tarPath); code == 0 || !strings.Contains(errs, "template name") {
		t.Errorf("a bad name: exit %d, %q", code, errs)
	}
	garbage := filepath.Join(t.TempDir(), "garbage.tar")
	os.WriteFile(garbage, []byte("not a tarball"), 0o644)
	if _, errs, code := d.amber("template", "import", name+"x", garbage); code == 0 || !strings.Contains(errs, "does not extract") {
		t.Errorf("garbage: exit %d, %q", code, errs)
	}
}

// TestE2ETemplateVersions: through the CLI, a checkpoint cut on version 1
// restores on version 1 after the template moved to version 2; version 1
// cannot be removed while referenced; a sandbox upgraded to version 2 keeps
// its files; inspect shows the version and its references.
func TestE2ETemplateVersions(t *testing.T) {
	bin, dir := e2eSetup(t)
	d := startDaemon(t, bin, dir, freeAddr(t))
	name := "e2ever"
	d.must("template", "import", name, releaseTarball(t, "one"))
	var v1 struct {
		Digest    string   `json:"digest"`
		Sandboxes []string `json:"sandboxes"`
	}
	if err := json.Unmarshal([]byte(d.must("template", "inspect", name)), &v1); err != nil || !strings.HasPrefix(v1.Digest, "sha256:") {
		t.Fatalf("inspect: %+v %v", v1, err)
	}
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", name))
	d.must("exec", id, "--", "sh", "-c", "echo mine > /root/file")
	out, errs, code := d.amber("checkpoint", "--json", id)
	if code != 0 {
		t.Fatalf("checkpoint: %s %s", out, errs)
	}
	var ck struct {
		ID string `json:"id"`
	}
	json.Unmarshal([]byte(out), &ck)

	if out := d.must("template", "import", name, releaseTarball(t, "two")); !strings.Contains(out, "tag moved from "+v1.Digest) {
		t.Fatalf("import of version 2 said %q", out)
	}
	if _, errs, code := d.amber("template", "rm", name+"@"+v1.Digest); code == 0 || !strings.Contains(errs, "still referenced") || !strings.Contains(errs, id) {
		t.Fatalf("rm of a referenced version: exit %d %q", code, errs)
	}
	if out := d.must("template", "inspect", name+"@"+v1.Digest); !strings.Contains(out, id) || !strings.Contains(out, ck.ID) {
		t.Fatalf("inspect of version 1 does not name its references: %s", out)
	}

	d.must("exec", id, "--", "sh", "-c", "echo later > /root/file")
	d.must("restore", ck.ID)
	if got := d.must("exec", id, "--", "cat", "/etc/amber-marker", "/root/file"); got != "one\nmine\n" {
		t.Fatalf("restored sandbox reads %q, want version 1's marker and its own file", got)
	}
	fresh := strings.TrimSpace(d.must("sandbox", "create", "--template", name))
	if got := d.must("exec", fresh, "--", "cat", "/etc/amber-marker"); got != "two\n" {
		t.Fatalf("a new sandbox reads %q", got)
	}

	up := strings.TrimSpace(d.must("sandbox", "upgrade", id, "--template", name))
	if up == id || !strings.HasPrefix(up, "sbx-") {
		t.Fatalf("upgrade printed %q", up)
	}
	if got := d.must("exec", up, "--", "cat", "/etc/amber-marker", "/root/file"); got != "two\nmine\n" {
		t.Fatalf("upgraded sandbox reads %q", got)
	}
	if ev := d.must("sandbox", "events", up); !strings.Contains(ev, "sandbox.upgraded") {
		t.Fatalf("events of the upgraded sandbox: %s", ev)
	}
	if ls := d.must("template", "ls", "--all"); strings.Count(ls, name) < 2 {
		t.Fatalf("ls --all: %s", ls)
	}
}
