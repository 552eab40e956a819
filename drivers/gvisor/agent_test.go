package gvisor

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/core/sandbox/fidelitytest"
)

// counterScript prints "n" lines, one every 20ms, for ever.
const counterScript = `i=0; while :; do echo "$i"; i=$((i+1)); sleep 0.02; done`

// lineStream follows a Start'ed process's output through Output and keeps
// the bytes it got and the offset after them.
type lineStream struct {
	mu     sync.Mutex
	data   []byte
	offset int64
	kinds  []string
}

func (s *lineStream) frame(f sandbox.OutputFrame) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.Kind != "stdout" && f.Kind != "stderr" {
		s.kinds = append(s.kinds, f.Kind)
	}
	if f.Kind == "stdout" {
		if f.Offset != s.offset {
			return fmt.Errorf("frame at %d, want %d", f.Offset, s.offset)
		}
		s.data = append(s.data, f.Data...)
		s.offset = f.Offset + int64(len(f.Data))
	}
	return nil
}

func (s *lineStream) snapshot() (string, int64, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.data), s.offset, append([]string(nil), s.kinds...)
}

// checkCounter checks that out is "0\n1\n…" with no gap or repeat (a
// last line may be cut short) and returns the number of whole lines.
func checkCounter(out string) (int, error) {
	lines := strings.Split(out, "\n")
	n := 0
	for i, l := range lines {
		if i == len(lines)-1 {
			break // after the last newline: a part of a line, or ""
		}
		if l != strconv.Itoa(i) {
			return n, fmt.Errorf("line %d is %q (gap or repeat)", i, l)
		}
		n++
	}
	return n, nil
}

