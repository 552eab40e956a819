package criu

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// requireCriu skips when the patched CRIU is missing.
func requireCriu(t testing.TB, td *testDriver) {
	t.Helper()
	if _, err := os.Stat(td.opts.CriuPath); err != nil {
		t.Skipf("no CRIU at %s (make setup)", td.opts.CriuPath)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// fidelityState is the state the fidelity workload puts into a sandbox,
// as observed just before the cut.
type fidelityState struct {
	counterPid int
	random     string // the counter's in-memory random value
	counterAt  int    // the counter's last logged value before the cut
	before     string // content of /root/before.txt
	parentPid  int    // parent of two looping children
	family     map[int]uint64
	envPid     int
	envToken   string
	tmpfsToken string
	srvPid     int
	tcpRandom  string // the TCP client's in-memory random value
}

// Scripts of the workload. Every value they keep lives only in the
// shell's memory; the logs are what the test reads.
const (
	// A counter and a random value drawn at start, logged every 50 ms.
	counterScript = `r=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n'); i=0; while :; do i=$((i+1)); echo "$i $r"; sleep 0.05; done`
	// A parent whose two children loop.
	familyScript = `loop() { n=0; while :; do n=$((n+1)); sleep 0.05; done; }; loop & loop & wait`
	// TCP inside the sandbox: a client sends a counter over a connection
	// to a server that logs what it receives.
	serverScript = `sleep 1000000 | nc -l -p 5555 > /root/tcp.log`
	clientScript = `r=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n'); i=0; while :; do i=$((i+1)); echo "$i $r"; sleep 0.05; done | nc 127.0.0.1 5555`
)

// startWorkload puts the fidelity state into sandbox id and returns it.
func startWorkload(t *testing.T, td *testDriver, id string) *fidelityState {
	t.Helper()
	ctx := context.Background()
	st := &fidelityState{envToken: randHex(8), tmpfsToken: randHex(8), before: randHex(16)}
	var err error
	if st.counterPid, err = td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", counterScript}}); err != nil {
		t.Fatal(err)
	}
	if st.parentPid, err = td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", familyScript}}); err != nil {
		t.Fatal(err)
	}
	if st.envPid, err = td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "while :; do sleep 1; done"}, Env: []string{"AMBER_TOKEN=" + st.envToken}}); err != nil {
		t.Fatal(err)
	}
	if st.srvPid, err = td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", serverScript}}); err != nil {
		t.Fatal(err)
	}
	// Files: a file, a symlink, a hard link, a setuid file owned by a
	// sandbox user, a deleted template file (a whiteout) and a template
	// directory replaced by a new one (an opaque directory); a tmpfs file.
	td.sh(id, fmt.Sprintf(`set -e
printf %%s %s > /root/before.txt
ln -s before.txt /root/link; ln /root/before.txt /root/hard
echo x > /root/suid; chown 1000:1000 /root/suid; chmod 4750 /root/suid
rm /usr/bin/yes
rm -rf /usr/sbin; mkdir /usr/sbin; echo new > /usr/sbin/only
printf %%s %s > /dev/shm/tmpfile
for i in $(seq 100); do cat /proc/net/tcp /proc/net/tcp6 | grep -q ':15B3 [0:]* 0A' && break; sleep 0.02; done`, st.before, st.tmpfsToken))
	if _, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", clientScript}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	st.family = familyTicks(t, td, id, st.parentPid)
	if len(st.family) != 3 {
		t.Fatalf("family of %d: %v", st.parentPid, st.family)
	}
	lines := counterLines(t, td, id, st.counterPid)
	if len(lines) == 0 {
		t.Fatal("counter logged nothing")
	}
	st.random = lines[0][1]
	if tl := tcpLines(t, td, id); len(tl) > 0 {
		st.tcpRandom = tl[0][1]
	}
	st.counterAt, _ = strconv.Atoi(lines[len(lines)-1][0])
	return st
}

