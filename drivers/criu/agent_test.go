package criu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/core/sandbox/sandboxtest"
	"github.com/amber-run/amber/drivers/internal/confinedfs"
	"github.com/amber-run/amber/lib/agentproto"
)

// Issue 20: every sandbox's init is amber-agent; Exec, Start and Signal go
// through it, never through libcontainer's exec.
//
//	go test -tags seccomp -count=1 -run 'TestAgent' -v ./drivers/criu

// pythonTemplate is the python template `make setup` builds; the test
// skips without it.
func pythonTemplate(t *testing.T) sandbox.Template {
	t.Helper()
	cache := os.Getenv("AMBER_CACHE")
	if cache == "" {
		cache = "/var/cache/amber"
	}
	m, _ := filepath.Glob(filepath.Join(cache, "templates", "python-*", "rootfs", "usr", "bin", "python3"))
	if len(m) == 0 {
		t.Skip("no python template (make setup)")
	}
	return sandbox.Template{Name: "python", RootFS: filepath.Dir(filepath.Dir(filepath.Dir(m[len(m)-1])))}
}

// TestAgentNoLibcontainerExec: Exec (plain, stdin, TTY, timeout), Start,
// Signal and Wait, many times, start no process with libcontainer's exec;
// the agent is the init, bound read-only at agentproto.Path, and its
// token is not in any process's environment.
func TestAgentNoLibcontainerExec(t *testing.T) {
	td := newTestDriver(t)
	ctx := context.Background()
	id := td.create(sandbox.Limits{})
	before := libcontainerExecs.Load()
	for i := range 30 {
		var out bytes.Buffer
		st, err := td.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"sh", "-c", "cat; echo $((" + strconv.Itoa(i) + "+1))"}, Stdin: strings.NewReader("in "), Stdout: &out})
		if err != nil || st.Code != 0 || out.String() != fmt.Sprintf("in %d\n", i+1) {
			t.Fatalf("exec %d: %+v %v %q", i, st, err, out.String())
		}
	}
	var tty bytes.Buffer
	if st, err := td.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"sh", "-c", "tty"}, TTY: true, Stdout: &tty}); err != nil || st.Code != 0 || !strings.Contains(tty.String(), "/dev/pts/") {
		t.Fatalf("tty exec: %+v %v %q", st, err, tty.String())
	}
	// The agent's terminal, its first size, resized while it runs; the
	// command's pid before its output.
	tty.Reset()
	resize := make(chan sandbox.WindowSize, 1)
	started := 0
	st, err := td.Exec(ctx, id, sandbox.ExecSpec{
		Args: []string{"sh", "-c", "stty size; read x; stty size"}, TTY: true, Stdout: &tty,
		Size: sandbox.WindowSize{Rows: 30, Cols: 100}, Resize: resize,
		Stdin: readerFunc(func(p []byte) (int, error) { time.Sleep(600 * time.Millisecond); return copy(p, "\n"), io.EOF }),
		Started: func(pid int) {
			started = pid
			time.AfterFunc(150*time.Millisecond, func() { resize <- sandbox.WindowSize{Rows: 40, Cols: 120} })
		},
	})
	if got := strings.ReplaceAll(tty.String(), "\r\n", "\n"); err != nil || st.Code != 0 || started <= 1 || !strings.HasPrefix(got, "30 100\n") || !strings.HasSuffix(got, "40 120\n") {
		t.Fatalf("tty size and resize: %+v %v started %d %q", st, err, started, got)
	}
	if st, err := td.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"sleep", "100"}, Timeout: 200 * time.Millisecond}); err != nil || !st.TimedOut {
		t.Fatalf("timeout: %+v %v", st, err)
	}
	for range 10 {
		pid, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"sleep", "1000"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := td.Signal(ctx, id, pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if st, err := td.Wait(ctx, id, pid); err != nil || st.Signal != "SIGTERM" {
			t.Fatalf("wait: %+v %v", st, err)
		}
	}
	if err := td.Signal(ctx, id, 1, syscall.SIGKILL); !errdefs.IsNotFound(err) {
		t.Fatalf("signal to the agent: %v, want not found", err)
	}
	if n := libcontainerExecs.Load() - before; n != 0 {
		t.Fatalf("%d libcontainer execs, want 0", n)
	}
	// The init is the agent, from its read-only bind in /dev's tmpfs.
	if got := td.sh(id, "tr '\\000' ' ' < /proc/1/cmdline; grep ' /dev/.amber-agent ' /proc/self/mountinfo | cut -d' ' -f6"); got != agentproto.Path+" ro,nosuid,nodev,relatime\n" {
		t.Errorf("init and its mount: %q", got)
	}
	rec, err := td.loadRecord(id)
	if err != nil || !rec.hasAgent() || rec.AgentBuild != td.agentBuild || len(rec.AgentToken) != 64 {
		t.Fatalf("record: %+v %v", rec, err)
	}
	if fi, err := os.Stat(td.recordPath(id)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("record mode: %v %v", fi.Mode(), err)
	}
	// A command of a non-root template user cannot read the token (the
	// kernel still shows the agent's first environment in /proc/1/environ,
	// to sandbox root only).
	user := newID("user")
	if _, err := td.Create(ctx, sandbox.Spec{ID: user, Template: sandbox.Template{RootFS: minimalRootfs(t), User: "1000:1000"}}); err != nil {
		t.Fatal(err)
	}
	if out := td.sh(user, "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\000' '\\n' | grep -c "+agentproto.TokenEnv+" || true"); strings.TrimSpace(out) != "0" {
		t.Errorf("the token is in an environment a non-root command can read: %s", out)
	}
}

