package gvisor

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/core/sandbox/sandboxtest"
)

// TestConformance runs the driver conformance suite against the real runsc
// and the busybox template.
//
//	go test -count=1 -run TestConformance -v ./drivers/gvisor
func TestConformance(t *testing.T) {
	runsc := requireHost(t)
	tmpl := minimalTemplate(t)
	stateDir := testStateDir(t)
	cgParent := testCgroupParent(t, "/amber/gvisor-test")
	var (
		mu      sync.Mutex
		drivers []*Driver
	)
	newDriver := func(t *testing.T) sandbox.Driver {
		d, err := New(Options{StateDir: stateDir, RunscPath: runsc, CgroupParent: cgParent, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		drivers = append(drivers, d)
		mu.Unlock()
		return d
	}
	probe, err := New(Options{StateDir: stateDir, RunscPath: runsc, CgroupParent: cgParent})
	if err != nil {
		t.Fatal(err)
	}
	sandboxtest.Run(t, newDriver, sandboxtest.Options{
		MinimalTemplate: tmpl,
		CPUUsage: func(id string) (time.Duration, error) {
			ns, err := readCgroupInt("cpuacct", probe.cgroupPath(id), "cpuacct.usage")
			return time.Duration(ns), err
		},
		Leftovers: probe.leftovers,
	})
	// Every sandbox of the suite has the agent as its init: no command
	// of Exec, Start, Processes, Signal or Wait was a runsc exec.
	mu.Lock()
	defer mu.Unlock()
	execs, forwards := 0, 0
	for _, d := range drivers {
		execs += d.runscCalls("exec")
		forwards += d.runscCalls("port-forward")
	}
	t.Logf("runsc invocations of the suite's %d drivers: exec %d, port-forward %d", len(drivers), execs, forwards)
	if execs != 0 {
		t.Errorf("the conformance suite ran runsc exec %d times; want 0 (every command goes through the agent)", execs)
	}
}

// leftovers lists what the driver keeps on the host for id.
func (d *Driver) leftovers(id string) []string {
	var out []string
	for _, p := range []string{d.dir(id), d.netnsPath(id)} {
		if _, err := os.Lstat(p); err == nil {
			out = append(out, p)
		}
	}
	if d.runtimeStateExists(id) {
		out = append(out, "runsc state for "+id+" under "+d.root)
	}
	for _, p := range cgroupDirs(d.cgroupPath(id)) {
		out = append(out, "cgroup "+p)
	}
	return out
}

// requireHost skips unless the test can run real sandboxes; it returns the
// runsc to use.
func requireHost(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("gvisor driver tests need root")
	}
	runsc := os.Getenv("AMBER_RUNSC")
	if runsc == "" {
		cache := os.Getenv("AMBER_CACHE")
		if cache == "" {
			cache = "/var/cache/amber"
		}
		runsc = filepath.Join(cache, "bin", "runsc")
	}
	if _, err := os.Stat(runsc); err != nil {
		t.Skipf("SKIPPED: %s missing; run `make setup` (scripts/setup/runsc.sh)", runsc)
	}
	return runsc
}

// testStateDir is a state directory that is cleaned after the test,
// including the network namespace runsc pins under its root.
func testStateDir(t testing.TB) string {
	dir := t.TempDir()
	t.Cleanup(func() { unmountAll(dir) })
	return dir
}

// testCgroupParent returns a cgroup parent of this test process's own
// (parent-<pid>), removed after the test.
func testCgroupParent(t testing.TB, parent string) string {
	parent = fmt.Sprintf("%s-%d", parent, os.Getpid())
	t.Cleanup(func() {
		if err := removeCgroup(parent); err != nil {
			t.Errorf("cgroup parent %s: %v", parent, err)
		}
	})
	return parent
}

func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

var (
	templateOnce sync.Once
	templateDir  string
	templateErr  error
)

// minimalTemplate returns the busybox template `make setup` builds
// (scripts/setup/busybox.sh) or, when it is missing, one built here from
// Debian's busybox-static for the test binary's run.
func minimalTemplate(t testing.TB) sandbox.Template {
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
		t.Skipf("SKIPPED: no minimal template (%v); run `make setup`", templateErr)
	}
	return sandbox.Template{Name: "minimal", Version: "test", RootFS: templateDir}
}

func buildBusyboxRootfs() (string, error) {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return "", fmt.Errorf("busybox-static not installed: %w", err)
	}
	root, err := os.MkdirTemp("", "amber-gvisor-rootfs-")
	if err != nil {
		return "", err
	}
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "root", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		return "", err
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), b, 0o755); err != nil {
		return "", err
	}
	out, err := exec.Command(bb, "--list-full").Output()
	if err != nil {
		return "", err
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "bin/busybox" {
			continue
		}
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			return "", err
		}
		_ = os.Symlink("/bin/busybox", filepath.Join(root, p))
	}
	return root, os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
}

