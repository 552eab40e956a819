package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// The fidelity suite for the gvisor driver (issue 4): one sandbox holds
// every kind of state at once (an in-memory counter, a process tree, the
// environment of a running process, a tmpfs file, a loopback TCP
// connection, files of the layer); it is checkpointed, a file is written
// after the cut, the sandbox is killed (SIGKILL of everything) and
// restored; each kind is then checked. Every check also runs against a
// fresh sandbox with the same workloads that was never restored, where it
// must fail: all state carries a random value drawn inside the sandbox and
// held only in memory, so a restart cannot pass for a restore. Finally the
// image is restored by a second driver with a fresh state directory (another
// node).
//
//	go test -count=1 -run TestCheckpoint -v ./drivers/gvisor

// rnd draws a random number inside the sandbox and keeps it in a shell
// variable only.
const rnd = `$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')`

// Workloads (each is Start'ed: its output goes to /run/amber/proc/<pid>.log).
const (
	// memory: a counter and a random value, only in memory.
	memScript = `R=` + rnd + `; i=0; while :; do i=$((i+1)); echo "$R $i"; sleep 0.05; done`
	// processes: a parent with two children mid-loop.
	procScript = `R=` + rnd + `; for c in 1 2; do (j=0; while :; do j=$((j+1)); echo "$R c$c $j"; sleep 0.05; done) & done; wait`
	// environment: a random variable exported by the process itself.
	envScript = `export AMBER_RND=` + rnd + `; exec sleep 100000`
	// TCP: an echo server and a client sending a numbered line every 100ms.
	tcpServer = `exec nc -l -p 7777 -e /bin/cat`
	tcpClient = `R=` + rnd + `; i=0; while :; do i=$((i+1)); echo "$R $i"; sleep 0.1; done | nc 127.0.0.1 7777`
)

// filesScript writes the layer state: new files, a symlink, a hard link, a
// set-uid file, a whiteout (a template file removed) and an opaque
// directory (a template directory removed and made again).
const filesScript = `set -e
dd if=/dev/urandom of=/root/before.bin bs=1k count=256 2>/dev/null
ln -s before.bin /root/link
ln /root/before.bin /root/hard
echo suid > /root/suid; chmod 4755 /root/suid
rm /bin/vi
rm -r /usr/sbin; mkdir /usr/sbin; echo new > /usr/sbin/new
`

// filesProbe prints what filesScript made (compared before and after).
const filesProbe = `sha256sum /root/before.bin /root/hard; readlink /root/link
stat -c '%n %a %u %g %s %h' /root/before.bin /root/suid
ls -A /usr/sbin; [ -e /bin/vi ] && echo vi-present || echo vi-absent
[ -e /root/after.txt ] && echo after-present || echo after-absent`

// tmpfsSetup puts a random file in a tmpfs: a tmpfs mounted inside if
// gVisor lets the sandbox mount one (it lacks CAP_SYS_ADMIN), else /dev/shm
// (a tmpfs of the bundle). It prints the directory used.
const tmpfsSetup = `d=/dev/shm; if mkdir -p /mnt/t 2>/dev/null && mount -t tmpfs tmpfs /mnt/t 2>/dev/null; then d=/mnt/t; fi
dd if=/dev/urandom of=$d/blob bs=1k count=64 2>/dev/null; echo $d`

// workload is what runs in one sandbox.
type workload struct {
	mem, proc, env, server, client int
	tmpfsDir                       string
}

// snapshot is what the checks compare with.
type snapshot struct {
	memLine    string // last line of the counter's log
	procLines  map[string]string
	procs      map[int]uint64 // pid → start ticks of the process tree
	environ    string
	tmpfsSum   string
	clientLine string
	tcpPIDs    map[int]uint64
	files      string
}