// TestAgentLegacySandbox: a sandbox whose init is the old sh reaper (made,
// or checkpointed, before the agent) keeps libcontainer's exec path, also
// after a checkpoint and restore, and has no agent output.
func TestAgentLegacySandbox(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	ctx := context.Background()
	createLegacy = true
	id := td.create(sandbox.Limits{})
	createLegacy = false
	// libcontainer's Run returns once its init was told to go, not once it
	// has exec'd the reaper: until then /proc/1 is the test binary's init.
	var out string
	waitFor(t, 10*time.Second, func() bool {
		out = td.sh(id, "cat /proc/1/cmdline | tr '\\000' ' '")
		return strings.Contains(out, "sleep 86400")
	})
	before := libcontainerExecs.Load()
	pid, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"sh", "-c", "echo bg; exec sleep 1000"}})
	if err != nil {
		t.Fatal(err)
	}
	images := t.TempDir()
	if _, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := td.Restore(ctx, sandbox.Spec{ID: id}, images, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := td.sh(id, fmt.Sprintf("cat /run/amber/proc/%d.log; kill -0 %d && echo alive", pid, pid)); got != "bg\nalive\n" {
		t.Fatalf("after restore: %q", got)
	}
	if err := td.Signal(ctx, id, pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if st, err := td.Wait(ctx, id, pid); err != nil || st.Signal != "SIGKILL" {
		t.Fatalf("wait: %+v %v", st, err)
	}
	if n := libcontainerExecs.Load() - before; n < 2 { // the Start and the exec after the restore
		t.Errorf("%d libcontainer execs in a legacy sandbox, want its commands to take that path", n)
	}
	if err := td.Output(ctx, id, pid, 0, false, func(sandbox.OutputFrame) error { return nil }); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("output of a legacy sandbox: %v, want failed precondition", err)
	}
	fs, err := td.Files(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fs.(*confinedfs.FS); !ok {
		t.Errorf("the files of a legacy sandbox are a %T, want the host-side confinedfs", fs)
	}
	sandboxtest.HostSideFiles(t, fs, func(script string) string { return td.sh(id, script) })
}

// stream collects one process's output through Driver.Output, checking
// that offsets run on without gap or repeat.
type stream struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	offset int64
	kinds  []string
	exit   *sandbox.ExitStatus
}

