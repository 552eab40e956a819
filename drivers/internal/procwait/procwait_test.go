package procwait

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/confinedfs"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    sandbox.ExitStatus
		ok, bad bool
	}{
		{in: "", ok: false},
		{in: "0\n", want: sandbox.ExitStatus{Code: 0}, ok: true},
		{in: "7\n", want: sandbox.ExitStatus{Code: 7}, ok: true},
		{in: "128\n", want: sandbox.ExitStatus{Code: 128}, ok: true},
		{in: "137\n", want: sandbox.ExitStatus{Code: 137, Signal: "SIGKILL"}, ok: true},
		{in: "143\n", want: sandbox.ExitStatus{Code: 143, Signal: "SIGTERM"}, ok: true},
		{in: "255\n", want: sandbox.ExitStatus{Code: 255}, ok: true}, // 127 is no signal
		{in: "7", bad: true},
		{in: "7\n8\n", bad: true},
		{in: "-1\n", bad: true},
		{in: "256\n", bad: true},
		{in: "seven\n", bad: true},
	} {
		st, ok, err := Parse([]byte(tc.in))
		if tc.bad {
			if err == nil {
				t.Errorf("Parse(%q) = %+v, %v; want an error", tc.in, st, ok)
			}
			continue
		}
		if err != nil || ok != tc.ok || st != tc.want {
			t.Errorf("Parse(%q) = %+v, %v, %v; want %+v, %v", tc.in, st, ok, err, tc.want, tc.ok)
		}
	}
}

// host runs the waiter with the host's /bin/sh in a directory that stands
// for a sandbox root; the host's processes stand for the sandbox's.
type host struct {
	t    *testing.T
	root string
	fs   sandbox.FS
}

func newHost(t *testing.T) *host {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, Dir), 0o755); err != nil {
		t.Fatal(err)
	}
	fs, err := confinedfs.New(root)
	if err != nil {
		t.Fatal(err)
	}
	return &host{t: t, root: root, fs: fs}
}

