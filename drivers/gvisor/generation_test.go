package gvisor

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/core/sandbox/sandboxtest"
	"github.com/amber-run/amber/drivers/internal/confinedfs"
)

// TestRestoreGeneration0Image: a checkpoint of a sandbox made with the
// spec of older drivers (generation 0: no NoNewPrivileges, /tmp bound
// "rbind,rw") restores with that spec, which runsc's restore validation
// demands, its /tmp still bound by descriptor; execs in it get
// no_new_privs all the same. (A real image made by the driver before
// generation 1 was restored this way by hand: see the issue 18 notes.)
func TestRestoreGeneration0Image(t *testing.T) {
	runsc := requireHost(t)
	tmpl := minimalTemplate(t)
	ctx := context.Background()
	d := newTestDriver(t, runsc, "/amber/gvisor-gen")
	createSpecVersion = 0
	t.Cleanup(func() { createSpecVersion = specVersion })
	id := fmt.Sprintf("gen0-%d", os.Getpid())
	spec := sandbox.Spec{ID: id, Template: tmpl}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	mustSh(t, d, id, `echo gen0-memory > /dev/shm/v; echo gen0-layer > /tmp/f`)
	imageDir := filepath.Join(t.TempDir(), "image")
	if _, err := d.Checkpoint(ctx, id, imageDir, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	createSpecVersion = specVersion
	// Another node: a fresh state directory.
	d2 := newTestDriver(t, runsc, "/amber/gvisor-gen2")
	if _, err := d2.Restore(ctx, spec, imageDir, sandbox.RestoreOptions{}); err != nil {
		t.Fatalf("restore of a generation 0 image: %v", err)
	}
	t.Cleanup(func() { _ = d2.Destroy(context.Background(), id) })
	out := mustSh(t, d2, id, `cat /dev/shm/v /tmp/f; grep NoNewPrivs /proc/1/status /proc/self/status`)
	for _, want := range []string{"gen0-memory", "gen0-layer", "/proc/1/status:NoNewPrivs:\t0", "/proc/self/status:NoNewPrivs:\t1"} {
		if !strings.Contains(out, want) {
			t.Errorf("restored generation 0 sandbox: %q lacks %q", out, want)
		}
	}
}

// TestGeneration1KeepsShInit: a sandbox of generation 1 (the sh init, as
// every sandbox and checkpoint made before the agent) still runs its
// commands with runsc exec, starts and waits for background processes, and
// checkpoints and restores as it did; it has no output ring (Output is
// ErrFailedPrecondition). A restore keeps the generation.
//
//	go test -tags seccomp -count=1 -run TestGeneration1KeepsShInit -v ./drivers/gvisor
func TestGeneration1KeepsShInit(t *testing.T) {
	runsc := requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d := newTestDriver(t, runsc, "/amber/gvisor-gen1")
	createSpecVersion = 1
	t.Cleanup(func() { createSpecVersion = specVersion })
	id := fmt.Sprintf("gen1-%d", os.Getpid())
	spec := sandbox.Spec{ID: id, Template: minimalTemplate(t)}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	createSpecVersion = specVersion
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	if out := mustSh(t, d, id, "cat /proc/1/cmdline | tr '\\000' ' '"); !strings.HasPrefix(out, "/bin/sh -c trap") {
		t.Fatalf("generation 1 init: %q", out)
	}
	pid, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "while [ ! -e /tmp/go ]; do sleep 0.1; done; exit 4"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Output(ctx, id, pid, 0, false, func(sandbox.OutputFrame) error { return nil }); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Output in a generation 1 sandbox: %v, want ErrFailedPrecondition", err)
	}
	image := filepath.Join(t.TempDir(), "image")
	if _, err := d.Checkpoint(ctx, id, image, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Restore(ctx, spec, image, sandbox.RestoreOptions{}); err != nil {
		t.Fatalf("restore of a generation 1 image: %v", err)
	}
	rec, err := d.loadRecord(id)
	if err != nil || rec.SpecVersion != 1 || rec.AgentBuild != "" {
		t.Fatalf("restored record: %+v %v", rec, err)
	}
	ps, err := d.Processes(ctx, id)
	if err != nil || !slices.ContainsFunc(ps, func(p sandbox.Process) bool { return p.PID == 1 }) || !slices.ContainsFunc(ps, func(p sandbox.Process) bool { return p.PID == pid }) {
		t.Errorf("Processes after the restore: %+v %v; want the sh init and %d", ps, err, pid)
	}
	mustSh(t, d, id, "touch /tmp/go")
	if st, err := d.Wait(ctx, id, pid); err != nil || st.Code != 4 {
		t.Errorf("Wait after the restore: %+v %v", st, err)
	}
	if err := d.Signal(ctx, id, 99999, syscall.SIGTERM); !errdefs.IsNotFound(err) {
		t.Errorf("Signal to no process: %v", err)
	}
	if n := d.runscCalls("exec"); n == 0 {
		t.Errorf("no runsc exec in a generation 1 sandbox: it did not take the old path")
	}
	checkHostSideFiles(t, d, id)
}

// checkHostSideFiles: a sandbox of the sh init's generations has its files
// served host-side (confinedfs over its layer), as before the agent.
func checkHostSideFiles(t *testing.T, d *Driver, id string) {
	t.Helper()
	fs, err := d.Files(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fs.(*confinedfs.FS); !ok {
		t.Errorf("the files of a sandbox without the agent are a %T, want the host-side confinedfs", fs)
	}
	sandboxtest.HostSideFiles(t, fs, func(script string) string { return mustSh(t, d, id, script) })
}

// TestRestoreNeedsTheAgentBuild: an image whose agent build this node does
// not keep is refused with ErrFailedPrecondition before the stopped
// sandbox is touched; the image restores once the build is there.
func TestRestoreNeedsTheAgentBuild(t *testing.T) {
	runsc := requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d := newTestDriver(t, runsc, "/amber/gvisor-agentbuild")
	id := fmt.Sprintf("agentbuild-%d", os.Getpid())
	spec := sandbox.Spec{ID: id, Template: minimalTemplate(t)}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	mustSh(t, d, id, "echo kept > /dev/shm/v")
	image := filepath.Join(t.TempDir(), "image")
	if _, err := d.Checkpoint(ctx, id, image, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	meta, err := readImageMeta(image)
	if err != nil || meta.SpecVersion != specVersion || meta.AgentBuild != d.agentBuild || meta.AgentToken == "" {
		t.Fatalf("image meta: %+v %v", meta, err)
	}
	b, _ := os.ReadFile(filepath.Join(image, imageMetaName))
	other := "sha256:" + strings.Repeat("0", 64)
	if err := os.WriteFile(filepath.Join(image, imageMetaName), []byte(strings.ReplaceAll(string(b), meta.AgentBuild, other)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = d.Restore(ctx, spec, image, sandbox.RestoreOptions{})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), other) {
		t.Fatalf("restore with an agent build this node lacks: %v, want ErrFailedPrecondition naming it", err)
	}
	t.Logf("refused as it must: %v", err)
	if err := os.WriteFile(filepath.Join(image, imageMetaName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Restore(ctx, spec, image, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if out := mustSh(t, d, id, "cat /dev/shm/v"); out != "kept\n" {
		t.Errorf("after the restore: %q", out)
	}
	rb, err := d.RuntimeBuild(ctx)
	if err != nil || !strings.HasSuffix(rb, " agent "+d.agentBuild) {
		t.Errorf("RuntimeBuild = %q, %v; want the agent build in it", rb, err)
	}
}

// TestRestoreImageOfOldDriver restores an image that the driver before the
// agent made (the sh init, generation 1; testdata/gen1-image.txt says how):
// its background process is back and counting, its layer is there, and
// Exec, Start and Wait work (through runsc exec, as before). The image maps
// the template's busybox: on a host whose minimal template has another
// busybox the test is skipped, and on a CPU that lacks features of the one
// the fixture was cut on. AMBER_GVISOR_OLD_IMAGE names another image
// directory of the same kind.
//
//	go test -tags seccomp -count=1 -run TestRestoreImageOfOldDriver -v ./drivers/gvisor
func TestRestoreImageOfOldDriver(t *testing.T) {
	const busybox = "3d9f2889d6782537624a4e1a10e68a2ddd53e0ee8bac02676f27308f42ec6bf6"
	image := os.Getenv("AMBER_GVISOR_OLD_IMAGE")
	if image == "" {
		if sum := fileSHA256(t, filepath.Join(minimalTemplate(t).RootFS, "bin", "busybox")); sum != busybox {
			t.Skipf("SKIPPED: the minimal template's busybox is %s, the fixture's %s", sum, busybox)
		}
		image = extractTarGz(t, "testdata/gen1-image.tar.gz")
	}
	runsc := requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := newTestDriver(t, runsc, "/amber/gvisor-oldimage")
	spec := sandbox.Spec{ID: "oldimg", Template: minimalTemplate(t)}
	if _, err := d.Restore(ctx, spec, image, sandbox.RestoreOptions{}); err != nil {
		if strings.Contains(err.Error(), "incompatible FeatureSet") {
			// The fixture was cut on a CPU with features this one lacks
			// (gVisor refuses it, as the engine's cpu_features check
			// would): it proves nothing here.
			_ = d.Destroy(context.Background(), "oldimg")
			t.Skipf("SKIPPED: this CPU cannot run the fixture's image: %v", err)
		}
		t.Fatalf("restore of the old driver's image: %v", err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), "oldimg") })
	ps, err := d.Processes(ctx, "oldimg")
	if err != nil {
		t.Fatal(err)
	}
	counter := 0
	for _, p := range ps {
		if len(p.Args) == 3 && strings.Contains(p.Args[2], `echo "$R $i"`) {
			counter = p.PID
		}
	}
	if counter == 0 || !slices.ContainsFunc(ps, func(p sandbox.Process) bool { return p.PID == 1 && p.Args[0] == "/bin/sh" }) {
		t.Fatalf("processes after the restore: %+v", ps)
	}
	r := strings.TrimSpace(mustSh(t, d, "oldimg", "cat /dev/shm/r"))
	log1 := mustSh(t, d, "oldimg", fmt.Sprintf("tail -n1 %s/%d.log", procLogDir, counter))
	time.Sleep(500 * time.Millisecond)
	log2 := mustSh(t, d, "oldimg", fmt.Sprintf("tail -n1 %s/%d.log", procLogDir, counter))
	if !strings.HasPrefix(log1, r+" ") || !strings.HasPrefix(log2, r+" ") || log1 == log2 {
		t.Errorf("the counter after the restore: %q then %q (its value %s)", log1, log2, r)
	}
	if out := mustSh(t, d, "oldimg", "cat /root/f"); out != "layer\n" {
		t.Errorf("layer: %q", out)
	}
	pid, err := d.Start(ctx, "oldimg", sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "exit 9"}})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := d.Wait(ctx, "oldimg", pid); err != nil || st.Code != 9 {
		t.Errorf("Wait: %+v %v", st, err)
	}
	checkHostSideFiles(t, d, "oldimg")
	t.Logf("restored the old driver's image: counter %d at %q, runsc exec %d", counter, strings.TrimSpace(log2), d.runscCalls("exec"))
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// extractTarGz unpacks a fixture (regular files and directories only)
// into a new temporary directory.
func extractTarGz(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o700)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, b, 0o600)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