func (s *stream) frame(f sandbox.OutputFrame) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch f.Kind {
	case "stdout", "stderr":
		if f.Offset != s.offset {
			return fmt.Errorf("frame at %d, want %d", f.Offset, s.offset)
		}
		s.buf.Write(f.Data)
		s.offset += int64(len(f.Data))
	case "exited":
		s.exit = f.Exit
	default:
		s.kinds = append(s.kinds, f.Kind)
	}
	return nil
}

func (s *stream) snapshot() (string, int64, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String(), s.offset, append([]string(nil), s.kinds...)
}

// counterScript prints line0, line1, ... every 10 ms.
const lineCounter = `i=0; while :; do echo line$i; i=$((i+1)); sleep 0.01; done`

// checkLines reports whether out is line0..lineN (N >= min), each once.
func checkLines(out string, min int) error {
	sc := bufio.NewScanner(strings.NewReader(out))
	n := 0
	for sc.Scan() {
		if sc.Text() != "line"+strconv.Itoa(n) {
			return fmt.Errorf("line %d is %q", n, sc.Text())
		}
		n++
	}
	if !strings.HasSuffix(out, "\n") || n < min {
		return fmt.Errorf("%d lines (at least %d wanted), ends %q", n, min, out[max(0, len(out)-20):])
	}
	return nil
}

func waitOffset(t *testing.T, s *stream, past int64) {
	t.Helper()
	waitFor(t, 20*time.Second, func() bool { _, off, _ := s.snapshot(); return off > past })
	if _, off, _ := s.snapshot(); off <= past {
		t.Fatalf("the stream is stuck at %d", off)
	}
}

// TestAgentOutputAcrossLiveCheckpoint: a checkpoint that leaves the
// sandbox running, taken while an Output stream (follow) flows, succeeds,
// and the stream goes on without a gap or a repeat, in the same call.
// With the daemon's connection left open through the dump (the variant
// "open") and dropped before it (the driver's way, "drop").
func TestAgentOutputAcrossLiveCheckpoint(t *testing.T) {
	for _, v := range []struct {
		name string
		drop bool
	}{{"drop", true}, {"open", false}} {
		t.Run(v.name, func(t *testing.T) {
			old := dropAgentBeforeCut
			dropAgentBeforeCut = v.drop
			defer func() { dropAgentBeforeCut = old }()
			td := newTestDriver(t)
			requireCriu(t, td)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			id := td.create(sandbox.Limits{})
			pid, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"sh", "-c", lineCounter}})
			if err != nil {
				t.Fatal(err)
			}
			s := &stream{}
			done := make(chan error, 1)
			go func() { done <- td.Output(ctx, id, pid, 0, true, s.frame) }()
			waitOffset(t, s, 200)
			for i := range 2 {
				_, at, _ := s.snapshot()
				cs, err := td.Checkpoint(ctx, id, t.TempDir(), sandbox.CheckpointOptions{})
				if err != nil {
					t.Fatalf("checkpoint %d mid-stream: %v", i, err)
				}
				t.Logf("checkpoint %d at offset %d: frozen %v, total %v", i, at, cs.Frozen, cs.Total)
				_, after, _ := s.snapshot()
				waitOffset(t, s, after+200)
			}
			if err := td.Signal(ctx, id, pid, syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("stream: %v", err)
			}
			out, _, kinds := s.snapshot()
			if err := checkLines(out, 60); err != nil || len(kinds) != 0 || s.exit == nil || s.exit.Signal != "SIGTERM" {
				t.Fatalf("stream across live checkpoints: %v; other frames %v; exit %+v", err, kinds, s.exit)
			}
		})
	}
}

