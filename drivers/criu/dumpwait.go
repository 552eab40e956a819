package criu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runc/libcontainer"

	"github.com/amber-run/amber/core/errdefs"
)

// dumpTimeout bounds one CRIU dump when the caller's context has no earlier
// deadline (a variable: tests shorten it).
var dumpTimeout = 3 * time.Minute

// dumpWithin runs CRIU's dump of ls (its cgroup cm frozen by the caller)
// and gives up when ctx ends or dumpTimeout passes: a task the kernel holds
// (uninterruptible sleep, a seize that cannot complete) keeps CRIU waiting
// in the kernel for as long as the cgroup stays frozen. Giving up thaws the
// cgroup — which lets the waiting CRIU go on and end, so that no helper
// stays behind — and waits for the dump call to return; its result, taken
// of a sandbox that ran again, is thrown away. The sandbox keeps running.
func (d *Driver) dumpWithin(ctx context.Context, ls *liveSandbox, co *libcontainer.CriuOpts, cm cgroups.Manager) error {
	done := make(chan error, 1)
	go func() { done <- ls.c.Checkpoint(co) }()
	limit := dumpTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < limit {
		limit = time.Until(dl)
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
	case <-ctx.Done():
	}
	if err := cm.Freeze(cgroups.Thawed); err != nil {
		d.log.Error("thaw after a dump that did not end", "err", err)
	}
	// Frozen tasks read as D: what is still held once thawed is what
	// held the dump.
	time.Sleep(50 * time.Millisecond)
	held := heldTasks(cm)
	select {
	case <-done:
	case <-time.After(time.Minute):
		d.log.Error("criu dump does not return after the thaw", "tasks", held)
	}
	why := "the dump did not finish"
	if held != "" {
		why += "; tasks the kernel held: " + held
	}
	return errdefs.Unavailablef("criu dump gave up after %v: %s; the sandbox was thawed and keeps running (checkpoint again, or stop what holds it)", limit.Round(time.Millisecond), why)
}

// procState reads the state letter and name of pid from /proc.
func procState(pid int) (state, name string, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", "", false
	}
	i, j := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if i < 0 || j < i || j+2 >= len(b) {
		return "", "", false
	}
	f := strings.Fields(string(b[j+1:]))
	if len(f) == 0 {
		return "", "", false
	}
	return f[0], string(b[i+1 : j]), true
}

// stoppedTasks names the tasks of cm that are stopped (T) or traced (t):
// CRIU cannot seize them under the sandbox's frozen cgroup.
func stoppedTasks(cm cgroups.Manager) error {
	pids, err := cm.GetAllPids()
	if err != nil {
		return nil // the freeze and the dump will say what is wrong
	}
	var found []string
	for _, pid := range pids {
		if len(found) == 5 {
			break
		}
		st, name, ok := procState(pid)
		if !ok {
			continue
		}
		switch st {
		case "T":
			found = append(found, fmt.Sprintf("%s (pid %d) is stopped", name, sandboxPid(pid)))
		case "t":
			found = append(found, fmt.Sprintf("%s (pid %d) is being traced", name, sandboxPid(pid)))
		}
	}
	if len(found) == 0 {
		return nil
	}
	return fmt.Errorf("%s: CRIU cannot seize a stopped or traced process while the sandbox is frozen (continue it with SIGCONT, or end the tracer)", strings.Join(found, ", "))
}

// heldTasks names the tasks of cm in uninterruptible sleep (D), for the
// error of a dump that did not end.
func heldTasks(cm cgroups.Manager) string {
	pids, err := cm.GetAllPids()
	if err != nil {
		return ""
	}
	var out []string
	for _, pid := range pids {
		if st, name, ok := procState(pid); ok && (st == "D" || st == "T" || st == "t") && len(out) < 5 {
			out = append(out, fmt.Sprintf("%s (pid %d, state %s)", name, sandboxPid(pid), st))
		}
	}
	return strings.Join(out, ", ")
}

// sandboxPid is host pid's pid inside the sandbox (the last NSpid), what
// the tenant knows it by; pid itself when it cannot be read.
func sandboxPid(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return pid
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(v)
			if n, err := strconv.Atoi(f[len(f)-1]); err == nil && len(f) > 0 {
				return n
			}
		}
	}
	return pid
}

// vforkWaitAttempts bounds how many times freezeSeizable thaws the sandbox
// to let a vfork in progress reach its exec; vforkWaitPause is the pause
// between the thaw and the next freeze.
const (
	vforkWaitAttempts = 40
	vforkWaitPause    = 5 * time.Millisecond
)

// vforkThaws counts the freezes thawed for a vfork in progress (tests read
// it).
var vforkThaws atomic.Int64

// freezeSeizable freezes cm (freezeRetrying) in a state CRIU can seize.
// A task that waits in vfork for a child that has not yet called exec can
// never be seized: CRIU stops the child before its exec, the parent waits
// for the child in uninterruptible sleep (kernel_clone), and the dump gives
// up after CRIU's 10 s timeout ("Unseizable non-zombie …, state D"). dash
// runs most commands so and Go's os/exec does the same, so a busy shell
// loop meets the window now and then. Such a freeze is thawed and made
// again a moment later (the child execs within microseconds); a child that
// has still not called exec after vforkWaitAttempts fails the checkpoint
// with an error naming the waiting task, the sandbox thawed and running.
func freezeSeizable(ctx context.Context, d *Driver, cm cgroups.Manager, id string) (time.Time, error) {
	for attempt := 1; ; attempt++ {
		frozenAt, err := freezeRetrying(ctx, d, cm, id)
		if err != nil {
			return frozenAt, err
		}
		waiting := vforkWaiters(cm)
		if len(waiting) == 0 {
			return frozenAt, nil
		}
		vforkThaws.Add(1)
		if err := cm.Freeze(cgroups.Thawed); err != nil {
			return frozenAt, recordErr(id, fmt.Errorf("thaw for a vfork in progress: %w", err))
		}
		if attempt == vforkWaitAttempts {
			return frozenAt, errdefs.FailedPreconditionf("checkpoint %s: %s waits for a child it started with vfork, which has not called exec after %d tries: CRIU cannot seize a vfork in progress; the sandbox keeps running", id, strings.Join(waiting, ", "), attempt)
		}
		select {
		case <-ctx.Done():
			return frozenAt, ctx.Err()
		case <-time.After(vforkWaitPause):
		}
	}
}

// vforkWaiters names the tasks of cm (any thread: Go's os/exec vforks from
// whichever thread runs it) that sleep in kernel_clone, which is where a
// vfork's parent waits for its child's exec or exit.
func vforkWaiters(cm cgroups.Manager) []string {
	pids, err := cm.GetAllPids()
	if err != nil {
		return nil
	}
	var out []string
	for _, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid) + "/task/"
		tids, _ := os.ReadDir(dir)
		for _, tid := range tids {
			b, err := os.ReadFile(dir + tid.Name() + "/wchan")
			if err != nil || strings.TrimSpace(string(b)) != "kernel_clone" {
				continue
			}
			_, name, _ := procState(pid)
			out = append(out, fmt.Sprintf("%s (pid %d)", name, sandboxPid(pid)))
			break
		}
		if len(out) == 5 {
			break
		}
	}
	return out
}