// waitLines waits until s has more than n whole lines.
func waitLines(t *testing.T, s *lineStream, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		out, _, _ := s.snapshot()
		if strings.Count(out, "\n") > n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream has %d lines after 30s, want > %d", strings.Count(out, "\n"), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAgentCheckpointMidStream: a checkpoint (left running) taken while an
// Output stream with follow and an Exec's output flow over the agent's
// connection succeeds, and both go on without a gap or a repeat.
//
//	go test -tags seccomp -count=1 -run TestAgentCheckpointMidStream -v ./drivers/gvisor
func TestAgentCheckpointMidStream(t *testing.T) {
	runsc := requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d := newTestDriver(t, runsc, "/amber/gvisor-midstream")
	id := fmt.Sprintf("midstream-%d", os.Getpid())
	if _, err := d.Create(ctx, sandbox.Spec{ID: id, Template: minimalTemplate(t)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	pid, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", counterScript}})
	if err != nil {
		t.Fatal(err)
	}
	var s lineStream
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Output(sctx, id, pid, 0, true, s.frame) }()
	waitLines(t, &s, 20)
	// An Exec streams its output through the cuts too.
	execDone := make(chan error, 1)
	go func() {
		out, err := sh(d, id, `i=0; while [ $i -lt 150 ]; do echo "$i"; i=$((i+1)); sleep 0.01; done`)
		if err == nil {
			if n, cerr := checkCounter(out); cerr != nil || n != 150 {
				err = fmt.Errorf("exec output across the checkpoints: %d lines, %v", n, cerr)
			}
		}
		execDone <- err
	}()
	for i := range 2 {
		cs, err := d.Checkpoint(ctx, id, filepath.Join(t.TempDir(), "image"), sandbox.CheckpointOptions{})
		if err != nil {
			t.Fatalf("checkpoint %d mid-stream: %v", i, err)
		}
		out, _, _ := s.snapshot()
		t.Logf("checkpoint %d mid-stream: frozen %v, total %v; %d lines streamed", i, cs.Frozen, cs.Total, strings.Count(out, "\n"))
		waitLines(t, &s, strings.Count(out, "\n")+25)
	}
	stop()
	if err := <-done; err != nil && sctx.Err() == nil {
		t.Fatalf("stream: %v", err)
	}
	if err := <-execDone; err != nil {
		t.Error(err)
	}
	out, off, kinds := s.snapshot()
	n, err := checkCounter(out)
	if err != nil {
		t.Fatalf("after the checkpoints: %v", err)
	}
	if len(kinds) > 0 {
		t.Errorf("frames other than output: %v", kinds)
	}
	t.Logf("%d lines, offset %d, contiguous", n, off)
}

// heldIn are the processes TestAgentHeldIn starts with plain Execs, by the
// command line Processes lists for each.
var heldIn = []struct {
	name, exec string
	match      func(args []string) bool
}{
	{"http server", `nohup python3 -m http.server 8000 >/dev/null 2>&1 &`,
		func(a []string) bool { return strings.Contains(strings.Join(a, " "), "http.server 8000") }},
	// A daemon: the double fork leaves it a child of the init, in a
	// session of its own, holding the exec's output pipes.
	{"daemon", `(setsid sleep 1001 &) ; exit 0`,
		func(a []string) bool { return strings.Join(a, " ") == "sleep 1001" }},
	{"tree 1", `nohup sh -c 'sh -c "sleep 1002; true"; true' >/dev/null 2>&1 &`,
		func(a []string) bool { return len(a) == 3 && strings.HasPrefix(a[2], `sh -c "sleep 1002`) }},
	{"tree 2", "",
		func(a []string) bool { return len(a) == 3 && a[2] == "sleep 1002; true" }},
	{"tree 3", "",
		func(a []string) bool { return strings.Join(a, " ") == "sleep 1002" }},
}

// findHeldIn returns each heldIn process's pid → start ticks (and the
// names not found).
func findHeldIn(ps []sandbox.Process) (map[string]sandbox.Process, []string) {
	found := map[string]sandbox.Process{}
	var missing []string
	for _, h := range heldIn {
		for _, p := range ps {
			if h.match(p.Args) {
				found[h.name] = p
			}
		}
		if _, ok := found[h.name]; !ok {
			missing = append(missing, h.name)
		}
	}
	return found, missing
}

// httpAnswers GETs / of the sandbox's port 8000 through DialPort.
func httpAnswers(ctx context.Context, d *Driver, id string) error {
	c, err := d.DialPort(ctx, id, 8000)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
		return err
	}
	b := make([]byte, 64)
	n, _ := io.ReadAtLeast(c, b, 12)
	if !strings.HasPrefix(string(b[:n]), "HTTP/1.0 200") {
		return fmt.Errorf("GET / answered %q", b[:n])
	}
	return nil
}

// TestAgentHeldIn is the held-in test of the agent (issue 20): what plain
// Execs leave running — a server started with nohup, a daemon that double
// forks, a process tree three deep — is checkpointed, the sandbox killed
// and restored, and every process is back with its PID and start time; the
// server answers; a Start'ed process's output, read before the cut, is
// re-attached from the offset the client had without a gap or a repeat.
// The same on a sandbox of generation 1 (the sh init, runsc exec) loses
// the Exec'd processes: gVisor's restore kills what descends from a runsc
// exec.
//
//	go test -tags seccomp -count=1 -run TestAgentHeldIn -v ./drivers/gvisor
func TestAgentHeldIn(t *testing.T) {
	runsc := requireHost(t)
	tmpl := fidelitytest.PythonTemplate(t)
	t.Run("agent", func(t *testing.T) {
		if missing := heldInRound(t, runsc, tmpl, specVersion); len(missing) > 0 {
			t.Errorf("after the restore: %v missing", missing)
		}
	})
	t.Run("sh-init-must-lose", func(t *testing.T) {
		createSpecVersion = 1
		defer func() { createSpecVersion = specVersion }()
		missing := heldInRound(t, runsc, tmpl, 1)
		if len(missing) == 0 {
			t.Errorf("a generation 1 sandbox kept every Exec'd process across the restore: the test proves nothing")
		}
		t.Logf("generation 1 lost, as it must: %v", missing)
	})
}

// heldInRound runs the held-in sequence on a sandbox of generation gen and
// returns the heldIn processes missing after the restore.
func heldInRound(t *testing.T, runsc string, tmpl sandbox.Template, gen int) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d := newTestDriver(t, runsc, fmt.Sprintf("/amber/gvisor-heldin%d", gen))
	id := fmt.Sprintf("heldin%d-%d", gen, os.Getpid())
	spec := sandbox.Spec{ID: id, Template: tmpl}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	for _, h := range heldIn {
		if h.exec == "" {
			continue
		}
		begin := time.Now()
		if out, err := sh(d, id, h.exec); err != nil {
			t.Fatalf("%s: %v %q", h.name, err, out)
		}
		if took := time.Since(begin); took > 10*time.Second {
			t.Errorf("the exec of %s took %v", h.name, took)
		}
	}
	for deadline := time.Now().Add(60 * time.Second); httpAnswers(ctx, d, id) != nil; {
		if time.Now().After(deadline) {
			t.Fatalf("the http server does not answer: %v", httpAnswers(ctx, d, id))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The nested shells of the tree fork after their exec has answered:
	// wait until the whole tree is there (a slow machine takes a while).
	var (
		ps      []sandbox.Process
		before  map[string]sandbox.Process
		missing []string
		err     error
	)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if ps, err = d.Processes(ctx, id); err != nil {
			t.Fatal(err)
		}
		if before, missing = findHeldIn(ps); len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("before the checkpoint: %v missing from %+v", missing, ps)
		}
	}
	if before["tree 2"].PPID != before["tree 1"].PID || before["tree 3"].PPID != before["tree 2"].PID {
		t.Fatalf("not a tree three deep: %+v", before)
	}
	var (
		counter int
		s       lineStream
	)
	if gen >= 2 {
		if counter, err = d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", counterScript}}); err != nil {
			t.Fatal(err)
		}
		sctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- d.Output(sctx, id, counter, 0, true, s.frame) }()
		waitLines(t, &s, 20)
		stop()
		<-done
	}

	image := filepath.Join(t.TempDir(), "image")
	if _, err := d.Checkpoint(ctx, id, image, sandbox.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := d.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Restore(ctx, spec, image, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if ps, err = d.Processes(ctx, id); err != nil {
		t.Fatal(err)
	}
	after, missing := findHeldIn(ps)
	for name, p := range before {
		if a, ok := after[name]; ok && (a.PID != p.PID || a.StartTicks != p.StartTicks) {
			t.Errorf("%s: pid %d (start %d) after the restore, %d (start %d) before", name, a.PID, a.StartTicks, p.PID, p.StartTicks)
		}
	}
	if gen < 2 {
		return missing
	}
	if err := httpAnswers(ctx, d, id); err != nil {
		t.Errorf("after the restore, the http server: %v", err)
	}
	// Re-attach from the offset the client had before the cut.
	_, off, _ := s.snapshot()
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Output(sctx, id, counter, off, true, s.frame) }()
	seen, _, _ := s.snapshot()
	waitLines(t, &s, strings.Count(seen, "\n")+40)
	stop()
	if err := <-done; err != nil && sctx.Err() == nil {
		t.Fatal(err)
	}
	out, end, kinds := s.snapshot()
	n, err := checkCounter(out)
	if err != nil || len(kinds) > 0 {
		t.Errorf("output re-attached at %d after the restore: %v, frames %v", off, err, kinds)
	}
	t.Logf("generation %d: %d processes back with their pids; output re-attached at %d, %d lines contiguous to %d", gen, len(after), off, n, end)
	return missing
}

