package criu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

func TestLifecycle(t *testing.T) {
	td := newTestDriver(t)
	ctx := context.Background()
	id := td.create(sandbox.Limits{})

	info, err := td.Inspect(ctx, id)
	if err != nil || info.State != sandbox.StateRunning || info.InitPID == 0 {
		t.Fatalf("inspect after create: %+v %v", info, err)
	}
	if _, err := td.Create(ctx, sandbox.Spec{ID: id, Template: sandbox.Template{RootFS: minimalRootfs(t)}}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second create of %s: %v, want already exists", id, err)
	}

	// stdout, stderr, exit code, stdin, env, cwd
	var out, errb bytes.Buffer
	st, err := td.Exec(ctx, id, sandbox.ExecSpec{
		Args:   []string{"/bin/sh", "-c", `echo "out:$FOO:$(pwd)"; echo err >&2; cat; exit 3`},
		Env:    []string{"FOO=bar"},
		Cwd:    "/tmp",
		Stdin:  strings.NewReader("from-stdin\n"),
		Stdout: &out, Stderr: &errb,
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Code != 3 || out.String() != "out:bar:/tmp\nfrom-stdin\n" || errb.String() != "err\n" {
		t.Fatalf("exec: %+v stdout=%q stderr=%q", st, out.String(), errb.String())
	}
	// Identity inside: root in its own namespaces, hostname = id.
	if got := strings.TrimSpace(td.sh(id, "id -u; hostname")); got != "0\n"+id {
		t.Fatalf("id/hostname: %q", got)
	}
	// The sandbox's root is an unprivileged host uid, and the rootfs is
	// writable by it (the template is not).
	td.sh(id, "echo hi > /file && mkdir -p /run/x && cat /file")
	hostUID := td.hostIDOf(id)
	if hostUID < DefaultUIDBase {
		t.Fatalf("sandbox root is host uid %d", hostUID)
	}
	fi, err := os.Stat(filepath.Join(td.layerDir(id), "merged", "file"))
	if err != nil || int(fi.Sys().(*syscall.Stat_t).Uid) != hostUID {
		t.Fatalf("file written by sandbox root: %v owner %v, want host uid %d", err, fi.Sys().(*syscall.Stat_t).Uid, hostUID)
	}
	if _, err := os.Stat(filepath.Join(minimalRootfs(t), "file")); err == nil {
		t.Fatal("write reached the template")
	}

	list, err := td.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != id || list[0].State != sandbox.StateRunning {
		t.Fatalf("list: %+v %v", list, err)
	}

	// Kill: processes gone, layer kept.
	if _, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"sleep", "1000"}}); err != nil {
		t.Fatal(err)
	}
	if err := td.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	info, err = td.Inspect(ctx, id)
	if err != nil || info.State != sandbox.StateStopped {
		t.Fatalf("inspect after kill: %+v %v", info, err)
	}
	if ps, err := td.Processes(ctx, id); err != nil || len(ps) != 0 {
		t.Fatalf("processes after kill: %+v %v", ps, err)
	}
	if _, err := os.Stat(filepath.Join(td.layerDir(id), "merged", "file")); err != nil {
		t.Fatalf("layer after kill: %v", err)
	}
	if _, err := td.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"true"}}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("exec after kill: %v, want failed precondition", err)
	}

	// Destroy, twice.
	if err := td.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := td.Destroy(ctx, id); err != nil {
		t.Fatalf("second destroy: %v", err)
	}
	if _, err := td.Inspect(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("inspect after destroy: %v", err)
	}
	if _, err := td.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"true"}}); !errdefs.IsNotFound(err) {
		t.Fatalf("exec after destroy: %v", err)
	}
}

func (td *testDriver) hostIDOf(id string) int {
	rec, err := td.loadRecord(id)
	if err != nil {
		td.t.Fatal(err)
	}
	return rec.HostID
}