// TestAgentHeldIn: what a plain Exec leaves running — `nohup python3 -m
// http.server &`, a daemon (double fork, setsid) holding a value in its
// memory, a process tree three deep — is part of the checkpoint: after the
// sandbox is killed and restored every process is back with its PID and
// start time, the server answers, the daemon has its value, and a started
// process's output re-attaches from the last offset without loss or
// repeat. Also with the daemon's connection left open through the dump
// ("open"; the driver drops it, "drop").
func TestAgentHeldIn(t *testing.T) {
	for _, v := range []struct {
		name string
		drop bool
	}{{"drop", true}, {"open", false}} {
		t.Run(v.name, func(t *testing.T) {
			old := dropAgentBeforeCut
			dropAgentBeforeCut = v.drop
			defer func() { dropAgentBeforeCut = old }()
			testHeldIn(t)
		})
	}
}

func testHeldIn(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	tmpl := pythonTemplate(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	id := newID("held")
	if _, err := td.Create(ctx, sandbox.Spec{ID: id, Template: tmpl}); err != nil {
		t.Fatal(err)
	}
	before := libcontainerExecs.Load()
	token := randHex(8)
	td.sh(id, "nohup python3 -m http.server 8000 >/dev/null 2>&1 &")
	td.sh(id, `python3 -c '
import os, signal, sys, time
if os.fork(): sys.exit(0)
os.setsid()
if os.fork(): os._exit(0)
secret = "`+token+`"
def dump(*_):
    open("/tmp/daemon.out", "w").write(secret + "\n")
signal.signal(signal.SIGUSR1, dump)
open("/tmp/daemon.pid", "w").write(str(os.getpid()))
os.close(0); os.close(1); os.close(2)
while True: time.sleep(3600)
'`)
	td.sh(id, `sh -c 'sh -c "sleep 100003 & wait" & wait' </dev/null >/dev/null 2>&1 &`)
	counter, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"sh", "-c", lineCounter}})
	if err != nil {
		t.Fatal(err)
	}
	s := &stream{}
	done := make(chan error, 1)
	go func() { done <- td.Output(ctx, id, counter, 0, true, s.frame) }()
	waitOffset(t, s, 100)
	daemonPid, _ := strconv.Atoi(td.sh(id, "for i in $(seq 100); do [ -s /tmp/daemon.pid ] && break; sleep 0.05; done; cat /tmp/daemon.pid"))
	serverUp := func(td *testDriver) error {
		c, err := td.DialPort(ctx, id, 8000)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, "GET / HTTP/1.0\r\n\r\n"); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.Contains(line, " 200 ") {
			return fmt.Errorf("answer %q %v", line, err)
		}
		return nil
	}
	waitFor(t, 20*time.Second, func() bool { return serverUp(td) == nil })
	if err := serverUp(td); err != nil {
		t.Fatalf("server before the cut: %v", err)
	}
	procs, err := td.Processes(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]sandbox.Process{}
	var server, deep, daemon bool
	for _, p := range procs {
		if p.PPID == counter {
			continue // the counter's sleeps come and go
		}
		want[p.PID] = p
		args := strings.Join(p.Args, " ")
		server = server || strings.Contains(args, "http.server")
		deep = deep || args == "sleep 100003" && want[p.PPID].PPID > 1
		daemon = daemon || p.PID == daemonPid && p.PPID == 1
	}
	if !server || !deep || !daemon {
		t.Fatalf("before the cut (server %v, tree three deep %v, daemon %d %v): %+v", server, deep, daemonPid, daemon, procs)
	}

	images := t.TempDir()
	if _, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	if err := td.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	// The stream ends: the sandbox stopped.
	select {
	case err := <-done:
		t.Logf("stream ended with the sandbox: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the stream outlived the sandbox by 30s")
	}
	seen, last, _ := s.snapshot()
	if _, err := td.Restore(ctx, sandbox.Spec{ID: id, Template: tmpl}, images, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	procs, err = td.Processes(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	got := map[int]sandbox.Process{}
	for _, p := range procs {
		got[p.PID] = p
	}
	for pid, p := range want {
		q, ok := got[pid]
		if !ok || strings.Join(q.Args, " ") != strings.Join(p.Args, " ") || q.StartTicks != p.StartTicks || q.PPID != p.PPID {
			t.Errorf("pid %d after restore: %+v (found %v), want %+v", pid, q, ok, p)
		}
	}
	if err := serverUp(td); err != nil {
		t.Errorf("server after restore: %v", err)
	}
	if err := td.Signal(ctx, id, daemonPid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if out := td.sh(id, "for i in $(seq 100); do [ -s /tmp/daemon.out ] && break; sleep 0.05; done; cat /tmp/daemon.out"); out != token+"\n" {
		t.Errorf("the daemon's memory after restore: %q, want %q", out, token)
	}
	// Re-attach from the last offset seen; the counter goes on from its
	// restored memory.
	s2 := &stream{offset: last}
	s2.buf.WriteString(seen)
	done2 := make(chan error, 1)
	go func() { done2 <- td.Output(ctx, id, counter, last, true, s2.frame) }()
	waitOffset(t, s2, last+200)
	if err := td.Signal(ctx, id, counter, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-done2; err != nil {
		t.Fatalf("re-attached stream: %v", err)
	}
	out, _, kinds := s2.snapshot()
	if err := checkLines(out, 20); err != nil || len(kinds) != 0 {
		t.Fatalf("output across kill and restore (re-attached at %d): %v; other frames %v", last, err, kinds)
	}
	if n := libcontainerExecs.Load() - before; n != 0 {
		t.Errorf("%d libcontainer execs, want 0", n)
	}
}

// TestAgentRestoreNeedsItsBuild: an image whose agent build this node does
// not have is refused with FailedPrecondition, before anything is made.
func TestAgentRestoreNeedsItsBuild(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	ctx := context.Background()
	id := td.create(sandbox.Limits{})
	images := t.TempDir()
	if _, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	if err := td.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	td2 := newTestDriver(t) // another node: its store has only its own build
	if err := os.RemoveAll(filepath.Join(td2.opts.StateDir, "agents")); err != nil {
		t.Fatal(err)
	}
	_, err := td2.Restore(ctx, sandbox.Spec{ID: id, Template: sandbox.Template{RootFS: minimalRootfs(t)}}, images, sandbox.RestoreOptions{})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "not on this node") {
		t.Fatalf("restore without the agent build: %v, want failed precondition", err)
	}
	if b, err := td.RuntimeBuild(ctx); err != nil || !strings.HasSuffix(b, " agent "+td.agentBuild) {
		t.Errorf("runtime build %q %v, want the agent's build in it", b, err)
	}
}

// TestAgentExecLatency measures the Exec round trip of `true` (p50 of
// 200), through the agent and through libcontainer's exec (a legacy
// sandbox), in the same run. AMBER_BENCH=1 only.
func TestAgentExecLatency(t *testing.T) {
	if os.Getenv("AMBER_BENCH") != "1" {
		t.Skip("set AMBER_BENCH=1 to measure")
	}
	td := newTestDriver(t)
	ctx := context.Background()
	agentID := td.create(sandbox.Limits{})
	createLegacy = true
	legacyID := td.create(sandbox.Limits{})
	createLegacy = false
	for _, c := range []struct{ name, id string }{{"agent", agentID}, {"libcontainer exec", legacyID}} {
		var ds []time.Duration
		for range 200 {
			start := time.Now()
			st, err := td.Exec(ctx, c.id, sandbox.ExecSpec{Args: []string{"true"}})
			if err != nil || st.Code != 0 {
				t.Fatalf("%s: %+v %v", c.name, st, err)
			}
			ds = append(ds, time.Since(start))
		}
		t.Logf("exec round trip `true`, %s (n=200): p50 %v p90 %v p99 %v", c.name, pct(ds, 50), pct(ds, 90), pct(ds, 99))
		// 100 at once into the one sandbox.
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, 100)
		for range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if st, err := td.Exec(ctx, c.id, sandbox.ExecSpec{Args: []string{"true"}}); err != nil || st.Code != 0 {
					errs <- fmt.Errorf("%+v %v", st, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("%s, concurrent: %v", c.name, err)
		}
		took := time.Since(start)
		t.Logf("100 concurrent execs of `true`, %s: %v (%.0f/s)", c.name, took.Round(time.Millisecond), 100/took.Seconds())
	}
}

// TestAgentTenantConnection: a process of the sandbox reaches the agent's
// port but gets nothing without the token, and a connection it holds open
// does not stop a checkpoint (the driver's wait for the agent's ends to
// close is bounded).
func TestAgentTenantConnection(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	ctx := context.Background()
	id := td.create(sandbox.Limits{})
	port := strconv.Itoa(agentproto.Port)
	if out := td.sh(id, `printf 'GET /v1/health HTTP/1.0\r\n\r\n' | nc 127.0.0.1 `+port+` | head -1`); !strings.Contains(out, " 401 ") {
		t.Errorf("health without the token from inside: %q, want 401", out)
	}
	if _, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"sh", "-c", "sleep 1000 | nc 127.0.0.1 " + port}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // nc connects
	start := time.Now()
	if _, err := td.Checkpoint(ctx, id, t.TempDir(), sandbox.CheckpointOptions{}); err != nil {
		t.Fatalf("checkpoint with a tenant's connection to the agent: %v", err)
	}
	t.Logf("checkpoint took %v", time.Since(start))
	if out := td.sh(id, "echo ok"); out != "ok\n" {
		t.Fatalf("exec after the checkpoint: %q", out)
	}
}

// TestCheckpointNeverHangs (issue 23): a stopped process (kill -STOP, a
// shell's Ctrl-Z) made criu dump wait in the kernel for as long as anyone
// waited, the sandbox frozen and its lock held. Now the checkpoint is
// refused at once naming the process, the sandbox is not frozen and runs
// on, no criu process is left, and once the process continues a checkpoint
// succeeds. A dump that does not end within its deadline is given up: the
// sandbox is thawed and runs on.
func TestCheckpointNeverHangs(t *testing.T) {
	td := newTestDriver(t)
	d := td.Driver
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := td.create(sandbox.Limits{})
	pid, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Signal(ctx, id, pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	_, err = d.Checkpoint(ctx, id, filepath.Join(t.TempDir(), "img"), sandbox.CheckpointOptions{})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "stopped") || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", pid)) {
		t.Fatalf("checkpoint with a stopped process: %v after %v", err, time.Since(start))
	}
	t.Logf("refused after %v: %v", time.Since(start).Round(time.Millisecond), err)
	assertThawedAndAlone(t, d, id)
	if err := d.Signal(ctx, id, pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Checkpoint(ctx, id, filepath.Join(t.TempDir(), "img2"), sandbox.CheckpointOptions{}); err != nil {
		t.Fatalf("checkpoint once it continued: %v", err)
	}

	// The deadline: a dump given 1 ms gives up, thaws, and the sandbox runs on.
	old := dumpTimeout
	dumpTimeout = time.Millisecond
	_, err = d.Checkpoint(ctx, id, filepath.Join(t.TempDir(), "img3"), sandbox.CheckpointOptions{})
	dumpTimeout = old
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "thawed") {
		t.Fatalf("a dump past its deadline: %v", err)
	}
	assertThawedAndAlone(t, d, id)
}

