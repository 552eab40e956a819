package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/lib/agentproto"
)

// hostAgent runs amber-agent on the host (not as an init) on a loopback
// port of its own, and returns a client of it and the agent's process.
func hostAgent(t *testing.T) (*Client, *exec.Cmd) {
	t.Helper()
	bin, err := FindBinary()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin)
	cmd.Env = []string{agentproto.TokenEnv + "=tok", "AMBER_AGENT_ADDR=" + addr, "PATH=/usr/bin:/bin"}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := New("host", "tok", func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c, cmd
}

func base() agentproto.Start {
	return agentproto.Start{Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/", UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
}

func TestExecThroughAgent(t *testing.T) {
	c, _ := hostAgent(t)
	ctx := context.Background()
	var out, errb bytes.Buffer
	st, err := c.Exec(ctx, sandbox.ExecSpec{Args: []string{"sh", "-c", "cat; echo err >&2; exit 3"}, Stdin: strings.NewReader("in\n"), Stdout: &out, Stderr: &errb}, base())
	if err != nil || st.Code != 3 || out.String() != "in\n" || errb.String() != "err\n" {
		t.Fatalf("exec: %+v %v out=%q err=%q", st, err, out.String(), errb.String())
	}
	st, err = c.Exec(ctx, sandbox.ExecSpec{Args: []string{"no-such-program"}, Stderr: &errb}, base())
	if err != nil || st.Code != 127 {
		t.Fatalf("missing program: %+v %v", st, err)
	}
	st, err = c.Exec(ctx, sandbox.ExecSpec{Args: []string{"sleep", "10"}, Timeout: 100 * time.Millisecond}, base())
	if err != nil || !st.TimedOut || st.Code != 137 || st.Signal != "SIGKILL" {
		t.Fatalf("timeout: %+v %v", st, err)
	}
	b := base()
	b.Cwd = "/no/such/dir"
	if _, err := c.Exec(ctx, sandbox.ExecSpec{Args: []string{"true"}}, b); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad cwd: %v", err)
	}
	var tty bytes.Buffer
	st, err = c.Exec(ctx, sandbox.ExecSpec{Args: []string{"sh", "-c", "test -t 0 && echo tty"}, TTY: true, Stdout: &tty}, base())
	if err != nil || st.Code != 0 || !strings.Contains(tty.String(), "tty") {
		t.Fatalf("tty: %+v %v %q", st, err, tty.String())
	}
}

// A stream that breaks (every connection dropped, as before a checkpoint)
// re-attaches and delivers each byte exactly once.
func TestOutputReattachesWithoutGapOrRepeat(t *testing.T) {
	c, _ := hostAgent(t)
	ctx := context.Background()
	s := base()
	s.Args = []string{"sh", "-c", "i=0; while [ $i -lt 400 ]; do echo line$i; i=$((i+1)); sleep 0.005; done"}
	pid, err := c.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		got bytes.Buffer
	)
	done := make(chan error, 1)
	go func() {
		done <- c.Output(ctx, pid, 0, true, func(f agentproto.Frame) error {
			mu.Lock()
			defer mu.Unlock()
			if f.Kind == agentproto.Stdout {
				got.Write(f.Data)
			}
			return nil
		})
	}()
	for i := 0; i < 5; i++ {
		time.Sleep(200 * time.Millisecond)
		c.Drop()
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := 0; i < 400; i++ {
		fmt.Fprintf(&want, "line%d\n", i)
	}
	if got.String() != want.String() {
		t.Fatalf("output after 5 drops differs: got %d bytes, want %d", got.Len(), want.Len())
	}
}