func TestInvalidInput(t *testing.T) {
	td := newTestDriver(t)
	ctx := context.Background()
	for _, id := range []string{"", "UPPER", "a/b", "..", strings.Repeat("a", 49)} {
		if _, err := td.Create(ctx, sandbox.Spec{ID: id, Template: sandbox.Template{RootFS: minimalRootfs(t)}}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("create %q: %v, want invalid argument", id, err)
		}
	}
	if _, err := td.Inspect(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("inspect missing: %v", err)
	}
	if err := td.Destroy(ctx, "nope"); err != nil {
		t.Errorf("destroy missing: %v", err)
	}
	if err := td.Kill(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("kill missing: %v", err)
	}
}

// TestExecNoLeakedFDs: a command sees its three stdio descriptors and
// nothing else of the daemon (4 is ls's own directory handle).
func TestExecNoLeakedFDs(t *testing.T) {
	td := newTestDriver(t)
	id := td.create(sandbox.Limits{})
	// A descriptor the daemon holds open, to show it does not leak.
	f, err := os.Open("/etc/hostname")
	if err != nil {
		f, _ = os.Open("/")
	}
	defer f.Close()
	got := strings.Fields(td.sh(id, "ls /proc/self/fd"))
	if strings.Join(got, " ") != "0 1 2 3" {
		t.Fatalf("fds in exec: %v, want 0 1 2 3", got)
	}
	// Their targets are pipes, not host files.
	links := td.sh(id, "for f in 0 1 2; do readlink /proc/self/fd/$f; done")
	for _, l := range strings.Fields(links) {
		if !strings.HasPrefix(l, "pipe:") {
			t.Fatalf("stdio target %q, want a pipe", l)
		}
	}
	// A background process sees its three stdio pipes only (the agent
	// writes its log), nothing of the agent's or the daemon's.
	pid, err := td.Start(context.Background(), id, sandbox.ExecSpec{Args: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	fds := strings.Fields(td.sh(id, fmt.Sprintf("ls /proc/%d/fd; for f in /proc/%d/fd/*; do readlink $f; done", pid, pid)))
	if len(fds) != 6 || strings.Join(fds[:3], " ") != "0 1 2" {
		t.Fatalf("background fds: %q, want 0 1 2 and three pipes", fds)
	}
	for _, l := range fds[3:] {
		if !strings.HasPrefix(l, "pipe:") {
			t.Fatalf("background stdio target %q, want a pipe", l)
		}
	}
}

func TestStartProcessesSignal(t *testing.T) {
	td := newTestDriver(t)
	ctx := context.Background()
	id := td.create(sandbox.Limits{})
	pid, err := td.Start(ctx, id, sandbox.ExecSpec{
		Args: []string{"/bin/sh", "-c", "echo started $FOO; exec sleep 1000"},
		Env:  []string{"FOO=x"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var ps []sandbox.Process
	var found *sandbox.Process
	waitFor(t, 5*time.Second, func() bool { // until the wrapper's exec is done
		ps, err = td.Processes(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range ps {
			if p.PID == pid && len(p.Args) > 0 && p.Args[0] == "sleep" {
				found = &ps[i]
			}
		}
		return found != nil
	})
	if found == nil || strings.Join(found.Args, " ") != "sleep 1000" || found.StartTicks == 0 {
		t.Fatalf("processes: %+v; want pid %d running sleep 1000", ps, pid)
	}
	// Its parent is the agent, the sandbox's init, which Processes
	// leaves out.
	if found.PPID != 1 || slices.ContainsFunc(ps, func(p sandbox.Process) bool { return p.PID == 1 }) {
		t.Fatalf("processes: %+v; want %d a child of the init (pid 1), and the init (the agent) not listed", ps, pid)
	}
	// It survives between execs and its output is in its log.
	td.sh(id, "true")
	if got := td.sh(id, fmt.Sprintf("cat /run/amber/proc/%d.log; kill -0 %d && echo alive", pid, pid)); got != "started x\nalive\n" {
		t.Fatalf("log/alive: %q", got)
	}
	if err := td.Signal(ctx, id, pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool {
		ps, _ := td.Processes(ctx, id)
		for _, p := range ps {
			if p.PID == pid {
				return false
			}
		}
		return true
	})
	if err := td.Signal(ctx, id, pid, syscall.SIGTERM); !errdefs.IsNotFound(err) {
		t.Fatalf("signal to exited pid: %v, want not found", err)
	}
	// Orphans are reaped by the init: no zombies pile up.
	td.sh(id, "for i in 1 2 3 4 5; do (sleep 0.01 &) ; done; sleep 0.3")
	if z := td.sh(id, "grep -l '^State:.*Z' /proc/[0-9]*/status || true"); strings.TrimSpace(z) != "" {
		t.Fatalf("zombies: %s", z)
	}
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestExecTimeoutAndTTY(t *testing.T) {
	td := newTestDriver(t)
	ctx := context.Background()
	id := td.create(sandbox.Limits{})

	start := time.Now()
	st, err := td.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "sleep 100 & sleep 100"}, Timeout: 300 * time.Millisecond})
	if err != nil || !st.TimedOut || st.Signal != "SIGKILL" || time.Since(start) > 5*time.Second {
		t.Fatalf("timeout: %+v %v after %v", st, err, time.Since(start))
	}
	// The killed command's children went with it.
	if out := td.sh(id, "ps -o comm | grep -c sleep || true"); strings.TrimSpace(out) != "0" {
		t.Fatalf("sleep processes left after timeout: %s", out)
	}
	// A background child holding stdout does not hold Exec.
	start = time.Now()
	out, _, st2 := td.run(id, "/bin/sh", "-c", "sleep 30 & echo done")
	if st2.Code != 0 || out != "done\n" || time.Since(start) > 5*time.Second {
		t.Fatalf("exec with lingering child: %q %+v after %v", out, st2, time.Since(start))
	}
	// Context cancel kills the command.
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := td.Exec(cctx, id, sandbox.ExecSpec{Args: []string{"sleep", "100"}}); err == nil {
		t.Fatal("exec outlived its context")
	}

	var tty bytes.Buffer
	st, err = td.Exec(ctx, id, sandbox.ExecSpec{
		Args:   []string{"/bin/sh", "-c", "tty; test -t 0 && echo stdin-tty; read x; echo got:$x; echo to-stderr >&2"},
		TTY:    true,
		Stdin:  strings.NewReader("hello\n"),
		Stdout: &tty,
	})
	if err != nil || st.Code != 0 {
		t.Fatalf("tty exec: %+v %v", st, err)
	}
	got := strings.ReplaceAll(tty.String(), "\r\n", "\n")
	if !strings.Contains(got, "/dev/pts/") || !strings.Contains(got, "stdin-tty\n") || !strings.Contains(got, "got:hello\n") || !strings.Contains(got, "to-stderr\n") {
		t.Fatalf("tty output: %q", got)
	}
}

// TestNetworkIsolation: only loopback, no route; a TCP server on the host's
// 127.0.0.1 (proven listening) and the host's own addresses are
// unreachable.
func TestNetworkIsolation(t *testing.T) {
	td := newTestDriver(t)
	id := td.create(sandbox.Limits{})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			_, _ = c.Write([]byte("host-secret\n"))
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	// Prove it is listening and answering from the host.
	c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	<-accepted

	links := td.sh(id, "ip -o link show | awk '{print $2}'")
	if strings.TrimSpace(links) != "lo:" {
		t.Fatalf("links in sandbox: %q, want only lo", links)
	}
	if routes := td.sh(id, "ip route show; ip -6 route show 2>/dev/null | grep -v '^::1 ' | grep -v '^$' || true"); strings.TrimSpace(routes) != "" {
		t.Fatalf("routes in sandbox: %q, want none", routes)
	}
	targets := []string{"127.0.0.1"}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
				targets = append(targets, ipn.IP.String()) // the host's own address: stays on this machine
			}
		}
	}
	for _, ip := range targets {
		out, _, st := td.run(id, "/bin/sh", "-c", fmt.Sprintf("nc -w 2 %s %d </dev/null", ip, port))
		if st.Code == 0 || strings.Contains(out, "host-secret") {
			t.Fatalf("sandbox reached host %s:%d: exit %+v out %q", ip, port, st, out)
		}
	}
	select {
	case <-accepted:
		t.Fatal("the host server accepted a connection from the sandbox")
	default:
	}
	// Loopback inside the sandbox works (its own, not the host's).
	// The listener may start slowly on a loaded host: retry the connect.
	out := td.sh(id, "nc -l -p 9000 -e echo inside & for i in $(seq 50); do nc -w 2 127.0.0.1 9000 </dev/null && break; sleep 0.1; done")
	if strings.TrimSpace(out) != "inside" {
		t.Fatalf("sandbox loopback: %q", out)
	}
}

// TestHardening: seccomp refuses the listed calls, the capability set is
// the small one, no_new_privs is set, and masked paths are hidden.
func TestHardening(t *testing.T) {
	td := newTestDriver(t)
	id := td.create(sandbox.Limits{})

	status := td.sh(id, "grep -E '^(CapEff|CapBnd|CapPrm|CapAmb|CapInh|NoNewPrivs|Seccomp):' /proc/self/status")
	want := capMask(defaultCaps)
	for _, field := range []string{"CapEff", "CapBnd", "CapPrm"} {
		if !strings.Contains(status, fmt.Sprintf("%s:\t%016x", field, want)) {
			t.Errorf("%s: want %016x in\n%s", field, want, status)
		}
	}
	for _, s := range []string{"CapAmb:\t0000000000000000", "CapInh:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"} {
		if !strings.Contains(status, s) {
			t.Errorf("want %q in\n%s", s, status)
		}
	}
	// A command run as root without CAP_SYS_ADMIN/NET_ADMIN.
	if out, _, st := td.run(id, "/bin/sh", "-c", "ip link add dummy0 type dummy"); st.Code == 0 {
		t.Errorf("ip link add succeeded: %s", out)
	}
	if out, _, st := td.run(id, "unshare", "-U", "true"); st.Code == 0 {
		t.Errorf("unshare -U succeeded: %s", out)
	}
	if out, _, st := td.run(id, "unshare", "-m", "true"); st.Code == 0 {
		t.Errorf("unshare -m succeeded: %s", out)
	}
	if out, _, st := td.run(id, "mount", "-t", "tmpfs", "x", "/mnt"); st.Code == 0 {
		t.Errorf("mount succeeded: %s", out)
	}
	// Masked and read-only kernel files.
	if out := td.sh(id, "cat /proc/kcore /proc/keys /proc/sched_debug | wc -c"); strings.TrimSpace(out) != "0" {
		t.Errorf("masked paths readable: %q", out)
	}
	if _, _, st := td.run(id, "/bin/sh", "-c", "echo 1 > /proc/sys/kernel/ns_last_pid"); st.Code == 0 {
		t.Error("/proc/sys writable")
	}
	if _, _, st := td.run(id, "/bin/sh", "-c", "echo x > /sys/kernel/uevent_helper"); st.Code == 0 {
		t.Error("/sys writable")
	}

	// The syscall probe: a static binary copied into the sandbox.
	probe := buildProbe(t)
	data, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := td.Files(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.WriteFile(context.Background(), "/probe", bytes.NewReader(data), 0o755); err != nil {
		t.Fatal(err)
	}
	out := td.sh(id, "/probe")
	results := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			results[k] = v
		}
	}
	wantErr := map[string]string{
		"keyctl": "EPERM", "add_key": "EPERM", "bpf": "EPERM", "perf_event_open": "EPERM",
		"userfaultfd": "EPERM", "io_uring_setup": "EPERM", "unshare_user": "EPERM",
		"clone3": "ENOSYS", "mount": "EPERM", "setns": "EPERM", "socket_vsock": "EPERM",
		"kexec_load": "EPERM", "init_module": "EPERM",
		"socket_inet": "ok", "getpid": "ok",
	}
	for k, v := range wantErr {
		if results[k] != v {
			t.Errorf("probe %s: %q, want %q", k, results[k], v)
		}
	}
}

