package sandboxtest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
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
	if !slices.ContainsFunc(procs, func(p sandbox.Process) bool { return p.PID == 1 }) {
		t.Errorf("Processes = %+v, want the init (pid 1)", procs)
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
