package sandboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/lib/agentproto"
)

// testBackground: a started process keeps running across execs with the
// same PID and start time, is listed, logs to /run/amber/proc/<pid>.log,
// and dies (and is reaped) when signalled.
func (s *suite) testBackground(t *testing.T) {
	id := s.create(t, "bg", sandbox.Limits{})
	ctx := ctxFor(t, 5*time.Minute)
	pid, err := s.d.Start(ctx, id, sandbox.ExecSpec{
		Args: []string{"/bin/sh", "-c", `echo "started $$ $X $(pwd)"; while :; do sleep 1; done`},
		Env:  []string{"X=env-ok"},
		Cwd:  "/tmp",
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if pid <= 1 {
		t.Fatalf("Start returned pid %d", pid)
	}
	find := func(procs []sandbox.Process) (sandbox.Process, bool) {
		i := slices.IndexFunc(procs, func(p sandbox.Process) bool { return p.PID == pid })
		if i < 0 {
			return sandbox.Process{}, false
		}
		return procs[i], true
	}
	procs, err := s.d.Processes(ctx, id)
	if err != nil {
		t.Fatalf("Processes: %v", err)
	}
	first, ok := find(procs)
	if !ok {
		t.Fatalf("Processes = %+v, want pid %d", procs, pid)
	}
	if len(first.Args) < 3 || !strings.HasSuffix(first.Args[0], "sh") || !strings.Contains(first.Args[2], "while :") {
		t.Errorf("Args = %q, want the command as started", first.Args)
	}
	if first.StartTicks == 0 || first.State == "" || first.State == "Z" || first.PPID < 0 {
		t.Errorf("process = %+v", first)
	}
	// The sandbox's own agent (its init, when it has one) is not the
	// tenant's process: not listed.
	if slices.ContainsFunc(procs, func(p sandbox.Process) bool { return len(p.Args) > 0 && p.Args[0] == agentproto.Path }) {
		t.Errorf("Processes = %+v: lists the sandbox's agent", procs)
	}

	// Its output is in its log, named after the pid it has.
	fs := s.files(t, id)
	want := fmt.Sprintf("started %d env-ok /tmp\n", pid)
	eventually(t, 20*time.Second, func() string {
		got, err := readFile(t, fs, fmt.Sprintf("/run/amber/proc/%d.log", pid))
		if err != nil || got != want {
			return fmt.Sprintf("log = %q, %v; want %q", got, err, want)
		}
		return ""
	})

	for range 3 {
		s.sh(t, id, "true")
	}
	procs, err = s.d.Processes(ctx, id)
	if err != nil {
		t.Fatalf("Processes: %v", err)
	}
	again, ok := find(procs)
	if !ok || again.StartTicks != first.StartTicks {
		t.Fatalf("after three execs: %+v (found %v), want %+v", again, ok, first)
	}

	// A signal ends it; it does not linger as a zombie.
	if err := s.d.Signal(ctx, id, pid, syscall.SIGTERM); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	eventually(t, 20*time.Second, func() string {
		procs, err := s.d.Processes(ctx, id)
		if err != nil {
			return err.Error()
		}
		if p, ok := find(procs); ok {
			return fmt.Sprintf("pid %d still listed after SIGTERM: %+v", pid, p)
		}
		return ""
	})
	if err := s.d.Signal(ctx, id, pid, syscall.SIGKILL); err == nil {
		t.Errorf("Signal to a dead pid succeeded")
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		t.Logf("Signal to a dead pid: %v (not ErrNotFound)", err)
	}

	// Several at once, each its own pid; SIGKILL ends one, the other stays.
	a, errA := s.d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"sleep", "3201"}})
	b, errB := s.d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"sleep", "3202"}})
	if errA != nil || errB != nil || a == b {
		t.Fatalf("Start two: %d %v, %d %v", a, errA, b, errB)
	}
	if err := s.d.Signal(ctx, id, a, syscall.SIGKILL); err != nil {
		t.Fatalf("Signal KILL: %v", err)
	}
	eventually(t, 20*time.Second, func() string {
		procs, err := s.d.Processes(ctx, id)
		if err != nil {
			return err.Error()
		}
		hasA := slices.ContainsFunc(procs, func(p sandbox.Process) bool { return p.PID == a })
		hasB := slices.ContainsFunc(procs, func(p sandbox.Process) bool { return p.PID == b })
		if hasA || !hasB {
			return fmt.Sprintf("want %d gone and %d running: %+v", a, b, procs)
		}
		return ""
	})
	if _, err := s.d.Start(ctx, id, sandbox.ExecSpec{}); err == nil {
		t.Errorf("Start with no command succeeded")
	}
}