func TestOutputLostAndRewound(t *testing.T) {
	c, _ := hostAgent(t)
	ctx := context.Background()
	s := base()
	s.RingBytes = 1000
	s.Args = []string{"sh", "-c", "head -c 5000 /dev/zero"}
	pid, err := c.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, pid); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	var n, lost int64
	err = c.Output(ctx, pid, 0, true, func(f agentproto.Frame) error {
		kinds = append(kinds, f.Kind.String())
		if f.Kind == agentproto.Lost {
			lost += f.LostBytes()
			if f.Offset != f.LostBytes() {
				t.Errorf("lost frame: %d bytes, going on at %d", f.LostBytes(), f.Offset)
			}
		}
		if f.Kind == agentproto.Stdout {
			n += int64(len(f.Data))
		}
		return nil
	})
	if err != nil || kinds[0] != "lost" || n > 1000 || n == 0 || lost+n != 5000 || kinds[len(kinds)-1] != "exited" {
		t.Fatalf("full ring: %v %v: %d lost, %d sent", kinds, err, lost, n)
	}
	kinds = nil
	err = c.Output(ctx, pid, 9000, true, func(f agentproto.Frame) error {
		kinds = append(kinds, f.Kind.String())
		if f.Kind == agentproto.Rewound && f.Offset != 5000 {
			t.Errorf("rewound to %d, want 5000", f.Offset)
		}
		return nil
	})
	if err != nil || strings.Join(kinds, ",") != "rewound,exited" {
		t.Fatalf("ahead of the ring: %v %v", kinds, err)
	}
}

func TestSignalWaitListAndToken(t *testing.T) {
	c, agentCmd := hostAgent(t)
	ctx := context.Background()
	s := base()
	s.Args = []string{"sleep", "30"}
	pid, err := c.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := c.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range ps {
		if p.PID == agentCmd.Process.Pid {
			t.Fatalf("the list holds the agent itself")
		}
		found = found || p.PID == pid
	}
	if !found {
		t.Fatalf("pid %d not listed", pid)
	}
	if err := c.Signal(ctx, pid, int(syscall.SIGTERM), false); err != nil {
		t.Fatal(err)
	}
	e, err := c.Wait(ctx, pid)
	if err != nil || e.Code != 143 || e.Signal != "SIGTERM" {
		t.Fatalf("wait: %+v %v", e, err)
	}
	bad := New("host", "wrong", c.dial)
	if _, err := bad.Health(ctx); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("wrong token: %v", err)
	}
}