// familyTicks maps the PIDs of parent and its children to their start ticks.
func familyTicks(t *testing.T, td *testDriver, id string, parent int) map[int]uint64 {
	t.Helper()
	procs, err := td.Processes(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]uint64{}
	for _, p := range procs {
		if p.PID == parent || p.PPID == parent && len(p.Args) > 2 && strings.Contains(p.Args[2], "loop") {
			out[p.PID] = p.StartTicks
		}
	}
	return out
}

func tcpLines(t *testing.T, td *testDriver, id string) [][]string {
	t.Helper()
	out, _, _ := td.run(id, "cat", "/root/tcp.log")
	var lines [][]string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			lines = append(lines, f)
		}
	}
	return lines
}

func counterLines(t *testing.T, td *testDriver, id string, pid int) [][]string {
	t.Helper()
	out, _, _ := td.run(id, "cat", fmt.Sprintf("/run/amber/proc/%d.log", pid))
	var lines [][]string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			lines = append(lines, f)
		}
	}
	return lines
}

// The checks: each returns nil when the sandbox holds the state st
// describes, as restored from a cut taken after st was observed.

func checkMemory(t *testing.T, td *testDriver, id string, st *fidelityState) error {
	lines := counterLines(t, td, id, st.counterPid)
	if len(lines) == 0 {
		return errors.New("counter log empty")
	}
	for i, l := range lines {
		if n, _ := strconv.Atoi(l[0]); n != i+1 {
			return fmt.Errorf("counter line %d is %q: a reset, repeat or gap", i+1, l[0])
		}
		if l[1] != st.random {
			return fmt.Errorf("random value %q at line %d, want %q", l[1], i+1, st.random)
		}
	}
	last, _ := strconv.Atoi(lines[len(lines)-1][0])
	if last <= st.counterAt+2 {
		return fmt.Errorf("counter at %d, was %d before the cut: not running on", last, st.counterAt)
	}
	return nil
}

func checkFiles(t *testing.T, td *testDriver, id string, st *fidelityState) error {
	out, errs, code := td.run(id, "/bin/sh", "-c", `cat /root/before.txt; echo; cat /root/link; echo; stat -c '%i %h' /root/before.txt /root/hard; stat -c '%a %u %g' /root/suid
test -e /root/after.txt && echo after-present; test -e /usr/bin/yes && echo yes-present; ls /usr/sbin`)
	if code.Code != 0 {
		return fmt.Errorf("exit %d: %s", code.Code, errs)
	}
	f := strings.Split(strings.TrimSpace(out), "\n")
	if len(f) != 6 {
		return fmt.Errorf("files: %q", out)
	}
	if f[0] != st.before || f[1] != st.before {
		return fmt.Errorf("before.txt / link: %q %q, want %q", f[0], f[1], st.before)
	}
	if a, b := strings.Fields(f[2]), strings.Fields(f[3]); len(a) != 2 || len(b) != 2 || a[0] != b[0] || a[1] != "2" {
		return fmt.Errorf("hard link: %q %q", f[2], f[3])
	}
	if f[4] != "4750 1000 1000" {
		return fmt.Errorf("suid file: %q", f[4])
	}
	if f[5] != "only" {
		return fmt.Errorf("after the cut, or whiteout/opaque dir wrong: %q", f[5:])
	}
	return nil
}

func checkProcesses(t *testing.T, td *testDriver, id string, st *fidelityState) error {
	got := familyTicks(t, td, id, st.parentPid)
	if len(got) != len(st.family) {
		return fmt.Errorf("family %v, want %v", got, st.family)
	}
	for pid, ticks := range st.family {
		if g, ok := got[pid]; !ok || g != ticks {
			return fmt.Errorf("pid %d: start ticks %d (present %v), want %d", pid, g, ok, ticks)
		}
	}
	return nil
}