// start runs the waiter for args and returns the command's PID and the
// waiter's process. Every process it starts is killed (by PID) when the
// test ends.
func (h *host) start(setup string, args ...string) (int, *exec.Cmd) {
	h.t.Helper()
	script := Script(filepath.Join(h.root, Dir), setup, `echo "$amber_c"; exec >/dev/null`)
	cmd := exec.Command("/bin/sh", append([]string{"-c", script, "amber-wait"}, args...)...)
	r, w, err := os.Pipe()
	if err != nil {
		h.t.Fatal(err)
	}
	defer r.Close()
	cmd.Stdout, cmd.Stderr = w, os.Stderr
	err = cmd.Start()
	w.Close()
	if err != nil {
		h.t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	// The waiter prints the PID and closes its stdout (so does the
	// command, redirecting to its log): read to the end.
	_ = r.SetReadDeadline(time.Now().Add(30 * time.Second))
	out, _ := io.ReadAll(r)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	h.t.Cleanup(func() {
		killChild(pid, cmd.Process.Pid)
		_ = cmd.Process.Kill()
		<-waited
	})
	if pid <= 0 {
		h.t.Fatalf("the waiter printed %q", out)
	}
	return pid, cmd
}

// killChild SIGKILLs pid if it is still a child of parent, through a pidfd
// checked after it was opened (a PID that was reused is left alone).
func killChild(pid, parent int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 2 || f[1] != strconv.Itoa(parent) {
		return
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// alive is Alive for host processes: a zombie of the waiter still counts.
func alive(ctx context.Context, pid int) (bool, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false, nil
	}
	return len(b) > 0, nil
}

var fast = Options{Poll: 10 * time.Millisecond, CheckEvery: 50 * time.Millisecond, Grace: 500 * time.Millisecond}

func (h *host) wait(ctx context.Context, pid int) (sandbox.ExitStatus, error) {
	return Wait(ctx, h.fs, pid, alive, fast)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestWaitExitCodes(t *testing.T) {
	h := newHost(t)
	ctx := ctxFor(t, time.Minute)
	for _, tc := range []struct {
		script string
		want   sandbox.ExitStatus
	}{
		{"exit 0", sandbox.ExitStatus{Code: 0}},
		{"echo out; echo err >&2; exit 7", sandbox.ExitStatus{Code: 7}},
		{"kill -TERM $$", sandbox.ExitStatus{Code: 143, Signal: "SIGTERM"}},
	} {
		pid, _ := h.start("", "/bin/sh", "-c", tc.script)
		st, err := h.wait(ctx, pid)
		if err != nil || st != tc.want {
			t.Errorf("%q: Wait = %+v, %v; want %+v", tc.script, st, err, tc.want)
		}
		// Again, after the end: the same status.
		if st2, err := h.wait(ctx, pid); err != nil || st2 != st {
			t.Errorf("%q: second Wait = %+v, %v; want %+v", tc.script, st2, err, st)
		}
	}
	// The log is named after the PID and holds both streams.
	pid, _ := h.start("", "/bin/sh", "-c", "echo out; echo err >&2; exit 3")
	if st, err := h.wait(ctx, pid); err != nil || st.Code != 3 {
		t.Fatalf("Wait = %+v, %v", st, err)
	}
	if b, err := os.ReadFile(filepath.Join(h.root, Dir, strconv.Itoa(pid)+".log")); err != nil || string(b) != "out\nerr\n" {
		t.Errorf("log = %q, %v", b, err)
	}
}

// TestWaitSetup: setup runs in the command's shell before the exec (the
// gvisor driver's environment and working directory), and a failing cd is
// the command's status.
func TestWaitSetup(t *testing.T) {
	h := newHost(t)
	ctx := ctxFor(t, time.Minute)
	dir := t.TempDir()
	pid, _ := h.start("export "+ShQuote("X=it's set")+"\ncd "+ShQuote(dir)+" || exit 127\n", "/bin/sh", "-c", `[ "$X" = "it's set" ] && [ "$(pwd)" = "$1" ] && exit 5; exit 1`, "sh", dir)
	if st, err := h.wait(ctx, pid); err != nil || st.Code != 5 {
		t.Errorf("Wait = %+v, %v; want code 5 (env and cwd set)", st, err)
	}
	pid, _ = h.start("cd /nonexistent-dir || exit 127\n", "true")
	if st, err := h.wait(ctx, pid); err != nil || st.Code != 127 {
		t.Errorf("Wait = %+v, %v; want code 127", st, err)
	}
}

func TestWaitSignalled(t *testing.T) {
	h := newHost(t)
	ctx := ctxFor(t, time.Minute)
	pid, waiter := h.start("", "sleep", "600")
	// The command is the waiter's child with the PID reported (not a
	// shell in between).
	waitForComm(t, pid, "sleep")
	killChild(pid, waiter.Process.Pid)
	st, err := h.wait(ctx, pid)
	if err != nil || st != (sandbox.ExitStatus{Code: 137, Signal: "SIGKILL"}) {
		t.Fatalf("Wait = %+v, %v; want SIGKILL", st, err)
	}
}

// waitForComm waits until pid runs comm (the exec'd command, no longer the
// shell that opened its log).
func waitForComm(t *testing.T, pid int, comm string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if string(b) == comm+"\n" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d runs %q, want %s", pid, b, comm)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWaitCancelled(t *testing.T) {
	h := newHost(t)
	pid, _ := h.start("", "sleep", "600")
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(200 * time.Millisecond); cancel() }()
	start := time.Now()
	_, err := h.wait(ctx, pid)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Wait took %v after the cancel", took)
	}
	if ok, _ := alive(context.Background(), pid); !ok {
		t.Errorf("process %d is gone after a cancelled Wait", pid)
	}
	if b, _ := os.ReadFile(filepath.Join(h.root, ExitPath(pid))); len(b) != 0 {
		t.Errorf("exit file %q while the process runs", b)
	}
}

func TestWaitNotFound(t *testing.T) {
	h := newHost(t)
	ctx := ctxFor(t, time.Minute)
	// A live process that the waiter did not start.
	if _, err := h.wait(ctx, os.Getpid()); !errdefs.IsNotFound(err) {
		t.Errorf("Wait(self) = %v, want not found", err)
	}
	if _, err := h.wait(ctx, 0); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Wait(0) = %v, want invalid argument", err)
	}
}

// TestWaitWaiterKilled: when the waiter is killed, the status cannot be
// recorded; Wait says so once the process is gone instead of waiting
// forever.
func TestWaitWaiterKilled(t *testing.T) {
	h := newHost(t)
	ctx := ctxFor(t, time.Minute)
	pid, waiter := h.start("", "sleep", "600")
	waitForComm(t, pid, "sleep")
	killChild(pid, waiter.Process.Pid)
	if err := waiter.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// The orphan is reaped by the test binary's subreaper or init.
	_, err := h.wait(ctx, pid)
	if !errdefs.IsDataLoss(err) {
		t.Fatalf("Wait = %v, want data loss", err)
	}
}

// TestWaitGarbage: an exit file the sandbox scribbled on is an error, never
// a status.
func TestWaitGarbage(t *testing.T) {
	h := newHost(t)
	ctx := ctxFor(t, time.Minute)
	for i, content := range []string{"lots\n", strings.Repeat("1", 1000)} {
		pid := 1_000_000 + i
		if err := os.WriteFile(filepath.Join(h.root, ExitPath(pid)), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if st, err := h.wait(ctx, pid); !errdefs.IsDataLoss(err) {
			t.Errorf("exit file %.20q: Wait = %+v, %v; want data loss", content, st, err)
		}
	}
}

func TestStarting(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"/bin/sh", "-c", "exec </dev/null", "amber-proc", "sleep", "1"}, true},
		{[]string{"/bin/sh", "-c", "waiter", "amber-wait", "sleep", "1"}, true},
		{[]string{"/bin/sh", "-c", "amber_b=...", "amber-proc"}, true},
		{[]string{"sleep", "1000"}, false},
		{[]string{"/bin/sh", "-c", "echo amber-proc"}, false},
		{[]string{"/bin/sh", "-c", "x", "sh", "amber-proc"}, false},
		{nil, false},
	} {
		if got := Starting(tc.args); got != tc.want {
			t.Errorf("Starting(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}
