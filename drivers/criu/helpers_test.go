package criu

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

func TestMain(m *testing.M) {
	// The test binary is its own container init (see InitIfRequested).
	InitIfRequested()
	os.Exit(m.Run())
}

// requireHost skips unless the test can create real sandboxes: root, and a
// binary built with -tags seccomp (the driver refuses to run without it).
func requireHost(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("criu driver tests need root")
	}
	if !seccompSupported {
		t.Skip("SKIPPED: built without -tags seccomp; the criu driver refuses to run unfiltered. Run: go test -tags seccomp ./drivers/criu")
	}
}

var (
	templateOnce sync.Once
	templateDir  string
	templateErr  error
)

// minimalRootfs returns a busybox rootfs: the one `make setup` builds
// (scripts/setup/busybox.sh) or, when it is missing, one built here from
// Debian's busybox-static into a directory that lives for the test binary's
// run.
func minimalRootfs(t testing.TB) string {
	t.Helper()
	templateOnce.Do(func() {
		cache := os.Getenv("AMBER_CACHE")
		if cache == "" {
			cache = "/var/cache/amber"
		}
		if m, _ := filepath.Glob(filepath.Join(cache, "templates", "minimal-*", "rootfs", "bin", "busybox")); len(m) > 0 {
			sort.Strings(m)
			templateDir = filepath.Dir(filepath.Dir(m[len(m)-1]))
			return
		}
		templateDir, templateErr = buildBusyboxRootfs()
	})
	if templateErr != nil {
		t.Fatalf("minimal rootfs: %v (run `make setup-minimal`, or apt-get install busybox-static)", templateErr)
	}
	return templateDir
}

func buildBusyboxRootfs() (string, error) {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "amber-criu-rootfs-")
	if err != nil {
		return "", err
	}
	r := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "root", "tmp", "run"} {
		if err := os.MkdirAll(filepath.Join(r, d), 0o755); err != nil {
			return "", err
		}
	}
	_ = os.Chmod(filepath.Join(r, "tmp"), 0o1777)
	data, err := os.ReadFile(bb)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(r, "bin", "busybox"), data, 0o755); err != nil {
		return "", err
	}
	out, err := exec.Command(bb, "--list-full").Output()
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		p := sc.Text()
		if p == "" || p == "bin/busybox" {
			continue
		}
		_ = os.MkdirAll(filepath.Join(r, filepath.Dir(p)), 0o755)
		_ = os.Symlink("/bin/busybox", filepath.Join(r, p))
	}
	_ = os.WriteFile(filepath.Join(r, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	return r, nil
}

// testDriver is a driver with its own state directory, run directory and
// cgroup parent, all removed (and checked for leftovers) when the test ends.
type testDriver struct {
	*Driver
	t      testing.TB
	state  string
	runDir string
	parent string
}

func newTestDriver(t testing.TB) *testDriver {
	t.Helper()
	requireHost(t)
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	td := &testDriver{
		t:      t,
		state:  t.TempDir(), // private (0700): the driver must not need more
		runDir: "/run/amber-criu-test/" + hex.EncodeToString(suffix),
		parent: "/amber/criu-test-" + hex.EncodeToString(suffix),
	}
	d, err := New(td.options())
	if err != nil {
		t.Fatal(err)
	}
	td.Driver = d
	t.Cleanup(td.cleanup)
	return td
}

// options are the Options of td's driver, for a second driver over the
// same state (a restarted daemon).
func (td *testDriver) options() Options {
	return Options{StateDir: td.state, RunDir: td.runDir, CgroupParent: td.parent}
}

// cleanup destroys every sandbox left and fails the test when any mount,
// cgroup or state survives Destroy.
func (td *testDriver) cleanup() {
	t := td.t
	ctx := context.Background()
	infos, err := td.List(ctx)
	if err != nil {
		t.Errorf("cleanup: list: %v", err)
	}
	for _, info := range infos {
		if err := td.Destroy(ctx, info.ID); err != nil {
			t.Errorf("cleanup: destroy %s: %v", info.ID, err)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if bytes.Contains(mounts, []byte(td.state)) {
		t.Errorf("cleanup: mounts left under %s:\n%s", td.state, grepLines(string(mounts), td.state))
	}
	for _, ctrl := range []string{"memory", "cpu", "pids", "freezer", "devices", "cpuset", "blkio", "cpuacct", "systemd", "unified"} {
		dir := filepath.Join("/sys/fs/cgroup", ctrl, td.parent)
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.IsDir() {
				t.Errorf("cleanup: cgroup left: %s/%s", dir, e.Name())
			}
		}
		_ = os.Remove(dir)
	}
	for _, sub := range []string{"runc", "sandboxes", "slots"} {
		ents, _ := os.ReadDir(filepath.Join(td.state, sub))
		for _, e := range ents {
			t.Errorf("cleanup: state left: %s/%s/%s", td.state, sub, e.Name())
		}
	}
	// The agent's copies (agentBinary) are the node's, not a sandbox's.
	_ = os.RemoveAll(filepath.Join(td.runDir, ".agents"))
	if bytes.Contains(mounts, []byte(td.runDir)) {
		t.Errorf("cleanup: mounts left under %s:\n%s", td.runDir, grepLines(string(mounts), td.runDir))
	}
	if ents, _ := os.ReadDir(td.runDir); len(ents) > 0 {
		t.Errorf("cleanup: %d entries left in %s", len(ents), td.runDir)
	}
	_ = os.Remove(td.runDir)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

var idSeq struct {
	sync.Mutex
	n int
}

func newID(prefix string) string {
	idSeq.Lock()
	defer idSeq.Unlock()
	idSeq.n++
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), idSeq.n)
}

func (td *testDriver) create(limits sandbox.Limits) string {
	td.t.Helper()
	id := newID("t")
	_, err := td.Create(context.Background(), sandbox.Spec{
		ID:       id,
		Template: sandbox.Template{Name: "minimal", RootFS: minimalRootfs(td.t)},
		Limits:   limits,
	})
	if err != nil {
		td.t.Fatalf("create: %v", err)
	}
	return id
}

// run executes a command and returns its stdout, stderr and status.
func (td *testDriver) run(id string, args ...string) (string, string, sandbox.ExitStatus) {
	td.t.Helper()
	var out, errb bytes.Buffer
	st, err := td.Exec(context.Background(), id, sandbox.ExecSpec{Args: args, Stdout: &out, Stderr: &errb, Timeout: time.Minute})
	if err != nil {
		td.t.Fatalf("exec %q: %v", args, err)
	}
	return out.String(), errb.String(), st
}

// sh runs a shell script that must succeed and returns its stdout.
func (td *testDriver) sh(id, script string) string {
	td.t.Helper()
	out, errs, st := td.run(id, "/bin/sh", "-c", script)
	if st.Code != 0 {
		td.t.Fatalf("sh -c %q: exit %+v\nstdout: %s\nstderr: %s", script, st, out, errs)
	}
	return out
}