func checkEnvTmpfs(t *testing.T, td *testDriver, id string, st *fidelityState) error {
	out, _, _ := td.run(id, "/bin/sh", "-c", fmt.Sprintf("tr '\\0' '\\n' < /proc/%d/environ | grep AMBER_TOKEN; cat /dev/shm/tmpfile", st.envPid))
	if want := "AMBER_TOKEN=" + st.envToken + "\n" + st.tmpfsToken; strings.TrimSpace(out) != want {
		return fmt.Errorf("env/tmpfs %q, want %q", out, want)
	}
	return nil
}

func checkTCP(t *testing.T, td *testDriver, id string, st *fidelityState) error {
	a := tcpLines(t, td, id)
	time.Sleep(300 * time.Millisecond)
	b := tcpLines(t, td, id)
	for i, l := range b {
		if l[0] != strconv.Itoa(i+1) || l[1] != st.tcpRandom {
			return fmt.Errorf("tcp log line %d is %q, want %d %s: data lost or repeated, or another client", i+1, l, i+1, st.tcpRandom)
		}
	}
	if len(b) <= len(a) || len(a) == 0 {
		return fmt.Errorf("tcp log not growing (%d then %d lines): the connection is gone", len(a), len(b))
	}
	if out, _, _ := td.run(id, "cat", "/proc/net/tcp", "/proc/net/tcp6"); strings.Count(out, " 01 ") < 2 {
		return fmt.Errorf("no established connection:\n%s", out)
	}
	return nil
}

var fidelityChecks = []struct {
	name  string
	check func(*testing.T, *testDriver, string, *fidelityState) error
}{
	{"1-memory", checkMemory},
	{"2-files", checkFiles},
	{"3-processes", checkProcesses},
	{"7-env-tmpfs", checkEnvTmpfs},
	{"9-tcp-inside", checkTCP},
}