// TestAgentExecBenchmark measures the round trip of Exec(`true`) through
// the agent and through runsc exec (a sandbox of generation 1), 200 runs
// each, in the same run. It runs only with AMBER_GVISOR_BENCH=1:
//
//	AMBER_GVISOR_BENCH=1 go test -tags seccomp -count=1 -run TestAgentExecBenchmark -v ./drivers/gvisor
func TestAgentExecBenchmark(t *testing.T) {
	if os.Getenv("AMBER_GVISOR_BENCH") != "1" {
		t.Skip("set AMBER_GVISOR_BENCH=1 to run")
	}
	runsc := requireHost(t)
	ctx := context.Background()
	d := newTestDriver(t, runsc, "/amber/gvisor-execbench")
	n := 200
	if v, err := strconv.Atoi(os.Getenv("AMBER_GVISOR_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	for _, gen := range []int{specVersion, 1} {
		createSpecVersion = gen
		var (
			creates []time.Duration
			id      string
		)
		for i := range 5 {
			sid := fmt.Sprintf("execbench%d-%d-%d", gen, i, os.Getpid())
			begin := time.Now()
			_, err := d.Create(ctx, sandbox.Spec{ID: sid, Template: minimalTemplate(t)})
			if err != nil {
				createSpecVersion = specVersion
				t.Fatal(err)
			}
			creates = append(creates, time.Since(begin))
			t.Cleanup(func() { _ = d.Destroy(context.Background(), sid) })
			id = sid
		}
		createSpecVersion = specVersion
		t.Logf("generation %d: Create (5 sequential) p50 %v", gen, pct(creates, 50))
		var ds []time.Duration
		for range n {
			begin := time.Now()
			st, err := d.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"true"}})
			if err != nil || st.Code != 0 {
				t.Fatalf("exec: %+v %v", st, err)
			}
			ds = append(ds, time.Since(begin))
		}
		path := "agent"
		if gen < 2 {
			path = "runsc exec (generation 1)"
		}
		t.Logf("Exec(true) through %s, %d runs: p50 %v, p90 %v, p99 %v", path, n, pct(ds, 50), pct(ds, 90), pct(ds, 99))
		if gen == specVersion {
			logSandboxFloor(t, d, id, n)
		}
	}
}

