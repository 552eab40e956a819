package criu

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/sandbox"
)

// Issue 18: the layer's mounts and the sandbox's root are nosuid,nodev; the
// default uid ranges stay clear of /etc/subuid's.
//
//	go test -count=1 -run 'TestRootfsMountFlags|TestNoNewPrivsEverywhere|TestDefaultUIDRangeAvoidsSubuid|TestCreateRefusesSymlinkedMountPoint' -v ./drivers/criu

// mountOpts returns the options of the mount at point in mountinfo text.
func mountOpts(mountinfo, point string) (string, bool) {
	for line := range strings.Lines(mountinfo) {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == point {
			return f[5], true
		}
	}
	return "", false
}

func hasNosuidNodev(opts string) bool {
	o := strings.Split(opts, ",")
	return slices.Contains(o, "nosuid") && slices.Contains(o, "nodev")
}

// TestRootfsMountFlags: the layer's image and overlay, the bind the
// sandbox's root is, and "/" inside the sandbox are all nosuid,nodev, so a
// set-id file or a device node in the layer (written by the tenant, or
// restored from a checkpoint) is inert on the host and inside.
func TestRootfsMountFlags(t *testing.T) {
	td := newTestDriver(t)
	id := td.create(sandbox.Limits{})
	host, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(td.layerDir(id), "fs"), filepath.Join(td.layerDir(id), "merged"), td.rootfsPath(id)} {
		opts, ok := mountOpts(string(host), p)
		if !ok {
			t.Errorf("%s is not mounted", p)
		} else if !hasNosuidNodev(opts) {
			t.Errorf("host mount %s: %s, want nosuid,nodev", p, opts)
		}
	}
	inside := td.sh(id, "cat /proc/self/mountinfo")
	if opts, ok := mountOpts(inside, "/"); !ok || !hasNosuidNodev(opts) {
		t.Errorf("the sandbox's / : %q %v, want nosuid,nodev\n%s", opts, ok, inside)
	}
}

// TestNoNewPrivsEverywhere: the init, an exec and a started process all run
// with no_new_privs.
func TestNoNewPrivsEverywhere(t *testing.T) {
	td := newTestDriver(t)
	id := td.create(sandbox.Limits{})
	for _, p := range []string{"/proc/self/status", "/proc/1/status"} {
		if out := td.sh(id, "grep NoNewPrivs "+p); !strings.Contains(out, "NoNewPrivs:\t1") {
			t.Errorf("%s: %q", p, out)
		}
	}
	ctx := context.Background()
	pid, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "grep NoNewPrivs /proc/self/status > /nnp"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := td.Wait(ctx, id, pid); err != nil {
		t.Fatal(err)
	}
	if out := td.sh(id, "cat /nnp"); !strings.Contains(out, "NoNewPrivs:\t1") {
		t.Errorf("started process: %q", out)
	}
}

// TestDefaultUIDRangeAvoidsSubuid: the default uid ranges lie clear of
// every range useradd hands out with the default login.defs
// (100000..600100000+65535, the first user's 100000–165535 among them),
// of the ranges in this host's /etc/subuid and /etc/subgid, and below 2^31.
func TestDefaultUIDRangeAvoidsSubuid(t *testing.T) {
	d := plainDriver(t, Options{})
	lo, hi := d.opts.UIDBase, d.opts.UIDBase+d.opts.MaxSandboxes*idsPerSandbox // [lo, hi)
	overlaps := func(a, b int) bool { return a < hi && lo < b }
	if overlaps(100000, 600100000+65536) {
		t.Errorf("default uid ranges [%d, %d) overlap useradd's subordinate ids (100000..600165535)", lo, hi)
	}
	if hi > 1<<31 {
		t.Errorf("default uid ranges end at %d, above 2^31", hi)
	}
	for _, f := range []string{"/etc/subuid", "/etc/subgid"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			p := strings.Split(strings.TrimSpace(line), ":")
			var start, n int
			if len(p) != 3 || !scanInt(p[1], &start) || !scanInt(p[2], &n) {
				continue
			}
			if overlaps(start, start+n) {
				t.Errorf("default uid ranges [%d, %d) overlap %s: %s", lo, hi, f, line)
			}
		}
	}
}