// TestCheckpointFidelity is the fidelity suite for this driver (issue 4,
// items 1, 2, 3, 7, 9): one sandbox gets every kind of state, is
// checkpointed (and keeps running, and writes more), killed, and restored
// by a second driver over a fresh state directory (a node that never saw
// it); each kind is checked. The same checks run against a fresh sandbox
// with the same workload, never restored, where each must fail. Then the
// restored sandbox is checkpointed again with LeaveStopped and restored
// over its stopped self.
func TestCheckpointFidelity(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	if !td.Capabilities().Checkpoint {
		t.Fatal("Capabilities().Checkpoint is false")
	}
	testStart := time.Now()
	lap := func(what string) { t.Logf("%6.1fs %s", time.Since(testStart).Seconds(), what) }
	ctx := context.Background()
	id := td.create(sandbox.Limits{})
	st := startWorkload(t, td, id)
	lap("workload started")

	images := t.TempDir()
	cs, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lap("checkpointed")
	t.Logf("checkpoint: frozen %v, total %v, memory %d B, layer %d B", cs.Frozen, cs.Total, cs.MemoryBytes, cs.LayerBytes)
	if cs.Frozen <= 0 || cs.Total < cs.Frozen || cs.MemoryBytes <= 0 || cs.LayerBytes <= 0 {
		t.Errorf("stats %+v", cs)
	}
	// After the cut the sandbox runs on: a file written now must not be
	// in the restored sandbox.
	td.sh(id, "echo late > /root/after.txt; echo changed > /root/before.txt")
	if err := td.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	if info, err := td.Inspect(ctx, id); err != nil || info.State != sandbox.StateStopped {
		t.Fatalf("after kill: %+v %v", info, err)
	}
	// The node is lost: its state goes, and with it the claim on the
	// image's uid range.
	if err := td.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}

	td2 := newTestDriver(t)
	spec := sandbox.Spec{ID: id, Template: sandbox.Template{Name: "minimal", RootFS: minimalRootfs(t)}}
	rs, err := td2.Restore(ctx, spec, images, sandbox.RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lap("restored on a fresh state dir")
	t.Logf("restore: %+v", rs)
	if rs.Processes < 8 || rs.MemoryBytes <= 0 || rs.ConnectionsRestored < 2 || rs.ConnectionsReset != 0 || rs.Files == 0 || rs.Running <= 0 {
		t.Errorf("restore stats %+v", rs)
	}
	time.Sleep(300 * time.Millisecond)
	for _, c := range fidelityChecks {
		if err := c.check(t, td2, id, st); err != nil {
			t.Errorf("%s: after restore: %v", c.name, err)
		}
	}
	// Exec works in the restored sandbox.
	if out := td2.sh(id, "echo ok"); out != "ok\n" {
		t.Errorf("exec after restore: %q", out)
	}
	// A running sandbox is not restored over.
	if _, err := td2.Restore(ctx, spec, images, sandbox.RestoreOptions{}); err == nil {
		t.Error("restore over a running sandbox succeeded")
	}

	// Control: a fresh sandbox running the same workload, never
	// restored, must fail every check.
	fresh := td2.create(sandbox.Limits{})
	startWorkload(t, td2, fresh)
	for _, c := range fidelityChecks {
		if err := c.check(t, td2, fresh, st); err == nil {
			t.Errorf("%s: passes on a fresh sandbox that was never restored: the check proves nothing", c.name)
		} else {
			t.Logf("%s on a fresh sandbox fails as it must: %v", c.name, err)
		}
	}
	lap("control checked")
	if err := td2.Destroy(ctx, fresh); err != nil {
		t.Fatal(err)
	}

	// A restored sandbox checkpoints again; LeaveStopped leaves it
	// stopped, and that image restores over the stopped sandbox, with the
	// original PIDs and start times.
	images2 := t.TempDir()
	if _, err := td2.Checkpoint(ctx, id, images2, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	lap("checkpointed, left stopped")
	if info, err := td2.Inspect(ctx, id); err != nil || info.State != sandbox.StateStopped {
		t.Fatalf("after checkpoint with LeaveStopped: %+v %v", info, err)
	}
	if _, err := td2.Restore(ctx, sandbox.Spec{ID: id}, images2, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	lap("restored again")
	time.Sleep(200 * time.Millisecond)
	for _, c := range fidelityChecks[:3] {
		if err := c.check(t, td2, id, st); err != nil {
			t.Errorf("%s: after a second checkpoint and restore: %v", c.name, err)
		}
	}
	t.Logf("TestCheckpointFidelity took %v", time.Since(testStart))
}

// TestCheckpointBenchmark measures, for 10 MiB and 256 MiB of touched
// anonymous memory in one process: Checkpoint's frozen time and total,
// Restore's time to running, and, in the same run, raw `criu dump` and
// `criu restore -d` of an equivalent process on the host. It runs only
// with AMBER_BENCH=1:
//
//	AMBER_BENCH=1 CGO_ENABLED=1 go test -tags seccomp -run TestCheckpointBenchmark -v ./drivers/criu
func TestCheckpointBenchmark(t *testing.T) {
	if os.Getenv("AMBER_BENCH") != "1" {
		t.Skip("set AMBER_BENCH=1 to measure")
	}
	td := newTestDriver(t)
	requireCriu(t, td)
	ctx := context.Background()
	rounds := 3
	if s := os.Getenv("AMBER_BENCH_ROUNDS"); s != "" {
		rounds, _ = strconv.Atoi(s)
	}
	for _, mib := range []int{10, 256} {
		// busybox awk holds a string of mib MiB (touched) and blocks.
		prog := fmt.Sprintf(`BEGIN { s = sprintf("%%%ds", ""); while (1) system("sleep 3600") }`, mib<<20)
		id := td.create(sandbox.Limits{MemoryBytes: 2 << 30})
		if _, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"awk", prog}}); err != nil {
			t.Fatal(err)
		}
		waitRSS(t, td, id, "awk", int64(mib)<<20)
		var frozen, total, running, lazyRunning, lazyFull []time.Duration
		var memBytes int64
		// With LazyRestore, rounds alternate eager and lazy restores; a
		// lazy round waits until awk is resident again (every page
		// served) before the next cut.
		lazyCap := td.Capabilities().LazyRestore
		n := rounds
		if lazyCap {
			n = 2 * rounds
		}
		for r := 0; r < n; r++ {
			dir := t.TempDir()
			cs, err := td.Checkpoint(ctx, id, dir, sandbox.CheckpointOptions{})
			if err != nil {
				t.Fatal(err)
			}
			memBytes = cs.MemoryBytes
			if err := td.Destroy(ctx, id); err != nil { // the node is lost
				t.Fatal(err)
			}
			lazy := lazyCap && r%2 == 1
			t0 := time.Now()
			rs, err := td.Restore(ctx, sandbox.Spec{ID: id}, dir, sandbox.RestoreOptions{Lazy: lazy})
			if err != nil {
				t.Fatal(err)
			}
			if !lazy {
				frozen, total, running = append(frozen, cs.Frozen), append(total, cs.Total), append(running, rs.Running)
				continue
			}
			if !rs.Lazy {
				t.Fatal("asked for a lazy restore, got an eager one")
			}
			waitRSS(t, td, id, "awk", int64(mib)<<20)
			lazyRunning, lazyFull = append(lazyRunning, rs.Running), append(lazyFull, time.Since(t0))
		}
		if lazyCap {
			t.Logf("%d MiB touched, %d rounds: lazy Restore to running p50 %v max %v; until awk is resident again p50 %v",
				mib, rounds, p50(lazyRunning), slicesMax(lazyRunning), p50(lazyFull))
		}
		if err := td.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		rawDump, rawRestore := rawCriu(t, td, prog, rounds)
		t.Logf("%d MiB touched (memory image %.1f MiB), %d rounds: Checkpoint frozen p50 %v max %v, total p50 %v; Restore to running p50 %v max %v; raw `criu dump` p50 %v, raw `criu restore -d` p50 %v",
			mib, float64(memBytes)/(1<<20), rounds, p50(frozen), slicesMax(frozen), p50(total), p50(running), slicesMax(running), p50(rawDump), p50(rawRestore))
	}
}