// assertThawedAndAlone: sandbox id's freezer reads THAWED, no criu process
// of it is left, and it answers an exec.
func assertThawedAndAlone(t *testing.T, d *Driver, id string) {
	t.Helper()
	matches, _ := filepath.Glob("/sys/fs/cgroup/freezer/*/*/" + id + "/freezer.state")
	more, _ := filepath.Glob("/sys/fs/cgroup/freezer/*/" + id + "/freezer.state")
	for _, f := range append(matches, more...) {
		if b, _ := os.ReadFile(f); strings.TrimSpace(string(b)) != "THAWED" {
			t.Errorf("%s: %s", f, b)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left := criuProcessesOf(id)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("criu processes left: %v", left)
			break
		}
	}
	var out bytes.Buffer
	st, err := d.Exec(context.Background(), id, sandbox.ExecSpec{Args: []string{"echo", "alive"}, Stdout: &out})
	if err != nil || st.Code != 0 || out.String() != "alive\n" {
		t.Errorf("the sandbox after the checkpoint: %+v %v %q", st, err, out.String())
	}
}

// criuProcessesOf lists the criu processes whose command line names id.
func criuProcessesOf(id string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		cl := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.HasPrefix(cl, "criu") || strings.Contains(cl, "/criu ") {
			if strings.Contains(cl, id) {
				out = append(out, e.Name()+": "+cl)
			}
		}
	}
	return out
}