func TestCheckpoint(t *testing.T) {
	runsc := requireHost(t)
	tmpl := minimalTemplate(t)
	ctx := context.Background()
	start := time.Now()
	d := newTestDriver(t, runsc, "/amber/gvisor-ckpt")
	if !d.Capabilities().Checkpoint {
		t.Fatal("Capabilities().Checkpoint is false")
	}
	id := fmt.Sprintf("ckpt-%d", os.Getpid())
	spec := sandbox.Spec{ID: id, Template: tmpl}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	w := startWorkload(t, d, id)
	time.Sleep(300 * time.Millisecond)
	before := takeSnapshot(t, d, id, w)
	t.Logf("before: mem %q, client %q, %d processes", before.memLine, before.clientLine, len(before.procs))

	imageDir := filepath.Join(t.TempDir(), "image")
	cs, err := d.Checkpoint(ctx, id, imageDir, sandbox.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint: frozen %v, total %v, memory %d B, layer %d B", cs.Frozen, cs.Total, cs.MemoryBytes, cs.LayerBytes)
	// After the cut: the sandbox keeps running and writes a file.
	mustSh(t, d, id, `echo after > /root/after.txt`)
	time.Sleep(200 * time.Millisecond)
	killStopped(t, d, id)
	execs, states := d.runscCalls("agent:exec"), d.runscCalls("state")
	// Lazy, as the engine asks (the second restore below is eager).
	rs, err := d.Restore(ctx, spec, imageDir, sandbox.RestoreOptions{Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore: running after %v, %d processes, %d B memory, %d files, %d connections", rs.Running, rs.Processes, rs.MemoryBytes, rs.Files, rs.ConnectionsRestored)
	if rs.Processes < 7 || rs.MemoryBytes != cs.MemoryBytes || rs.ConnectionsRestored < 2 {
		t.Errorf("restore stats: %+v", rs)
	}
	// The counts are the agent's census: the restore started no process.
	if n := d.runscCalls("agent:exec") - execs; n != 0 {
		t.Errorf("the restore ran %d execs in the sandbox to count what came back", n)
	}
	// Nothing of the killed sandbox ran: runsc was not asked its state.
	if n := d.runscCalls("state") - states; n != 0 {
		t.Errorf("the restore of a killed sandbox ran runsc state %d times", n)
	}
	time.Sleep(500 * time.Millisecond)
	checks := []struct {
		name  string
		check func(v view, w workload, before snapshot) error
	}{
		{"1-memory", checkMemory},
		{"2-files", checkFiles},
		{"3-processes", checkProcesses},
		{"7-env-tmpfs", checkEnvTmpfs},
		{"9-tcp", checkTCP},
	}
	v, err := observe(d, id, w)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			if err := c.check(v, w, before); err != nil {
				t.Error(err)
			}
		})
	}

	// The same checks against a sandbox that was never restored must fail.
	ctl := id + "-fresh"
	if _, err := d.Create(ctx, sandbox.Spec{ID: ctl, Template: tmpl}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), ctl) })
	wc := startWorkload(t, d, ctl)
	time.Sleep(500 * time.Millisecond)
	vc, err := observe(d, ctl, wc)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		t.Run(c.name+"-fresh-must-fail", func(t *testing.T) {
			err := c.check(vc, wc, before)
			if err == nil {
				t.Error("the check passes on a sandbox that was never restored: it proves nothing")
			} else {
				t.Logf("fails as it must: %v", err)
			}
		})
	}
	if err := d.Destroy(ctx, ctl); err != nil {
		t.Fatal(err)
	}

	// A second restore of the same image on another "node": a new driver
	// with a fresh state directory (and its own cgroup parent).
	if err := d.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	d2 := newTestDriver(t, runsc, "/amber/gvisor-ckpt2")
	rs2, err := d2.Restore(ctx, spec, imageDir, sandbox.RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d2.Destroy(context.Background(), id) })
	t.Logf("restore on a fresh state dir: running after %v, %d processes", rs2.Running, rs2.Processes)
	v2, err := observe(d2, id, w)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		t.Run(c.name+"-fresh-node", func(t *testing.T) {
			if err := c.check(v2, w, before); err != nil {
				t.Error(err)
			}
		})
	}

	// Refusals: another template version; a running sandbox.
	bad := spec
	bad.Template.Version = "other"
	if _, err := d2.Restore(ctx, bad, imageDir, sandbox.RestoreOptions{}); err == nil || !strings.Contains(err.Error(), "template") {
		t.Errorf("restore with another template version: %v", err)
	}
	if _, err := d2.Restore(ctx, spec, imageDir, sandbox.RestoreOptions{}); err == nil {
		t.Error("restore over a running sandbox succeeded")
	}

	// LeaveStopped: the cut stops the sandbox; a restore brings it back
	// (a second-generation image: a checkpoint of a restored sandbox).
	image2 := filepath.Join(t.TempDir(), "image2")
	cs2, err := d2.Checkpoint(ctx, id, image2, sandbox.CheckpointOptions{LeaveStopped: true})
	if err != nil {
		t.Fatal(err)
	}
	if info, err := d2.Inspect(ctx, id); err != nil || info.State != sandbox.StateStopped {
		t.Errorf("after a LeaveStopped checkpoint: %+v %v", info, err)
	}
	if _, err := d2.Restore(ctx, spec, image2, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	v3, err := observe(d2, id, w)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkMemory(v3, w, before); err != nil {
		t.Errorf("after LeaveStopped checkpoint (frozen %v) and restore: %v", cs2.Frozen, err)
	}
	if err := checkProcesses(v3, w, before); err != nil {
		t.Errorf("after LeaveStopped checkpoint and restore: %v", err)
	}
	t.Logf("TestCheckpoint took %v", time.Since(start))
}