func p50(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}

func slicesMax(d []time.Duration) time.Duration {
	var m time.Duration
	for _, v := range d {
		m = max(m, v)
	}
	return m
}

// waitRSS waits until a process of sandbox id whose command line holds
// name has at least bytes resident.
func waitRSS(t *testing.T, td *testDriver, id, name string, bytes int64) {
	t.Helper()
	ls, err := td.container(id)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		toHost, _, _ := td.sandboxPids(ls)
		for _, hp := range toHost {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", hp))
			if !strings.Contains(string(cmd), name) {
				continue
			}
			if rssBytes(hp) >= bytes {
				time.Sleep(300 * time.Millisecond)
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s process with %d bytes resident", name, bytes)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func rssBytes(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	i := strings.Index(string(b), "VmRSS:")
	if i < 0 {
		return 0
	}
	var kb int64
	fmt.Sscanf(string(b[i+6:]), "%d", &kb)
	return kb << 10
}

// rawCriu times the patched CRIU's own dump and restore of a host process
// running the same awk program (busybox from the template), no sandbox.
func rawCriu(t *testing.T, td *testDriver, prog string, rounds int) (dumps, restores []time.Duration) {
	t.Helper()
	bb := filepath.Join(minimalRootfs(t), "bin", "busybox")
	cmd := exec.Command("setsid", bb, "awk", prog)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	pid := cmd.Process.Pid
	// setsid made pid its process group's leader; CRIU restores the
	// group with its ids.
	defer func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }()
	for rssBytes(pid) < parseAwkSize(prog) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	for r := 0; r < rounds; r++ {
		dir := t.TempDir()
		start := time.Now()
		out, err := exec.Command(td.opts.CriuPath, "dump", "-t", strconv.Itoa(pid), "-D", dir, "-o", "dump.log", "--shell-job").CombinedOutput()
		if err != nil {
			t.Fatalf("criu dump: %v: %s", err, out)
		}
		dumps = append(dumps, time.Since(start))
		// CRIU killed the tree; its pids must be free (reaped) again.
		for i := 0; i < 500 && groupAlive(pid); i++ {
			time.Sleep(10 * time.Millisecond)
		}
		start = time.Now()
		out, err = exec.Command(td.opts.CriuPath, "restore", "-D", dir, "-o", "restore.log", "--shell-job", "-d").CombinedOutput()
		if err != nil {
			log, _ := os.ReadFile(filepath.Join(dir, "restore.log"))
			t.Fatalf("criu restore: %v: %s\n%s", err, out, lastLines(log, 10))
		}
		restores = append(restores, time.Since(start))
	}
	return dumps, restores
}

func parseAwkSize(prog string) int64 {
	i := strings.Index(prog, `"%`)
	var n int64
	fmt.Sscanf(prog[i+2:], "%d", &n)
	return n
}

// TestCheckpointLazy restores with RestoreOptions.Lazy (criu lazy-pages):
// the counter runs on with its memory served on demand.
func TestCheckpointLazy(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	if !td.Capabilities().LazyRestore {
		t.Skip("LazyRestore is off")
	}
	ctx := context.Background()
	id := td.create(sandbox.Limits{})
	pid, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", counterScript}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	lines := counterLines(t, td, id, pid)
	if len(lines) == 0 {
		t.Fatal("counter logged nothing")
	}
	at, _ := strconv.Atoi(lines[len(lines)-1][0])
	st := &fidelityState{counterPid: pid, random: lines[0][1], counterAt: at}
	images := t.TempDir()
	if _, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	rs, err := td.Restore(ctx, sandbox.Spec{ID: id}, images, sandbox.RestoreOptions{Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("lazy restore: %+v", rs)
	if !rs.Lazy {
		t.Error("RestoreStats.Lazy is false")
	}
	noUserfaultfd(t, td, id)
	time.Sleep(400 * time.Millisecond)
	if err := checkMemory(t, td, id, st); err != nil {
		t.Error(err)
	}
}

// noUserfaultfd fails t if a process of sandbox id holds /dev/userfaultfd
// or a userfaultfd: CRIU's lazy restore must close both before restored
// code runs (scripts/setup/criu-4.1.1-uffd-dev.patch).
func noUserfaultfd(t *testing.T, td *testDriver, id string) {
	t.Helper()
	ls, err := td.container(id)
	if err != nil {
		t.Fatal(err)
	}
	toHost, _, err := td.sandboxPids(ls)
	if err != nil {
		t.Fatal(err)
	}
	for _, hp := range toHost {
		fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", hp))
		for _, fd := range fds {
			if l, _ := os.Readlink(fd); strings.Contains(l, "userfaultfd") {
				t.Errorf("sandbox process %d holds %s (%s)", hp, l, fd)
			}
		}
	}
}

// groupAlive reports whether any process (zombies included) is in process
// group pgid.
func groupAlive(pgid int) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pg, err := syscall.Getpgid(pid); err == nil && pg == pgid {
			return true
		}
	}
	return false
}

// sqliteWriter opens a write transaction on a SQLite database (holding its
// lock), inserts a row tagged with a random value held only in memory, and
// commits a second row once /root/go exists.
const sqliteWriter = `
import os, random, sqlite3, time
r = random.getrandbits(64)
db = sqlite3.connect("/root/db.sqlite", isolation_level=None, timeout=0)
db.execute("create table if not exists t(v text)")
db.execute("begin immediate")
db.execute("insert into t values (?)", ("before-%d" % r,))
print("locked %d" % r, flush=True)
while not os.path.exists("/root/go"):
    time.sleep(0.05)
db.execute("insert into t values (?)", ("after-%d" % r,))
db.execute("commit")
print("committed", flush=True)
time.sleep(1000000)
`

// TestCheckpointSQLite is fidelity item 6 (SQLite): a process with an open
// write transaction, holding the database's lock, is checkpointed, killed
// and restored; the lock is still held (another writer fails at once) and
// the transaction commits afterwards. It needs the python template
// (scripts/setup/python-template.sh) and skips without it.
func TestCheckpointSQLite(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	cache := os.Getenv("AMBER_CACHE")
	if cache == "" {
		cache = "/var/cache/amber"
	}
	m, _ := filepath.Glob(filepath.Join(cache, "templates", "python-*", "rootfs", "usr", "bin", "python3"))
	if len(m) == 0 {
		t.Skip("no python template (make setup)")
	}
	tmpl := sandbox.Template{Name: "python", RootFS: filepath.Dir(filepath.Dir(filepath.Dir(m[len(m)-1])))}
	ctx := context.Background()
	start := time.Now()
	newSandbox := func() (string, int, string) {
		id := newID("sql")
		if _, err := td.Create(ctx, sandbox.Spec{ID: id, Template: tmpl}); err != nil {
			t.Fatal(err)
		}
		pid, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"python3", "-c", sqliteWriter}})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; ; i++ {
			out, _, _ := td.run(id, "cat", fmt.Sprintf("/run/amber/proc/%d.log", pid))
			if r, ok := strings.CutPrefix(strings.TrimSpace(out), "locked "); ok {
				return id, pid, r
			}
			if i > 200 {
				t.Fatalf("sqlite writer: %q", out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	check := func(id string, pid int, r string) error {
		_, errs, st := td.run(id, "python3", "-c", `import sqlite3; sqlite3.connect("/root/db.sqlite", timeout=0, isolation_level=None).execute("begin immediate")`)
		if st.Code == 0 {
			return errors.New("a second writer got the lock: the transaction's lock is gone")
		}
		if !strings.Contains(errs, "locked") {
			return fmt.Errorf("second writer: %s", errs)
		}
		td.sh(id, "touch /root/go")
		for i := 0; ; i++ {
			out, _, _ := td.run(id, "cat", fmt.Sprintf("/run/amber/proc/%d.log", pid))
			if strings.Contains(out, "committed") {
				break
			}
			if i > 100 {
				return fmt.Errorf("transaction did not commit: %q", out)
			}
			time.Sleep(50 * time.Millisecond)
		}
		out := td.sh(id, `python3 -c 'import sqlite3; print(sorted(v for (v,) in sqlite3.connect("/root/db.sqlite").execute("select v from t")))'`)
		if want := fmt.Sprintf("['after-%s', 'before-%s']", r, r); strings.TrimSpace(out) != want {
			return fmt.Errorf("rows %s, want %s", strings.TrimSpace(out), want)
		}
		return nil
	}

	id, pid, r := newSandbox()
	images := t.TempDir()
	if _, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := td.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := td.Restore(ctx, sandbox.Spec{ID: id, Template: tmpl}, images, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := check(id, pid, r); err != nil {
		t.Errorf("after restore: %v", err)
	}
	if err := td.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	// Control: a fresh sandbox with the same workload, never restored.
	fresh, fpid, _ := newSandbox()
	if err := check(fresh, fpid, r); err == nil {
		t.Error("passes on a fresh sandbox that was never restored: the check proves nothing")
	} else {
		t.Logf("on a fresh sandbox the check fails as it must: %v", err)
	}
	t.Logf("TestCheckpointSQLite took %v", time.Since(start))
}