// logSandboxFloor logs what gVisor itself spends on a process of `true`,
// without any round trip to the host: the agent's own fork-to-reap time
// (Exit.LifeMicros) over n processes, and 100 runs of /bin/true from the
// template's shell inside the sandbox (a full fork, as any shell does).
func logSandboxFloor(t *testing.T, d *Driver, id string, n int) {
	t.Helper()
	ctx := context.Background()
	rec, err := d.running(id)
	if err != nil {
		t.Fatal(err)
	}
	c := d.agentFor(rec)
	base, err := agentBase(rec, sandbox.ExecSpec{})
	if err != nil {
		t.Fatal(err)
	}
	var life []time.Duration
	for range n {
		s := base
		s.Args = []string{"true"}
		pid, err := c.Start(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		e, err := c.Wait(ctx, pid)
		if err != nil {
			t.Fatal(err)
		}
		life = append(life, time.Duration(e.LifeMicros)*time.Microsecond)
	}
	var sh []time.Duration
	for range 3 {
		begin := time.Now()
		st, err := d.Exec(ctx, id, sandbox.ExecSpec{Args: []string{"sh", "-c", "i=0; while [ $i -lt 100 ]; do /bin/true; i=$((i+1)); done"}})
		if err != nil || st.Code != 0 {
			t.Fatalf("shell loop: %+v %v", st, err)
		}
		sh = append(sh, time.Since(begin)/100)
	}
	t.Logf("inside the sandbox: the agent's fork to reap of `true` p50 %v (%d runs); /bin/true from sh, 3×100 runs: %v each (median)", pct(life, 50), n, pct(sh, 50))
}

// TestAgentTemplateUser: with a non-root template user, the agent (root)
// starts every command as that user, whose processes can read neither the
// agent's token from its environment nor anything of the init's; the
// token is in no command's environment.
func TestAgentTemplateUser(t *testing.T) {
	runsc := requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := newTestDriver(t, runsc, "/amber/gvisor-user")
	id := fmt.Sprintf("user-%d", os.Getpid())
	tmpl := minimalTemplate(t)
	tmpl.User, tmpl.Cwd = "1000:1000", "/tmp"
	if _, err := d.Create(ctx, sandbox.Spec{ID: id, Template: tmpl}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	rec, err := d.loadRecord(id)
	if err != nil {
		t.Fatal(err)
	}
	out := mustSh(t, d, id, `id -u; id -g; pwd; env; cat /proc/1/environ 2>/dev/null && echo READ-INIT-ENV; true`)
	if !strings.HasPrefix(out, "1000\n1000\n/tmp\n") || strings.Contains(out, "READ-INIT-ENV") || strings.Contains(out, rec.AgentToken) {
		t.Errorf("as the template user: %q", out)
	}
	pid, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", "id -u; env"}})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := d.Wait(ctx, id, pid); err != nil || st.Code != 0 {
		t.Fatalf("Wait: %+v %v", st, err)
	}
	var log strings.Builder
	if err := d.Output(ctx, id, pid, 0, false, func(f sandbox.OutputFrame) error { log.Write(f.Data); return nil }); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(log.String(), "1000\n") || strings.Contains(log.String(), rec.AgentToken) {
		t.Errorf("a Start'ed process's output: %q", log.String())
	}
	if st, err := os.Stat(d.recordPath(id)); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("record %v %v, want 0600: it holds the token", st.Mode(), err)
	}
}