func scanInt(s string, v *int) bool {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
	}
	*v = n
	return s != ""
}

// TestCreateRefusesSymlinkedMountPoint: a template whose /proc is a
// symlink is refused at Create, naming it, and nothing is left.
func TestCreateRefusesSymlinkedMountPoint(t *testing.T) {
	td := newTestDriver(t)
	root := filepath.Join(t.TempDir(), "rootfs")
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	src := minimalRootfs(t)
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == "proc" {
			continue
		}
		if err := os.Symlink(filepath.Join(src, e.Name()), filepath.Join(root, "link-"+e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc", filepath.Join(root, "proc")); err != nil {
		t.Fatal(err)
	}
	id := newID("symproc")
	_, err = td.Create(context.Background(), sandbox.Spec{ID: id, Template: sandbox.Template{Name: "symproc", RootFS: root}})
	const want = "layer: /proc is not a directory (a symlink): refusing to mount"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("create: %v; want an error saying %q", err, want)
	}
	if _, err := td.Inspect(context.Background(), id); err == nil {
		t.Errorf("a refused create left sandbox %s", id)
	}
}

// plainDriver is a driver with the defaults of opts, for tests that make
// no sandbox (no host check).
func plainDriver(t *testing.T, opts Options) *Driver {
	t.Helper()
	opts.StateDir = t.TempDir()
	opts.RunDir = filepath.Join("/run/amber-criu-test", filepath.Base(opts.StateDir)+"-"+strings.ReplaceAll(t.Name(), "/", "-"))
	t.Cleanup(func() { os.Remove(opts.RunDir) })
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// addLinkToImage rewrites the image's layer.tar with a symlink name →
// target appended, as a crafted or imported layer would carry; it returns
// the original archive for putting back.
func addLinkToImage(t *testing.T, imageDir, name, target string) []byte {
	t.Helper()
	p := filepath.Join(imageDir, imageLayerName)
	orig, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	tr := tar.NewReader(bytes.NewReader(orig))
	tw := tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777, Format: tar.FormatPAX}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return orig
}

// TestRestoreRefusesSymlinkedMountPoint: a checkpoint whose layer makes
// /dev a symlink (to /etc: the tmpfs /dev would be mounted over the
// sandbox's /etc) is refused at restore, naming /dev, the image unchanged
// and nothing left running; the same checkpoint with its layer as cut
// restores.
func TestRestoreRefusesSymlinkedMountPoint(t *testing.T) {
	td := newTestDriver(t)
	ctx := context.Background()
	id := td.create(sandbox.Limits{})
	td.sh(id, "echo kept > /root-file")
	images := filepath.Join(t.TempDir(), "image")
	if _, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	orig := addLinkToImage(t, images, "dev", "/etc")
	tarred, err := os.ReadFile(filepath.Join(images, imageLayerName))
	if err != nil {
		t.Fatal(err)
	}
	spec := sandbox.Spec{ID: id, Template: sandbox.Template{Name: "minimal", RootFS: minimalRootfs(t)}}
	_, err = td.Restore(ctx, spec, images, sandbox.RestoreOptions{})
	const want = "layer: /dev is not a directory (a symlink): refusing to mount"
	if err == nil {
		out, _, _ := td.run(id, "/bin/sh", "-c", "ls -A /etc; readlink /dev")
		t.Fatalf("restore of a layer whose /dev links to /etc succeeded; /etc holds %q", out)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("restore: %v; want an error saying %q", err, want)
	}
	if now, _ := os.ReadFile(filepath.Join(images, imageLayerName)); !bytes.Equal(now, tarred) {
		t.Error("the refused restore changed the image's layer")
	}
	if info, err := td.Inspect(ctx, id); err == nil && info.State == sandbox.StateRunning {
		t.Errorf("sandbox runs after a refused restore: %+v", info)
	}
	if err := os.WriteFile(filepath.Join(images, imageLayerName), orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := td.Restore(ctx, spec, images, sandbox.RestoreOptions{}); err != nil {
		t.Fatalf("restore of the checkpoint as cut: %v", err)
	}
	if out := td.sh(id, "cat /root-file"); out != "kept\n" {
		t.Errorf("restored layer: %q", out)
	}
}