func capMask(names []string) uint64 {
	nums := map[string]uint{
		"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3, "CAP_FSETID": 4,
		"CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8, "CAP_NET_BIND_SERVICE": 10,
		"CAP_NET_RAW": 13, "CAP_SYS_CHROOT": 18, "CAP_MKNOD": 27, "CAP_AUDIT_WRITE": 29, "CAP_SETFCAP": 31,
	}
	var m uint64
	for _, n := range names {
		b, ok := nums[n]
		if !ok {
			panic("capMask: unknown " + n)
		}
		m |= 1 << b
	}
	return m
}

func buildProbe(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "probe")
	cmd := exec.Command("go", "build", "-o", out, "./testdata/probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build probe: %v\n%s", err, b)
	}
	return out
}

// TestLimits: a memory hog is OOM-killed inside its limit, a fork bomb is
// bounded by the pids limit, and the host keeps working meanwhile.
func TestLimits(t *testing.T) {
	td := newTestDriver(t)
	ctx := context.Background()
	id := td.create(sandbox.Limits{MemoryBytes: 64 << 20, Pids: 64, MilliCPUs: 500})
	cg := filepath.Join(td.parent, id)
	readCg := func(ctrl, file string) string {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", ctrl, cg, file))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if got := readCg("memory", "memory.limit_in_bytes"); got != strconv.Itoa(64<<20) {
		t.Errorf("memory.limit_in_bytes = %s", got)
	}
	if got := readCg("pids", "pids.max"); got != "64" {
		t.Errorf("pids.max = %s", got)
	}
	if got := readCg("cpu", "cpu.cfs_quota_us"); got != "50000" {
		t.Errorf("cpu.cfs_quota_us = %s", got)
	}

	// Memory hog: dd reads into a 200 MB buffer.
	_, _, st := td.run(id, "dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1")
	if st.Code == 0 || st.Signal != "SIGKILL" {
		t.Errorf("memory hog: %+v, want killed by SIGKILL", st)
	}
	if oc := readCg("memory", "memory.oom_control"); !strings.Contains(oc, "oom_kill 1") {
		t.Errorf("memory limit never hit: memory.oom_control:\n%s\nmax_usage %s failcnt %s memsw.failcnt %s", oc,
			readCg("memory", "memory.max_usage_in_bytes"), readCg("memory", "memory.failcnt"), readCg("memory", "memory.memsw.failcnt"))
	}
	// Still usable afterwards.
	td.sh(id, "true")

	// Fork bomb, for a bounded time.
	bomb, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "b() { b | b & }; b"}})
	if err != nil {
		t.Fatal(err)
	}
	_ = bomb
	// Until the bomb hits the limit (slow on a loaded host), never above it.
	waitFor(t, 30*time.Second, func() bool {
		if n, _ := strconv.Atoi(readCg("pids", "pids.current")); n > 64 {
			t.Fatalf("pids.current %d over limit 64", n)
		}
		ev := readCg("pids", "pids.events")
		return strings.HasPrefix(ev, "max ") && ev != "max 0"
	})
	// The host still forks and runs.
	if out, err := exec.Command("/bin/sh", "-c", "echo host-ok").Output(); err != nil || string(out) != "host-ok\n" {
		t.Errorf("host during fork bomb: %q %v", out, err)
	}
	if err := td.Kill(ctx, id); err != nil {
		t.Fatalf("kill during fork bomb: %v", err)
	}
	// The pids controller uncharges a task when its parent reaps it, a
	// moment after it left cgroup.procs: wait for the count, bounded.
	deadline := time.Now().Add(5 * time.Second)
	for got := readCg("pids", "pids.current"); got != "0"; got = readCg("pids", "pids.current") {
		if time.Now().After(deadline) {
			t.Fatalf("pids.current after kill: %s", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRestartReattach: a second driver over the same state directory (a
// restarted daemon) lists the sandboxes, execs, kills and destroys them.
func TestRestartReattach(t *testing.T) {
	td := newTestDriver(t)
	ctx := context.Background()
	a := td.create(sandbox.Limits{})
	b := td.create(sandbox.Limits{})
	if err := td.Kill(ctx, b); err != nil {
		t.Fatal(err)
	}
	pid, err := td.Start(ctx, a, sandbox.ExecSpec{Args: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}

	d2, err := New(td.options())
	if err != nil {
		t.Fatal(err)
	}
	list, err := d2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]sandbox.State{}
	for _, i := range list {
		states[i.ID] = i.State
	}
	if states[a] != sandbox.StateRunning || states[b] != sandbox.StateStopped || len(states) != 2 {
		t.Fatalf("list after restart: %+v", list)
	}
	var out bytes.Buffer
	if st, err := d2.Exec(ctx, a, sandbox.ExecSpec{Args: []string{"sh", "-c", fmt.Sprintf("kill -0 %d && echo alive", pid)}, Stdout: &out}); err != nil || st.Code != 0 || out.String() != "alive\n" {
		t.Fatalf("exec after restart: %+v %v %q", st, err, out.String())
	}
	ps, err := d2.Processes(ctx, a)
	if err != nil || !slices.ContainsFunc(ps, func(p sandbox.Process) bool { return p.PID == pid }) {
		t.Fatalf("processes after restart: %+v %v", ps, err)
	}
	if err := d2.Kill(ctx, a); err != nil {
		t.Fatal(err)
	}
	if info, err := d2.Inspect(ctx, a); err != nil || info.State != sandbox.StateStopped {
		t.Fatalf("inspect after kill: %+v %v", info, err)
	}
	for _, id := range []string{a, b} {
		if err := d2.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDestroyHalfCreated: the pieces a crash in the middle of Create can
// leave (record, mounted layer, cgroups, an empty libcontainer directory)
// are all removed by Destroy.
func TestDestroyHalfCreated(t *testing.T) {
	td := newTestDriver(t)
	ctx := context.Background()
	id := newID("half")
	slot, err := td.claimSlot(id)
	if err != nil {
		t.Fatal(err)
	}
	rec := &record{Version: recordVersion, ID: id, Template: sandbox.Template{RootFS: minimalRootfs(t)},
		Limits: td.effectiveLimits(sandbox.Limits{}, sandbox.Limits{}), Slot: slot, HostID: DefaultUIDBase + slot*idsPerSandbox,
		Created: time.Now(), Phase: phaseCreating}
	if err := os.MkdirAll(td.recordDir(id), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := td.saveRecord(rec); err != nil {
		t.Fatal(err)
	}
	if _, err := td.mountRootfs(rec); err != nil {
		t.Fatal(err)
	}
	for _, ctrl := range []string{"memory", "pids", "cpu", "freezer"} {
		if err := os.MkdirAll(filepath.Join("/sys/fs/cgroup", ctrl, td.parent, id), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(td.runc, id), 0o711); err != nil {
		t.Fatal(err)
	}
	list, err := td.List(ctx)
	if err != nil || len(list) != 1 || list[0].State != sandbox.StateUnknown {
		t.Fatalf("list of half-created: %+v %v", list, err)
	}
	if err := td.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if list, _ := td.List(ctx); len(list) != 0 {
		t.Fatalf("list after destroy: %+v", list)
	}
	if _, err := os.Stat(td.slotPath(slot)); !os.IsNotExist(err) {
		t.Fatalf("uid range %d still claimed: %v", slot, err)
	}
	// td's cleanup checks mounts and cgroups.
}

func TestCheck(t *testing.T) {
	requireHost(t)
	t.Cleanup(func() { _ = os.Remove("/run/amber-criu-test/check") })
	d, err := New(Options{StateDir: t.TempDir(), RunDir: "/run/amber-criu-test/check", CriuPath: "/nonexistent/criu"})
	if err != nil {
		t.Fatal(err)
	}
	err = d.Check(context.Background())
	if err == nil || !strings.Contains(err.Error(), "make setup") {
		t.Fatalf("check with missing criu: %v, want an error naming make setup", err)
	}
	d, err = New(Options{StateDir: t.TempDir(), RunDir: "/run/amber-criu-test/check"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.opts.CriuPath); err != nil {
		t.Skipf("patched CRIU not installed at %s (make setup-criu): %v", d.opts.CriuPath, err)
	}
	if err := d.Check(context.Background()); err != nil {
		t.Fatalf("check: %v", err)
	}
}

// TestConcurrentCreates: parallel creates, through two drivers over one
// state directory, get distinct uid ranges.
func TestConcurrentCreates(t *testing.T) {
	td := newTestDriver(t)
	other, err := New(td.options())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	n := 2 * runtime.NumCPU()
	errs := make(chan error, n)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = newID("c")
	}
	for i, id := range ids {
		d := td.Driver
		if i%2 == 1 {
			d = other
		}
		go func() {
			_, err := d.Create(ctx, sandbox.Spec{ID: id, Template: sandbox.Template{RootFS: minimalRootfs(t)}})
			errs <- err
		}()
	}
	for range ids {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	slots := map[int]bool{}
	for _, id := range ids {
		rec, err := td.loadRecord(id)
		if err != nil {
			t.Fatal(err)
		}
		if slots[rec.HostID] {
			t.Fatalf("two sandboxes share host id %d", rec.HostID)
		}
		slots[rec.HostID] = true
		if out := td.sh(id, "echo ok"); out != "ok\n" {
			t.Fatalf("%s: %q", id, out)
		}
	}
}

// TestFiles: the host-side FS writes files the sandbox owns and reads what
// the sandbox wrote; symlinks cannot lead it out of the sandbox.
func TestFiles(t *testing.T) {
	td := newTestDriver(t)
	ctx := context.Background()
	id := td.create(sandbox.Limits{})
	fs, err := td.Files(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Mkdir(ctx, "/home/user/dir", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fs.WriteFile(ctx, "/home/user/dir/in.txt", strings.NewReader("from-host"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := td.sh(id, "stat -c '%u:%g %a' /home/user/dir/in.txt; cat /home/user/dir/in.txt; echo -n from-sandbox > /tmp/out.txt; ln -s /etc/hostname /tmp/esc"); got != "0:0 644\nfrom-host" {
		t.Fatalf("inside: %q", got)
	}
	var buf bytes.Buffer
	if err := fs.ReadFile(ctx, "/tmp/out.txt", &buf); err != nil || buf.String() != "from-sandbox" {
		t.Fatalf("read: %q %v", buf.String(), err)
	}
	// /tmp/esc -> /etc/hostname resolves inside the sandbox (no such file
	// there), never to the host's /etc/hostname.
	buf.Reset()
	if err := fs.ReadFile(ctx, "/tmp/esc", &buf); err == nil {
		host, _ := os.ReadFile("/etc/hostname")
		if len(host) > 0 && buf.String() == string(host) {
			t.Fatalf("symlink escaped to the host: %q", buf.String())
		}
	}
	// Files works on a killed sandbox (its layer stays).
	if err := td.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	fs, err = td.Files(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Stat(ctx, "/tmp/out.txt"); err != nil {
		t.Fatal(err)
	}
}

// TestDiskLimit: filling the writable layer stops at its limit with ENOSPC;
// the host's filesystem does not fill.
func TestDiskLimit(t *testing.T) {
	td := newTestDriver(t)
	id := td.create(sandbox.Limits{DiskBytes: 64 << 20})
	out, errs, st := td.run(id, "dd", "if=/dev/zero", "of=/big", "bs=1M", "count=200")
	if st.Code == 0 || !strings.Contains(out+errs, "No space left") {
		t.Fatalf("disk filler: %+v %q %q", st, out, errs)
	}
	size := td.sh(id, "stat -c %s /big")
	if n, _ := strconv.Atoi(strings.TrimSpace(size)); n > 64<<20 || n < 16<<20 {
		t.Fatalf("wrote %s bytes into a 64 MiB layer", size)
	}
	td.sh(id, "rm /big && echo ok > /after")
}

func TestExecMissingCommand(t *testing.T) {
	td := newTestDriver(t)
	id := td.create(sandbox.Limits{})
	// As a shell reports it: status 127, the reason on stderr.
	var errb bytes.Buffer
	st, err := td.Exec(context.Background(), id, sandbox.ExecSpec{Args: []string{"/no/such/program"}, Stderr: &errb})
	if err != nil || st.Code != 127 || !strings.Contains(errb.String(), "/no/such/program") {
		t.Fatalf("missing command: %+v %v %q, want exit 127 naming it", st, err, errb.String())
	}
	// Start of a missing program is an invalid argument naming it.
	if _, err := td.Start(context.Background(), id, sandbox.ExecSpec{Args: []string{"/no/such/program"}}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "/no/such/program") {
		t.Fatalf("start of a missing command: %v, want invalid argument naming it", err)
	}
	td.sh(id, "true") // the sandbox is unharmed
}

// TestNonRootUser: a template user runs commands without capabilities and
// can still start background processes.
func TestNonRootUser(t *testing.T) {
	td := newTestDriver(t)
	ctx := context.Background()
	id := newID("user")
	if _, err := td.Create(ctx, sandbox.Spec{ID: id, Template: sandbox.Template{RootFS: minimalRootfs(t), User: "1000:1000", Cwd: "/tmp"}}); err != nil {
		t.Fatal(err)
	}
	if got := td.sh(id, "id -u; id -g; pwd; grep CapEff /proc/self/status"); got != "1000\n1000\n/tmp\nCapEff:\t0000000000000000\n" {
		t.Fatalf("as template user: %q", got)
	}
	pid, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "echo bg; exec sleep 100"}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool {
		out, _, _ := td.run(id, "cat", fmt.Sprintf("/run/amber/proc/%d.log", pid))
		return out == "bg\n"
	})
	if _, _, st := td.run(id, "/bin/sh", "-c", "echo x > /etc/passwd"); st.Code == 0 {
		t.Fatal("template user wrote /etc/passwd")
	}
	if _, err := td.Create(ctx, sandbox.Spec{ID: newID("baduser"), Template: sandbox.Template{RootFS: minimalRootfs(t), User: "nobody"}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("named user: %v, want invalid argument", err)
	}
}

// slowWriter takes its time with every write, like a slow client.
type slowWriter struct{ bytes.Buffer }

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(100 * time.Millisecond)
	return w.Buffer.Write(p)
}

// TestExecSlowReader: output is never cut short because the caller reads
// it slowly, nor because the command said nothing for a while before
// exiting.
func TestExecSlowReader(t *testing.T) {
	td := newTestDriver(t)
	id := td.create(sandbox.Limits{})
	var out slowWriter
	st, err := td.Exec(context.Background(), id, sandbox.ExecSpec{
		Args:   []string{"/bin/sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' x; sleep 0.5; echo END"},
		Stdout: &out,
	})
	if err != nil || st.Code != 0 {
		t.Fatal(st, err)
	}
	if got := out.Len(); got != 1000000+4 || !strings.HasSuffix(out.String(), "END\n") {
		t.Fatalf("got %d bytes, want 1000004 ending in END", got)
	}
}