func newTestDriver(t *testing.T, runsc, cg string) *Driver {
	d, err := New(Options{StateDir: testStateDir(t), RunscPath: runsc, CgroupParent: testCgroupParent(t, cg), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func startWorkload(t *testing.T, d *Driver, id string) workload {
	t.Helper()
	ctx := context.Background()
	st := func(script string) int {
		pid, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", script}, Env: []string{"AMBER_FIXED=yes"}})
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	var w workload
	w.mem = st(memScript)
	w.proc = st(procScript)
	w.env = st(envScript)
	w.server = st(tcpServer)
	mustSh(t, d, id, `for i in $(seq 100); do netstat -ltn | grep -q ':7777 ' && exit 0; sleep 0.02; done; exit 1`)
	w.client = st(tcpClient)
	mustSh(t, d, id, filesScript)
	w.tmpfsDir = strings.TrimSpace(mustSh(t, d, id, tmpfsSetup))
	return w
}

// killStopped kills sandbox id and waits (10 s at most) until the driver
// reports it stopped.
func killStopped(t *testing.T, d *Driver, id string) {
	t.Helper()
	ctx := context.Background()
	if err := d.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		info, err := d.Inspect(ctx, id)
		if err == nil && info.State == sandbox.StateStopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after Kill: %+v %v", info, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func mustSh(t *testing.T, d *Driver, id, script string) string {
	t.Helper()
	out, err := sh(d, id, script)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sh(d *Driver, id, script string) (string, error) {
	var out, errb bytes.Buffer
	st, err := d.Exec(context.Background(), id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", script}, Stdout: &out, Stderr: &errb, Timeout: time.Minute})
	if err != nil {
		return "", err
	}
	if st.Code != 0 {
		return out.String(), fmt.Errorf("%q in %s: exit %d: %s", script, id, st.Code, errb.String())
	}
	return out.String(), nil
}

// view is one observation of a sandbox: its processes, the logs of the
// workloads read twice 400ms apart, and the probes of the other state.
type view struct {
	ps           []sandbox.Process
	logs1, logs2 map[int][]string
	files        string
	environ      string
	tmpfsSum     string
}

// readLogs reads the logs of pids in one exec.
func readLogs(d *Driver, id string, pids ...int) (map[int][]string, error) {
	var script strings.Builder
	for _, p := range pids {
		fmt.Fprintf(&script, "echo '== %d'; cat %s/%d.log; ", p, procLogDir, p)
	}
	out, err := sh(d, id, script.String())
	if err != nil {
		return nil, err
	}
	m := map[int][]string{}
	cur := 0
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if v, ok := strings.CutPrefix(l, "== "); ok {
			cur, _ = strconv.Atoi(v)
			m[cur] = nil
			continue
		}
		m[cur] = append(m[cur], l)
	}
	return m, nil
}

func observe(d *Driver, id string, w workload) (view, error) {
	var v view
	var err error
	if v.ps, err = d.Processes(context.Background(), id); err != nil {
		return v, err
	}
	logs := []int{w.mem, w.proc, w.client}
	if v.logs1, err = readLogs(d, id, logs...); err != nil {
		return v, err
	}
	time.Sleep(400 * time.Millisecond)
	if v.logs2, err = readLogs(d, id, logs...); err != nil {
		return v, err
	}
	if v.files, err = sh(d, id, filesProbe); err != nil {
		return v, err
	}
	if v.environ, err = sh(d, id, fmt.Sprintf("tr '\\000' '\\n' < /proc/%d/environ | sort", w.env)); err != nil {
		return v, err
	}
	if v.tmpfsSum, err = sh(d, id, "sha256sum "+w.tmpfsDir+"/blob"); err != nil {
		return v, err
	}
	return v, nil
}

func lastLine(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return lines[len(lines)-1]
}

func takeSnapshot(t *testing.T, d *Driver, id string, w workload) snapshot {
	t.Helper()
	v, err := observe(d, id, w)
	if err != nil {
		t.Fatal(err)
	}
	var s snapshot
	s.procs = treeOf(v.ps, w.proc)
	if len(s.procs) != 3 {
		t.Fatalf("process tree of %d: %v (all: %+v)", w.proc, s.procs, v.ps)
	}
	s.tcpPIDs = tcpTree(v.ps, w)
	s.memLine = lastLine(v.logs1[w.mem])
	s.procLines = lastPerChild(v.logs1[w.proc])
	if len(s.procLines) != 2 {
		t.Fatalf("children's log: %q", v.logs1[w.proc])
	}
	s.clientLine = lastLine(v.logs1[w.client])
	if s.clientLine == "" || s.memLine == "" {
		t.Fatalf("logs: %v", v.logs1)
	}
	s.environ = v.environ
	if !strings.Contains(s.environ, "AMBER_RND=") || !strings.Contains(s.environ, "AMBER_FIXED=yes") {
		t.Fatalf("environ: %q", s.environ)
	}
	s.tmpfsSum = v.tmpfsSum
	s.files = v.files
	return s
}

// tcpTree is the server, the client and the client's children.
func tcpTree(ps []sandbox.Process, w workload) map[int]uint64 {
	m := map[int]uint64{}
	for _, p := range ps {
		if p.PID == w.server || p.PID == w.client || p.PPID == w.client {
			m[p.PID] = p.StartTicks
		}
	}
	return withoutSleeps(ps, m)
}

// treeOf returns pid and its children that are not short-lived sleeps.
func treeOf(ps []sandbox.Process, pid int) map[int]uint64 {
	m := map[int]uint64{}
	for _, p := range ps {
		if p.PID == pid || p.PPID == pid {
			m[p.PID] = p.StartTicks
		}
	}
	return withoutSleeps(ps, m)
}

func withoutSleeps(ps []sandbox.Process, m map[int]uint64) map[int]uint64 {
	for _, p := range ps {
		if _, ok := m[p.PID]; ok && len(p.Args) > 0 && filepath.Base(p.Args[0]) == "sleep" {
			delete(m, p.PID)
		}
	}
	return m
}

// lastPerChild returns the last line of each child ("R cN j") by child.
func lastPerChild(lines []string) map[string]string {
	m := map[string]string{}
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 3 {
			m[f[1]] = l
		}
	}
	return m
}

// consecutive checks that lines ("<prefix> n") all have the prefix of
// want (the random value drawn at start) and count up by one with no gap
// or repeat, and that want (a line written before the cut) is among them.
func consecutive(lines []string, want string) (last int, err error) {
	i := strings.LastIndexByte(want, ' ')
	prefix := want[:i+1]
	prev := -1
	seen := false
	for _, l := range lines {
		if !strings.HasPrefix(l, prefix) {
			return 0, fmt.Errorf("line %q lacks %q (another random value: a restart)", l, prefix)
		}
		n, err := strconv.Atoi(strings.TrimPrefix(l, prefix))
		if err != nil {
			return 0, fmt.Errorf("line %q: %v", l, err)
		}
		if prev >= 0 && n != prev+1 {
			return 0, fmt.Errorf("counter goes %d → %d", prev, n)
		}
		prev = n
		seen = seen || l == want
	}
	if !seen {
		return 0, fmt.Errorf("the value before the cut %q is not in the log", want)
	}
	return prev, nil
}

// continues checks a log read twice 400ms apart: consecutive both times,
// and growing (the writer runs now, after the restore).
func continues(l1, l2 []string, want string) error {
	n1, err := consecutive(l1, want)
	if err != nil {
		return err
	}
	n2, err := consecutive(l2, want)
	if err != nil {
		return err
	}
	if n2 <= n1 {
		return fmt.Errorf("counter stopped at %d", n2)
	}
	return nil
}

func checkMemory(v view, w workload, before snapshot) error {
	return continues(v.logs1[w.mem], v.logs2[w.mem], before.memLine)
}

func checkFiles(v view, w workload, before snapshot) error {
	if v.files != before.files {
		return fmt.Errorf("files differ:\n%s\nwant:\n%s", v.files, before.files)
	}
	if !strings.Contains(v.files, "after-absent") || !strings.Contains(v.files, "vi-absent") {
		return fmt.Errorf("files: %s", v.files)
	}
	return nil
}

func checkProcesses(v view, w workload, before snapshot) error {
	now := treeOf(v.ps, w.proc)
	if fmt.Sprint(now) != fmt.Sprint(before.procs) {
		return fmt.Errorf("process tree (pid → start ticks) %v, want %v", now, before.procs)
	}
	for c, want := range before.procLines {
		mine := func(lines []string) []string {
			var out []string
			for _, l := range lines {
				if f := strings.Fields(l); len(f) == 3 && f[1] == c {
					out = append(out, l)
				}
			}
			return out
		}
		if err := continues(mine(v.logs1[w.proc]), mine(v.logs2[w.proc]), want); err != nil {
			return fmt.Errorf("child %s: %v", c, err)
		}
	}
	return nil
}

func checkEnvTmpfs(v view, w workload, before snapshot) error {
	if v.environ != before.environ {
		return fmt.Errorf("environ of %d: %q, want %q", w.env, v.environ, before.environ)
	}
	if v.tmpfsSum != before.tmpfsSum {
		return fmt.Errorf("tmpfs file: %q, want %q", v.tmpfsSum, before.tmpfsSum)
	}
	return nil
}

func checkTCP(v view, w workload, before snapshot) error {
	now := map[int]uint64{}
	for _, p := range v.ps {
		if _, ok := before.tcpPIDs[p.PID]; ok {
			now[p.PID] = p.StartTicks
		}
	}
	if fmt.Sprint(now) != fmt.Sprint(before.tcpPIDs) {
		return fmt.Errorf("TCP processes (pid → start ticks) %v, want %v", now, before.tcpPIDs)
	}
	return continues(v.logs1[w.client], v.logs2[w.client], before.clientLine)
}

// TestCheckpointBenchmark measures Checkpoint and Restore for 10 MiB and
// 256 MiB of touched memory (a static Go program built here, copied into
// the sandbox, that fills N MiB with random bytes and sleeps), next to raw
// `runsc checkpoint` and `runsc restore` of the same sandbox. It runs only
// with AMBER_BENCH=1:
//
//	AMBER_BENCH=1 go test -count=1 -run TestCheckpointBenchmark -v ./drivers/gvisor
func TestCheckpointBenchmark(t *testing.T) {
	if os.Getenv("AMBER_BENCH") != "1" {
		t.Skip("set AMBER_BENCH=1 to run")
	}
	runsc := requireHost(t)
	tmpl := minimalTemplate(t)
	ctx := context.Background()
	hog := buildHog(t)
	d := newTestDriver(t, runsc, "/amber/gvisor-ckpt-bench")
	rounds := 5
	if v, err := strconv.Atoi(os.Getenv("AMBER_BENCH_N")); err == nil && v > 0 {
		rounds = v
	}
	for _, mib := range []int{10, 256} {
		id := fmt.Sprintf("ckbench-%d-%d", os.Getpid(), mib)
		spec := sandbox.Spec{ID: id, Template: tmpl, Limits: sandbox.Limits{MemoryBytes: 1 << 30}}
		if _, err := d.Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
		putFile(t, d, id, hog, "/root/hog")
		if _, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/root/hog", strconv.Itoa(mib)}}); err != nil {
			t.Fatal(err)
		}
		mustSh(t, d, id, `for i in $(seq 600); do grep -q ready `+procLogDir+`/*.log 2>/dev/null && exit 0; sleep 0.05; done; exit 1`)
		var frozen, total, running, rawCk, rawRs, rawBg, rawBgExec []time.Duration
		var mem int64
		for r := 0; r < rounds; r++ {
			dir := filepath.Join(t.TempDir(), "img")
			cs, err := d.Checkpoint(ctx, id, dir, sandbox.CheckpointOptions{})
			if err != nil {
				t.Fatal(err)
			}
			frozen, total, mem = append(frozen, cs.Frozen), append(total, cs.Total), cs.MemoryBytes
			if err := d.Kill(ctx, id); err != nil {
				t.Fatal(err)
			}
			rs, err := d.Restore(ctx, spec, dir, sandbox.RestoreOptions{})
			if err != nil {
				t.Fatal(err)
			}
			running = append(running, rs.Running)
			os.RemoveAll(dir)

			// Raw runsc on the same sandbox: checkpoint (leave running),
			// then kill, delete and restore with the same bundle.
			rec, err := d.loadRecord(id)
			if err != nil {
				t.Fatal(err)
			}
			raw := filepath.Join(t.TempDir(), "raw")
			os.MkdirAll(raw, 0o700)
			t0 := time.Now()
			if out, err := d.command(ctx, append(d.globalFlags(rec, ""), "checkpoint", "--image-path="+raw, "--compression=none", "--leave-running", runtimeID(id))...).CombinedOutput(); err != nil {
				t.Fatalf("raw checkpoint: %v %s", err, out)
			}
			rawCk = append(rawCk, time.Since(t0))
			if err := d.Kill(ctx, id); err != nil {
				t.Fatal(err)
			}
			if out, err := d.command(ctx, append(d.globalFlags(rec, ""), "delete", "--force", runtimeID(id))...).CombinedOutput(); err != nil {
				t.Fatalf("raw delete: %v %s", err, out)
			}
			t0 = time.Now()
			// stdio /dev/null: the restored sandbox inherits it.
			logFile := filepath.Join(raw, "restore.log")
			if err := d.command(ctx, append(d.globalFlags(rec, logFile), "restore", "--detach", "--image-path="+raw, "--bundle="+d.bundleDir(id), runtimeID(id))...).Run(); err != nil {
				t.Fatalf("raw restore: %v %q", err, logMessages(logFile))
			}
			rawRs = append(rawRs, time.Since(t0))
			// The same image restored with --background (pages load
			// after runsc returns), until an exec runs.
			if err := d.Kill(ctx, id); err != nil {
				t.Fatal(err)
			}
			if out, err := d.command(ctx, append(d.globalFlags(rec, ""), "delete", "--force", runtimeID(id))...).CombinedOutput(); err != nil {
				t.Fatalf("raw delete: %v %s", err, out)
			}
			t0 = time.Now()
			if err := d.command(ctx, append(d.globalFlags(rec, logFile), "restore", "--detach", "--background", "--image-path="+raw, "--bundle="+d.bundleDir(id), runtimeID(id))...).Run(); err != nil {
				t.Fatalf("raw restore --background: %v %q", err, logMessages(logFile))
			}
			rawBg = append(rawBg, time.Since(t0))
			mustSh(t, d, id, "true")
			rawBgExec = append(rawBgExec, time.Since(t0))
			os.RemoveAll(raw)
		}
		t.Logf("%d MiB touched (memory image %.1f MiB), %d rounds: Checkpoint frozen p50 %v max %v, total p50 %v; Restore to running p50 %v max %v; raw `runsc checkpoint --leave-running` p50 %v, raw `runsc restore --detach` p50 %v",
			mib, float64(mem)/(1<<20), rounds, pct(frozen, 50), pct(frozen, 100), pct(total, 50), pct(running, 50), pct(running, 100), pct(rawCk, 50), pct(rawRs, 50))
		t.Logf("%d MiB: raw `runsc restore --detach --background` returns p50 %v, first exec done p50 %v", mib, pct(rawBg, 50), pct(rawBgExec, 50))
		if err := d.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// buildHog builds a static program that fills argv[1] MiB with random
// bytes, prints "ready" and sleeps.
func buildHog(t *testing.T) string {
	src := `package main

import (
	"crypto/rand"
	"fmt"
	"os"
	"strconv"
	"time"
)

var keep []byte

func main() {
	n, _ := strconv.Atoi(os.Args[1])
	keep = make([]byte, n<<20)
	rand.Read(keep)
	fmt.Println("ready")
	for {
		time.Sleep(time.Hour)
	}
}
`
	return buildStatic(t, "hog", src)
}

// putFile copies the host file src into sandbox id at path, executable.
func putFile(t *testing.T, d *Driver, id, src, path string) {
	t.Helper()
	ctx := context.Background()
	fsys, err := d.Files(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := fsys.WriteFile(ctx, path, f, 0o755); err != nil {
		t.Fatal(err)
	}
}

// buildStatic builds the Go program src (one main.go, the standard library
// only) as a static binary named name and returns its path.
func buildStatic(t *testing.T, name, src string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module "+name+"\n\ngo 1.22\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", name, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v %s", name, err, out)
	}
	return filepath.Join(dir, name)
}