// TestAgentConcurrentExecs: 100 Execs at once into one sandbox all
// complete with their own output (one connection, a stream each), and no
// runsc exec runs.
func TestAgentConcurrentExecs(t *testing.T) {
	runsc := requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := newTestDriver(t, runsc, "/amber/gvisor-concurrent")
	id := fmt.Sprintf("concurrent-%d", os.Getpid())
	if _, err := d.Create(ctx, sandbox.Spec{ID: id, Template: minimalTemplate(t)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	const n = 100
	var wg sync.WaitGroup
	errs := make(chan error, n)
	begin := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := sh(d, id, fmt.Sprintf("echo %d; sleep 0.2", i))
			if err == nil && out != fmt.Sprintf("%d\n", i) {
				err = fmt.Errorf("exec %d: %q", i, out)
			}
			errs <- err
		}()
	}
	wg.Wait()
	took := time.Since(begin)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	t.Logf("%d concurrent execs (echo; sleep 0.2) in %v: %.0f execs/s; runsc exec %d, port-forward %d", n, took.Round(time.Millisecond), n/took.Seconds(), d.runscCalls("exec"), d.runscCalls("port-forward"))
	if d.runscCalls("exec") != 0 {
		t.Errorf("runsc exec ran %d times", d.runscCalls("exec"))
	}
}

// TestCheckpointClosesPortConnections: a connection DialPort handed out
// (a user's, through the port proxy) does not make a checkpoint fail: the
// cut closes it (gVisor cannot save the sentry's proxy, and an outside
// connection does not survive a gVisor restore anyway), and a new one
// works after the cut.
func TestCheckpointClosesPortConnections(t *testing.T) {
	runsc := requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := newTestDriver(t, runsc, "/amber/gvisor-portconns")
	id := fmt.Sprintf("portconns-%d", os.Getpid())
	if _, err := d.Create(ctx, sandbox.Spec{ID: id, Template: minimalTemplate(t)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	mustSh(t, d, id, "mkdir -p /www && echo hi > /www/index.html")
	if _, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"}}); err != nil {
		t.Fatal(err)
	}
	var conn net.Conn
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c, err := d.DialPort(ctx, id, 8080)
		if err == nil {
			conn = c
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial 8080: %v", err)
		}
	}
	defer conn.Close()
	if _, err := d.Checkpoint(ctx, id, filepath.Join(t.TempDir(), "image"), sandbox.CheckpointOptions{}); err != nil {
		t.Fatalf("checkpoint with a port connection open: %v", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Error("the port connection still reads after the cut")
	}
	c2, err := d.DialPort(ctx, id, 8080)
	if err != nil {
		t.Fatalf("dial after the cut: %v", err)
	}
	defer c2.Close()
	fmt.Fprintf(c2, "GET / HTTP/1.0\r\n\r\n")
	b, _ := io.ReadAll(c2)
	if !strings.Contains(string(b), "hi") {
		t.Fatalf("the server after the cut answered %q", b)
	}
}