// TestBenchmark measures cold create, exec round trip and idle memory. It
// runs only with AMBER_GVISOR_BENCH=1:
//
//	AMBER_GVISOR_BENCH=1 go test -count=1 -run TestBenchmark -v ./drivers/gvisor
func TestBenchmark(t *testing.T) {
	if os.Getenv("AMBER_GVISOR_BENCH") != "1" {
		t.Skip("set AMBER_GVISOR_BENCH=1 to run")
	}
	runsc := requireHost(t)
	tmpl := minimalTemplate(t)
	d, err := New(Options{StateDir: testStateDir(t), RunscPath: runsc, CgroupParent: testCgroupParent(t, "/amber/gvisor-bench"), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n := 20
	if v, err := strconv.Atoi(os.Getenv("AMBER_GVISOR_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	var ids []string
	t.Cleanup(func() {
		for _, id := range ids {
			if err := d.Destroy(context.Background(), id); err != nil {
				t.Errorf("destroy %s: %v", id, err)
			}
		}
	})
	var creates []time.Duration
	for i := range n {
		id := fmt.Sprintf("bench-%d-%d", os.Getpid(), i)
		ids = append(ids, id)
		start := time.Now()
		if _, err := d.Create(ctx, sandbox.Spec{ID: id, Template: tmpl}); err != nil {
			t.Fatal(err)
		}
		creates = append(creates, time.Since(start))
	}
	var execs []time.Duration
	for range 50 {
		start := time.Now()
		st, err := d.Exec(ctx, ids[0], sandbox.ExecSpec{Args: []string{"true"}})
		if err != nil || st.Code != 0 {
			t.Fatalf("exec: %+v %v", st, err)
		}
		execs = append(execs, time.Since(start))
	}
	time.Sleep(5 * time.Second) // let the sandboxes settle to idle
	var cgMem, rss, pss int64
	for _, id := range ids {
		m, err := readCgroupInt("memory", d.cgroupPath(id), "memory.usage_in_bytes")
		if err != nil {
			t.Fatal(err)
		}
		cgMem += m
		for _, pid := range cgroupProcs(d.cgroupPath(id)) {
			r, p := smapsRollup(pid)
			rss += r
			pss += p
		}
	}
	raw := rawRunscBaseline(t, runsc, tmpl.RootFS, 10)
	k := int64(len(ids))
	t.Logf("cold Create (%d sequential): p50 %v, p99 %v, min %v, max %v", n, pct(creates, 50), pct(creates, 99), pct(creates, 0), pct(creates, 100))
	t.Logf("raw runsc in the same run (10): `runsc run --detach` of a bare bundle p50 %v, `runsc exec true` p50 %v, `runsc --version` p50 %v",
		pct(raw.run, 50), pct(raw.exec, 50), pct(raw.version, 50))
	t.Logf("Exec round trip of `true` (50): p50 %v, p99 %v", pct(execs, 50), pct(execs, 99))
	t.Logf("idle memory per sandbox (%d sandboxes): memory cgroup usage %.1f MiB, host processes' RSS %.1f MiB, PSS %.1f MiB",
		k, float64(cgMem/k)/(1<<20), float64(rss/k)/(1<<20), float64(pss/k)/(1<<20))
}

func pct(ds []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s) - 1) * p / 100
	return s[i].Round(100 * time.Microsecond)
}

// smapsRollup returns the Rss and Pss (bytes) of pid.
func smapsRollup(pid int) (rss, pss int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Rss:":
			rss = v << 10
		case "Pss:":
			pss = v << 10
		}
	}
	return rss, pss
}

type rawTimes struct{ run, exec, version []time.Duration }

// rawRunscBaseline times runsc alone, for comparison: a bare bundle (the
// template's rootfs read-only, no network, no cgroup limits, no layer),
// `runsc run --detach`, one `runsc exec true`, and `runsc --version` (the
// cost of starting the runsc binary at all).
func rawRunscBaseline(t *testing.T, runsc, rootfs string, n int) rawTimes {
	dir := testStateDir(t)
	root := filepath.Join(dir, "root")
	bundle := filepath.Join(dir, "bundle")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`{"ociVersion":"1.2.1","process":{"args":["/bin/sh","-c","while :; do sleep 3600; done"],"cwd":"/","env":["PATH=/bin:/usr/bin"]},
"root":{"path":%q,"readonly":true},"mounts":[{"destination":"/proc","type":"proc","source":"proc"}],
"linux":{"namespaces":[{"type":"pid"},{"type":"network"},{"type":"ipc"},{"type":"uts"},{"type":"mount"}]}}`, rootfs)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var r rawTimes
	for i := range n {
		id := fmt.Sprintf("raw-%d-%d", os.Getpid(), i)
		start := time.Now()
		t.Cleanup(func() { _ = exec.Command(runsc, "--root="+root, "delete", "--force", id).Run() })
		// stdio /dev/null: the sandbox's init inherits it (a pipe would
		// never see EOF).
		logFile := filepath.Join(dir, id+".log")
		if err := exec.Command(runsc, "--root="+root, "--log="+logFile, "--platform=systrap", "--network=none", "run", "--detach", "--bundle="+bundle, id).Run(); err != nil {
			t.Fatalf("raw runsc run: %v %q", err, logMessages(logFile))
		}
		r.run = append(r.run, time.Since(start))
		start = time.Now()
		if out, err := exec.Command(runsc, "--root="+root, "exec", id, "/bin/true").CombinedOutput(); err != nil {
			t.Fatalf("raw runsc exec: %v %s", err, out)
		}
		r.exec = append(r.exec, time.Since(start))
		if out, err := exec.Command(runsc, "--root="+root, "delete", "--force", id).CombinedOutput(); err != nil {
			t.Fatalf("raw runsc delete: %v %s", err, out)
		}
		start = time.Now()
		if err := exec.Command(runsc, "--version").Run(); err != nil {
			t.Fatal(err)
		}
		r.version = append(r.version, time.Since(start))
	}
	return r
}