// inotifyWatcher watches $1 with inotify and prints each event's name.
const inotifyWatcher = `import ctypes,os,struct,sys
l=ctypes.CDLL(None)
fd=l.inotify_init()
os.makedirs(sys.argv[1], exist_ok=True)
print('watching', l.inotify_add_watch(fd, sys.argv[1].encode(), 0x100), flush=True)
while True:
    b=os.read(fd, 4096)
    i=0
    while i < len(b):
        w,m,c,n=struct.unpack_from('iIII', b, i)
        print('event', b[i+16:i+16+n].rstrip(b'\0').decode(), flush=True)
        i+=16+n
`

// TestCheckpointWithInotifyWatch (issue 23): a program watching a
// directory of the layer (inotify) made the dump fail ("fsnotify: Can't
// dump that handle": the overlay does not decode file handles). CRIU now
// finds the watched path by scanning the sandbox's work directories
// (irmapScanPaths): the checkpoint succeeds, and after a kill and a restore
// the watch fires again. A watch outside those directories is refused with
// an error that says what to do.
func TestCheckpointWithInotifyWatch(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	tmpl := pythonTemplate(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := newID("inotify")
	if _, err := td.Create(ctx, sandbox.Spec{ID: id, Template: tmpl}); err != nil {
		t.Fatal(err)
	}
	pid, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"python3", "-c", inotifyWatcher, "/root/w"}})
	if err != nil {
		t.Fatal(err)
	}
	logf := fmt.Sprintf("/run/amber/proc/%d.log", pid)
	waitFor := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if out := td.sh(id, "cat "+logf); strings.Contains(out, what) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the watcher's log: %q", what, td.sh(id, "cat "+logf))
			}
		}
	}
	waitFor("watching 1")
	td.sh(id, "touch /root/w/before")
	waitFor("event before")
	images := t.TempDir()
	if _, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{}); err != nil {
		t.Fatalf("checkpoint with an inotify watch on the layer: %v", err)
	}
	if err := td.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := td.Restore(ctx, sandbox.Spec{ID: id, Template: tmpl}, images, sandbox.RestoreOptions{}); err != nil {
		t.Fatalf("restore: %v", err)
	}
	td.sh(id, "touch /root/w/after")
	waitFor("event after")

	// Outside the scanned directories: refused, clearly; the sandbox runs on.
	if _, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"python3", "-c", inotifyWatcher, "/var/cache/w"}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	_, err = td.Checkpoint(ctx, id, t.TempDir(), sandbox.CheckpointOptions{})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "inotify") {
		t.Fatalf("a watch outside the scanned directories: %v", err)
	}
	if out := td.sh(id, "echo alive"); out != "alive\n" {
		t.Fatalf("after the refused checkpoint: %q", out)
	}
}
