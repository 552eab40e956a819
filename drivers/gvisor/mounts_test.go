package gvisor

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/sandbox"
)

// The mount points of a sandbox's layer (issue 18, item 2): /tmp was bound
// into the sandbox as rootfs+"/tmp", a host path through a name the tenant
// controls; a /tmp made a symlink (through Files, then kept by a
// checkpoint) made runsc mount the host directory it named.
//
//	go test -count=1 -run 'TestOCISpec|Refuses|TestNoNewPrivs|TestLayerMountFlags' -v ./drivers/gvisor

// symlinkedTmpErr is what Create and Restore say of a layer whose /tmp is a
// symlink.
const symlinkedTmpErr = "layer: /tmp is not a directory (a symlink): refusing to mount"

// hostMarker makes a host directory outside /tmp holding a file "marker"
// with a random secret; it returns the directory and the secret.
func hostMarker(t *testing.T) (string, string) {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "amber-marker-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b := make([]byte, 8)
	rand.Read(b)
	secret := "host-secret-" + hex.EncodeToString(b)
	if err := os.WriteFile(filepath.Join(dir, "marker"), []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, secret
}

// dirNames lists dir.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// hostMounts returns the mounts in the host's /proc/self/mountinfo that
// concern the test, as "root mount-point": mount points under any of dirs,
// and mounts of a directory under any of dirs (the mount's root). Other
// tests on the machine mount elsewhere; these are ours alone. (Options are
// left out: a restore mounts the layer's overlay again.)
func hostMounts(t *testing.T, dirs ...string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) < 5 {
			continue
		}
		root, point := fl[3], fl[4]
		for _, d := range dirs {
			if point == d || strings.HasPrefix(point, d+"/") || root == d || strings.HasPrefix(root, d+"/") {
				out = append(out, root+" "+point)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// treeDigest hashes every file's name, mode and content under dir.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := de.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %v %d\n", p, fi.Mode(), fi.Size())
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(h, f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// symlinkTmp makes the sandbox's /tmp a symlink to the host directory
// marker through the host-side files API, as a tenant can (the files of a
// stopped sandbox, or of one without the agent; a running sandbox's agent
// refuses, /tmp being a mount point there): the same path is made inside
// the layer too, so the link also resolves inside the root (the old driver
// created its keep file through it).
func symlinkTmp(t *testing.T, d *Driver, id, marker string) {
	t.Helper()
	ctx := context.Background()
	fsys, _, err := d.hostFiles(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := fsys.Remove(ctx, "/tmp", true); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	rel := strings.TrimPrefix(marker, "/") + "/in-layer"
	for _, h := range []*tar.Header{
		{Name: rel, Typeflag: tar.TypeReg, Mode: 0o644, Size: 2},
		{Name: "tmp", Typeflag: tar.TypeSymlink, Linkname: marker, Mode: 0o777},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte("x\n"))
		}
	}
	tw.Close()
	if err := fsys.TarIn(ctx, "/", &buf); err != nil {
		t.Fatal(err)
	}
	fi, err := fsys.Stat(ctx, "/tmp")
	if err != nil || fi.Mode&os.ModeSymlink == 0 {
		t.Fatalf("/tmp after the tar: %+v %v", fi, err)
	}
}

// fixTmpInImage rewrites the image's layer.tar with its "tmp" entry (a
// symlink) made a directory again, as a repaired import would; the memory
// image is untouched.
func fixTmpInImage(t *testing.T, imageDir string) {
	t.Helper()
	p := filepath.Join(imageDir, imageLayerName)
	in, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	tr := tar.NewReader(bytes.NewReader(in))
	tw := tar.NewWriter(&out)
	fixed := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if path.Clean(strings.TrimPrefix(h.Name, "./")) == "tmp" {
			h.Typeflag, h.Linkname, h.Mode, h.Name = tar.TypeDir, "", 0o1777, strings.TrimSuffix(h.Name, "/")+"/"
			fixed = true
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if !fixed {
		t.Fatal("layer.tar has no tmp entry")
	}
	if err := os.WriteFile(p, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreRefusesSymlinkedMountPoint: a tenant makes /tmp a symlink to
// a host directory through the files API; the sandbox is stopped by a
// checkpoint (an idle stop) whose layer keeps the link; the restore must
// neither show the host directory in the sandbox nor mount it anywhere: it
// is refused naming /tmp, the image and the host's mounts unchanged, and
// the same checkpoint restores once its /tmp is a directory again.
func TestRestoreRefusesSymlinkedMountPoint(t *testing.T) {
	runsc := requireHost(t)
	tmpl := minimalTemplate(t)
	ctx := context.Background()
	d := newTestDriver(t, runsc, "/amber/gvisor-mnt")
	marker, secret := hostMarker(t)
	id := fmt.Sprintf("symtmp-%d", os.Getpid())
	spec := sandbox.Spec{ID: id, Template: tmpl}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	// A value held only in the sandbox's memory (/dev/shm is its tmpfs):
	// a restore that shows it is a restore of this checkpoint.
	mustSh(t, d, id, `od -An -N8 -tx8 /dev/urandom | tr -d ' ' > /dev/shm/value`)
	value := strings.TrimSpace(mustSh(t, d, id, `cat /dev/shm/value`))
	symlinkTmp(t, d, id, marker)

	imageDir := filepath.Join(t.TempDir(), "image")
	if _, err := d.Checkpoint(ctx, id, imageDir, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	digest := treeDigest(t, imageDir)
	mounts := hostMounts(t, d.opts.StateDir, marker)

	_, err := d.Restore(ctx, spec, imageDir, sandbox.RestoreOptions{})
	if err == nil {
		out, _ := sh(d, id, `ls -A /tmp; cat /tmp/marker`)
		t.Fatalf("restore of a layer whose /tmp links to host %s succeeded; the sandbox's /tmp holds %q (the host's secret is %q)", marker, out, secret)
	}
	if !strings.Contains(err.Error(), symlinkedTmpErr) {
		t.Fatalf("restore: %v; want an error saying %q", err, symlinkedTmpErr)
	}
	t.Logf("refused: %v", err)
	if got := hostMounts(t, d.opts.StateDir, marker); !slices.Equal(got, mounts) {
		t.Errorf("host mounts changed by the refused restore:\nbefore %q\nafter  %q", mounts, got)
	}
	if got := treeDigest(t, imageDir); got != digest {
		t.Error("the refused restore changed the checkpoint image")
	}
	if names := dirNames(t, marker); !slices.Equal(names, []string{"marker"}) {
		t.Errorf("host marker directory now holds %q", names)
	}
	if info, err := d.Inspect(ctx, id); err == nil && info.State == sandbox.StateRunning {
		t.Errorf("sandbox runs after a refused restore: %+v", info)
	}

	// The same checkpoint, its /tmp a directory again.
	fixTmpInImage(t, imageDir)
	if _, err := d.Restore(ctx, spec, imageDir, sandbox.RestoreOptions{}); err != nil {
		t.Fatalf("restore with /tmp a directory: %v", err)
	}
	if got := strings.TrimSpace(mustSh(t, d, id, `cat /dev/shm/value`)); got != value {
		t.Errorf("restored memory holds %q, want %q", got, value)
	}
	if out, err := sh(d, id, `cat /tmp/marker 2>&1; echo x > /tmp/written`); strings.Contains(out, secret) || err != nil {
		t.Errorf("after the repaired restore: %q %v", out, err)
	}
	if names := dirNames(t, marker); !slices.Equal(names, []string{"marker"}) {
		t.Errorf("host marker directory now holds %q", names)
	}
	if got := hostMounts(t, d.opts.StateDir, marker); !slices.Equal(got, mounts) {
		t.Errorf("host mounts after a restore: the driver's bind of /tmp was left:\nbefore %q\nafter  %q", mounts, got)
	}
}

// copyTree copies a template with cp -a (owners, modes, links).
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v %s", err, out)
	}
	return dst
}

// TestCreateRefusesSymlinkedMountPoint: a template whose /tmp is a symlink
// to a host directory is refused at Create the same way (naming /tmp,
// nothing mounted, nothing left).
func TestCreateRefusesSymlinkedMountPoint(t *testing.T) {
	runsc := requireHost(t)
	tmpl := minimalTemplate(t)
	ctx := context.Background()
	d := newTestDriver(t, runsc, "/amber/gvisor-mnt")
	marker, secret := hostMarker(t)
	root := copyTree(t, tmpl.RootFS)
	if err := os.RemoveAll(filepath.Join(root, "tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, marker), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(marker, filepath.Join(root, "tmp")); err != nil {
		t.Fatal(err)
	}
	mounts := hostMounts(t, d.opts.StateDir, marker)
	id := fmt.Sprintf("symtmpc-%d", os.Getpid())
	_, err := d.Create(ctx, sandbox.Spec{ID: id, Template: sandbox.Template{Name: "symlinked-tmp", Version: "test", RootFS: root}})
	if err == nil {
		t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
		out, _ := sh(d, id, `ls -A /tmp; cat /tmp/marker`)
		t.Fatalf("create on a template whose /tmp links to host %s succeeded; the sandbox's /tmp holds %q (the host's secret is %q)", marker, out, secret)
	}
	if !strings.Contains(err.Error(), symlinkedTmpErr) {
		t.Fatalf("create: %v; want an error saying %q", err, symlinkedTmpErr)
	}
	if got := hostMounts(t, d.opts.StateDir, marker); !slices.Equal(got, mounts) {
		t.Errorf("host mounts changed by the refused create:\nbefore %q\nafter  %q", mounts, got)
	}
	if names := dirNames(t, marker); !slices.Equal(names, []string{"marker"}) {
		t.Errorf("host marker directory now holds %q", names)
	}
	if left := d.leftovers(id); len(left) > 0 {
		t.Errorf("a refused create left %v", left)
	}
}

// TestNoNewPrivs: every process of a sandbox runs with no_new_privs, the
// init's children (Start) and execs alike, so no set-uid binary or file
// capability in the layer can raise a process's privileges. (runsc's
// --allow-suid=false ignores set-id bits on its own as well; the flag
// holds whatever runsc's defaults become.)
func TestNoNewPrivs(t *testing.T) {
	runsc := requireHost(t)
	tmpl := minimalTemplate(t)
	ctx := context.Background()
	d := newTestDriver(t, runsc, "/amber/gvisor-nnp")
	id := fmt.Sprintf("nnp-%d", os.Getpid())
	if _, err := d.Create(ctx, sandbox.Spec{ID: id, Template: tmpl}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	if out := mustSh(t, d, id, `grep NoNewPrivs /proc/self/status`); !strings.Contains(out, "NoNewPrivs:\t1") {
		t.Errorf("exec: %q, want NoNewPrivs 1", out)
	}
	if out := mustSh(t, d, id, `grep NoNewPrivs /proc/1/status`); !strings.Contains(out, "NoNewPrivs:\t1") {
		t.Errorf("init: %q, want NoNewPrivs 1", out)
	}
	pid, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "grep NoNewPrivs /proc/self/status > /dev/shm/nnp"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Wait(ctx, id, pid); err != nil {
		t.Fatal(err)
	}
	if out := mustSh(t, d, id, `cat /dev/shm/nnp`); !strings.Contains(out, "NoNewPrivs:\t1") {
		t.Errorf("started process: %q, want NoNewPrivs 1", out)
	}
}

// TestLayerMountFlags: the layer's mounts on the host are nosuid,nodev.
func TestLayerMountFlags(t *testing.T) {
	runsc := requireHost(t)
	tmpl := minimalTemplate(t)
	ctx := context.Background()
	d := newTestDriver(t, runsc, "/amber/gvisor-mnt")
	id := fmt.Sprintf("mflags-%d", os.Getpid())
	if _, err := d.Create(ctx, sandbox.Spec{ID: id, Template: tmpl}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	checkMountFlags(t, filepath.Join(d.layerDir(id), "fs"), filepath.Join(d.layerDir(id), "merged"))
}

// checkMountFlags checks that each of points is a mount with nosuid and
// nodev in the host's mount table.
func checkMountFlags(t *testing.T, points ...string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range points {
		found := false
		for line := range strings.Lines(string(b)) {
			f := strings.Fields(line)
			if len(f) < 6 || f[4] != p {
				continue
			}
			found = true
			if opts := strings.Split(f[5], ","); !slices.Contains(opts, "nosuid") || !slices.Contains(opts, "nodev") {
				t.Errorf("mount %s has options %s, want nosuid,nodev", p, f[5])
			}
		}
		if !found {
			t.Errorf("%s is not mounted", p)
		}
	}
}