// testWait: Wait returns how a started process ended (exit code, or the
// signal that killed it), also when called after the end, twice, and by a
// restarted driver; a pid Start did not make is ErrNotFound; a cancelled
// Wait returns promptly and leaves the process running.
func (s *suite) testWait(t *testing.T) {
	id := s.create(t, "wait", sandbox.Limits{})
	ctx := ctxFor(t, 5*time.Minute)
	start := func(t *testing.T, script string) int {
		t.Helper()
		pid, err := s.d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", script}})
		if err != nil {
			t.Fatalf("Start %q: %v", script, err)
		}
		return pid
	}
	wait := func(t *testing.T, pid int) sandbox.ExitStatus {
		t.Helper()
		st, err := s.d.Wait(ctxFor(t, 2*time.Minute), id, pid)
		if err != nil {
			t.Fatalf("Wait(%d): %v", pid, err)
		}
		return st
	}
	listed := func(t *testing.T, pid int) bool {
		t.Helper()
		procs, err := s.d.Processes(ctx, id)
		if err != nil {
			t.Fatalf("Processes: %v", err)
		}
		return slices.ContainsFunc(procs, func(p sandbox.Process) bool { return p.PID == pid })
	}

	t.Run("ExitZero", func(t *testing.T) {
		pid := start(t, "sleep 1; exit 0")
		if st := wait(t, pid); st != (sandbox.ExitStatus{}) {
			t.Errorf("Wait = %+v, want exit 0", st)
		}
	})
	t.Run("ExitCode", func(t *testing.T) {
		// Waited for while it runs, then again after the end.
		pid := start(t, "echo before; sleep 1; exit 7")
		for i := range 2 {
			if st := wait(t, pid); st != (sandbox.ExitStatus{Code: 7}) {
				t.Errorf("Wait #%d = %+v, want exit 7", i+1, st)
			}
		}
		// Its log is still there, and complete.
		if got, err := readFile(t, s.files(t, id), fmt.Sprintf("/run/amber/proc/%d.log", pid)); err != nil || got != "before\n" {
			t.Errorf("log = %q, %v", got, err)
		}
	})
	t.Run("AfterEnd", func(t *testing.T) {
		// Nobody waits while it ends; a restarted driver still gets the
		// status.
		pid := start(t, "exit 3")
		eventually(t, 30*time.Second, func() string {
			if listed(t, pid) {
				return fmt.Sprintf("pid %d still listed", pid)
			}
			return ""
		})
		d2 := s.newDriver(t)
		st, err := d2.Wait(ctxFor(t, 2*time.Minute), id, pid)
		if err != nil || st != (sandbox.ExitStatus{Code: 3}) {
			t.Errorf("Wait by a new driver = %+v, %v; want exit 3", st, err)
		}
	})
	t.Run("Killed", func(t *testing.T) {
		pid := start(t, "while :; do sleep 1; done")
		if err := s.d.Signal(ctx, id, pid, syscall.SIGKILL); err != nil {
			t.Fatalf("Signal: %v", err)
		}
		st := wait(t, pid)
		if st.Signal != "SIGKILL" || st.Code != 128+int(syscall.SIGKILL) {
			t.Errorf("Wait = %+v, want killed by SIGKILL", st)
		}
		// Another signal, to show the name is the signal's.
		pid = start(t, "while :; do sleep 1; done")
		if err := s.d.Signal(ctx, id, pid, syscall.SIGTERM); err != nil {
			t.Fatalf("Signal: %v", err)
		}
		if st := wait(t, pid); st.Signal != "SIGTERM" || st.Code != 128+int(syscall.SIGTERM) {
			t.Errorf("Wait = %+v, want ended by SIGTERM", st)
		}
	})
	t.Run("EnvNotListed", func(t *testing.T) {
		// Whatever waits for the process inside the sandbox does not
		// show the environment it was given (a secret, often) on a
		// command line that Processes lists.
		secret := randToken("secret")
		pid, err := s.d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"sleep", "3600"}, Env: []string{"AMBER_SECRET=" + secret}})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		procs, err := s.d.Processes(ctx, id)
		if err != nil {
			t.Fatalf("Processes: %v", err)
		}
		i := slices.IndexFunc(procs, func(p sandbox.Process) bool { return p.PID == pid })
		if i < 0 || strings.Join(procs[i].Args, " ") != "sleep 3600" {
			t.Errorf("Processes = %+v, want pid %d running sleep 3600", procs, pid)
		}
		for _, p := range procs {
			if strings.Contains(strings.Join(p.Args, " "), secret) {
				t.Errorf("process %d lists the environment's secret: %q", p.PID, p.Args)
			}
		}
		if got := s.sh(t, id, fmt.Sprintf("tr '\\000' '\\n' < /proc/%d/environ | grep AMBER_SECRET", pid)); got != "AMBER_SECRET="+secret+"\n" {
			t.Errorf("the process's environment: %q", got)
		}
		if err := s.d.Signal(ctx, id, pid, syscall.SIGKILL); err != nil {
			t.Fatalf("Signal: %v", err)
		}
	})
	t.Run("NotStarted", func(t *testing.T) {
		for _, pid := range []int{1, 99999} {
			if st, err := s.d.Wait(ctxFor(t, callTimeout), id, pid); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("Wait(%d) = %+v, %v; want ErrNotFound", pid, st, err)
			}
		}
		if _, err := s.d.Wait(ctxFor(t, callTimeout), s.prefix+"-nosuch", 2); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Wait in a missing sandbox: %v, want ErrNotFound", err)
		}
	})
	t.Run("Cancelled", func(t *testing.T) {
		pid := start(t, "while :; do sleep 1; done")
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		begin := time.Now()
		st, err := s.d.Wait(wctx, id, pid)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait with a 1s deadline = %+v, %v; want the deadline's error", st, err)
		}
		// Generous: the host may be busy, but the wait must not wait for
		// the process.
		if took := time.Since(begin); took > 20*time.Second {
			t.Errorf("Wait returned %v after a 1s deadline", took)
		}
		if !listed(t, pid) {
			t.Fatalf("pid %d is gone after a cancelled Wait", pid)
		}
		if err := s.d.Signal(ctx, id, pid, syscall.SIGKILL); err != nil {
			t.Fatalf("Signal: %v", err)
		}
		if st := wait(t, pid); st.Signal != "SIGKILL" {
			t.Errorf("Wait after the cancelled one = %+v, want SIGKILL", st)
		}
	})
}