// A stopped agent is "agent unavailable" within the ping deadline.
func TestHungAgentIsUnavailable(t *testing.T) {
	old := PingTimeout
	PingTimeout = time.Second
	defer func() { PingTimeout = old }()
	c, agentCmd := hostAgent(t)
	ctx := context.Background()
	s := base()
	s.Args = []string{"sleep", "30"}
	pid, err := c.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	_ = agentCmd.Process.Signal(syscall.SIGSTOP)
	defer agentCmd.Process.Signal(syscall.SIGCONT)
	oldW := ReattachWindow
	ReattachWindow = 2 * time.Second
	defer func() { ReattachWindow = oldW }()
	start := time.Now()
	_, err = c.Wait(context.Background(), pid)
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("wait on a stopped agent: %v", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestWatch(t *testing.T) {
	c, _ := hostAgent(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ready := make(chan struct{})
	evs := make(chan agentproto.WatchEvent, 100)
	go func() {
		_ = c.Watch(ctx, dir, true, ready, func(e agentproto.WatchEvent) error { evs <- e; return nil })
	}()
	<-ready
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{filepath.Join(dir, "sub") + " create": false, filepath.Join(dir, "sub", "f") + " write": false}
	for seen := 0; seen < len(want); {
		select {
		case e := <-evs:
			k := e.Path + " " + e.Op
			if done, ok := want[k]; ok && !done {
				want[k] = true
				seen++
			}
			if k == filepath.Join(dir, "sub")+" create" {
				time.Sleep(50 * time.Millisecond) // the agent adds its watch on the new directory
				if err := os.WriteFile(filepath.Join(dir, "sub", "f"), []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		case <-ctx.Done():
			t.Fatalf("events seen: %v", want)
		}
	}
	if err := c.Watch(ctx, "relative", false, nil, func(agentproto.WatchEvent) error { return nil }); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("relative path: %v", err)
	}
}

// An attached exec loses no output however far it runs ahead of a slow
// reader: the ring (1 MiB here) holds the process back instead.
func TestExecOutputIsNeverDropped(t *testing.T) {
	c, _ := hostAgent(t)
	var out slowWriter
	st, err := c.Exec(context.Background(), sandbox.ExecSpec{Args: []string{"sh", "-c", "head -c 4194304 /dev/zero | tr '\\0' x"}, Stdout: &out}, base())
	if err != nil || st.Code != 0 {
		t.Fatalf("exec: %+v %v", st, err)
	}
	if out.n != 4<<20 || out.other != 0 {
		t.Fatalf("got %d bytes (%d not x), want %d", out.n, out.other, 4<<20)
	}
}

// slowWriter counts what it gets, slowly at first.
type slowWriter struct{ n, other int }

func (w *slowWriter) Write(p []byte) (int, error) {
	if w.n < 2<<20 {
		time.Sleep(2 * time.Millisecond)
	}
	for _, b := range p {
		if b != 'x' {
			w.other++
		}
	}
	w.n += len(p)
	return len(p), nil
}

// A start asked twice under one key (the client's connection broke
// mid-call) starts one process.
func TestStartKeyIsIdempotent(t *testing.T) {
	c, _ := hostAgent(t)
	s := base()
	s.Args = []string{"sleep", "30"}
	s.Key = "k-1"
	p1, err := c.Start(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := c.Start(context.Background(), s)
	if err != nil || p2 != p1 {
		t.Fatalf("second start under the same key: pid %d (first %d), %v", p2, p1, err)
	}
	s.Key = "k-2"
	if p3, err := c.Start(context.Background(), s); err != nil || p3 == p1 {
		t.Fatalf("another key: pid %d, %v", p3, err)
	}
}

// An exec is one round trip (an attached start); when its stream breaks
// (every connection dropped, as before a checkpoint) it re-attaches: the
// caller gets each byte once, the exit status, and the command ran once.
func TestExecReattachesWithoutGapOrRepeat(t *testing.T) {
	c, _ := hostAgent(t)
	ctx := context.Background()
	dir := t.TempDir()
	var out bytes.Buffer
	done := make(chan error, 1)
	var st sandbox.ExitStatus
	go func() {
		var err error
		st, err = c.Exec(ctx, sandbox.ExecSpec{Args: []string{"sh", "-c", "echo run >> " + dir + "/runs; i=0; while [ $i -lt 300 ]; do echo line$i; i=$((i+1)); sleep 0.005; done; exit 4"}, Stdout: &out}, base())
		done <- err
	}()
	for i := 0; i < 5; i++ {
		time.Sleep(150 * time.Millisecond)
		c.Drop()
	}
	if err := <-done; err != nil || st.Code != 4 {
		t.Fatalf("exec across drops: %+v %v", st, err)
	}
	var want strings.Builder
	for i := 0; i < 300; i++ {
		fmt.Fprintf(&want, "line%d\n", i)
	}
	if out.String() != want.String() {
		t.Fatalf("output after 5 drops differs: got %d bytes, want %d", out.Len(), want.Len())
	}
	if runs, _ := os.ReadFile(filepath.Join(dir, "runs")); string(runs) != "run\n" {
		t.Fatalf("the command ran %d times", strings.Count(string(runs), "run"))
	}
}

// An agent before protocol 1.1 answers an attached start with Started
// alone: the host then asks for the output, as it did before.
func TestExecWithAgentBeforeAttachedStarts(t *testing.T) {
	var outputs int
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/processes", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"pid":42}`))
	})
	mux.HandleFunc("GET /v1/processes/42/output", func(w http.ResponseWriter, r *http.Request) {
		outputs++
		_ = agentproto.WriteFrame(w, agentproto.Frame{Kind: agentproto.Stdout, Data: []byte("old\n")})
		_ = agentproto.WriteFrame(w, agentproto.ExitFrame(4, agentproto.Exit{Code: 7}))
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: &protos}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	c := New("old", "tok", func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	})
	var out bytes.Buffer
	var pid int
	st, err := c.Exec(context.Background(), sandbox.ExecSpec{Args: []string{"x"}, Stdout: &out, Started: func(p int) { pid = p }}, base())
	if err != nil || st.Code != 7 || out.String() != "old\n" || pid != 42 || outputs != 1 {
		t.Fatalf("exec through an old agent: %+v %v out=%q pid=%d outputs=%d", st, err, out.String(), pid, outputs)
	}
}
