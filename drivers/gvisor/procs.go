package gvisor

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/procwait"
)

// psScript prints, for every process of the sandbox, two lines: "S " and
// its /proc/<pid>/stat, and "C " and its command line, with NUL turned into
// \001 and newline into \002 so that each stays one line. The first line
// is the shell's own PID: the listing's processes (the shell and its
// children, all in the session the shell leads) are left out.
//
// `runsc ps` is not used: it reports neither the argument vector nor the
// start time in clock ticks, which tests need to tell a restored process
// from a restarted one.
const psScript = `echo $$; for d in /proc/[0-9]*; do s=$(tr '\n' ' ' < $d/stat 2>/dev/null) || continue; [ -n "$s" ] || continue; c=$(tr '\000\n' '\001\002' < $d/cmdline 2>/dev/null); printf 'S %s\nC %s\n' "$s" "$c"; done`

// Processes implements sandbox.Driver by reading /proc inside the sandbox:
// the agent's listing (without the agent), or, in a sandbox of the sh
// init's generations, an exec of the template's /bin/sh (with the init).
func (d *Driver) Processes(ctx context.Context, id string) ([]sandbox.Process, error) {
	rec, err := d.running(id)
	if err != nil {
		return nil, err
	}
	if rec.SpecVersion >= 2 {
		return d.agentProcesses(ctx, rec)
	}
	var out, errb bytes.Buffer
	st, err := d.runscExec(ctx, rec, sandbox.ExecSpec{
		Args:    []string{"/bin/sh", "-c", psScript},
		Stdout:  &out,
		Stderr:  &errb,
		Timeout: time.Minute,
	})
	if err != nil {
		return nil, err
	}
	if st.Code != 0 {
		return nil, fmt.Errorf("processes of %s: exit %d: %s", id, st.Code, strings.TrimSpace(errb.String()))
	}
	return parsePS(out.Bytes())
}

// parsePS parses psScript's output.
func parsePS(b []byte) ([]sandbox.Process, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	if !sc.Scan() {
		return nil, fmt.Errorf("processes: empty listing")
	}
	self, err := strconv.Atoi(strings.TrimSpace(sc.Text()))
	if err != nil {
		return nil, fmt.Errorf("processes: bad first line %q", sc.Text())
	}
	var (
		out []sandbox.Process
		cur *sandbox.Process
	)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "S "):
			p, sid, ok := parseStat(line[2:])
			cur = nil
			if ok && sid != self {
				out = append(out, p)
				cur = &out[len(out)-1]
			}
		case strings.HasPrefix(line, "C ") && cur != nil:
			c := strings.TrimRight(line[2:], "\x01")
			if c != "" {
				cur.Args = strings.Split(strings.ReplaceAll(c, "\x02", "\n"), "\x01")
			}
			cur = nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out, nil
}

// parseStat reads pid, comm, state, ppid, session and starttime from a
// /proc/<pid>/stat line. comm may hold anything but is bracketed by the
// first "(" and the last ")".
func parseStat(s string) (p sandbox.Process, sid int, ok bool) {
	open := strings.IndexByte(s, '(')
	closing := strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return p, 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(s[:open]))
	if err != nil {
		return p, 0, false
	}
	comm := s[open+1 : closing]
	f := strings.Fields(s[closing+1:])
	// f[0] is field 3 (state); starttime is field 22.
	if len(f) < 20 {
		return p, 0, false
	}
	ppid, _ := strconv.Atoi(f[1])
	sid, _ = strconv.Atoi(f[3])
	start, _ := strconv.ParseUint(f[19], 10, 64)
	return sandbox.Process{PID: pid, PPID: ppid, Args: []string{comm}, StartTicks: start, State: f[0]}, sid, true
}

// Signal implements sandbox.Driver through the agent, or with `runsc kill
// --pid` in a sandbox of the sh init's generations.
func (d *Driver) Signal(ctx context.Context, id string, pid int, sig os.Signal) error {
	rec, err := d.running(id)
	if err != nil {
		return err
	}
	s, ok := sig.(syscall.Signal)
	if !ok || unix.SignalName(s) == "" {
		return errdefs.InvalidArgumentf("signal %v", sig)
	}
	if pid <= 0 {
		return errdefs.InvalidArgumentf("signal: pid %d", pid)
	}
	if rec.SpecVersion >= 2 {
		return d.agentSignal(ctx, rec, pid, s)
	}
	if _, err := d.run(ctx, rec, "kill", "--pid="+strconv.Itoa(pid), runtimeID(id), strconv.Itoa(int(s))); err != nil {
		if strings.Contains(err.Error(), "no such process") {
			return errdefs.NotFoundf("sandbox %s: process %d", id, pid)
		}
		return classify(id, err)
	}
	return nil
}

// Wait implements sandbox.Driver with drivers/internal/procwait: the exit file the
// process's waiter writes is read on the host, in the layer that runsc
// serves as the sandbox's root (writes inside go through to it at once:
// --overlay2=none), every 100ms; every 2s an exec of Processes checks that
// the process is still there, and that the sandbox still runs.
//
// In a sandbox whose init is the agent, the agent answers (agentWait).
func (d *Driver) Wait(ctx context.Context, id string, pid int) (sandbox.ExitStatus, error) {
	rec, err := d.running(id)
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	if pid <= 0 {
		return sandbox.ExitStatus{}, errdefs.InvalidArgumentf("wait: pid %d", pid)
	}
	if rec.SpecVersion >= 2 {
		return d.agentWait(ctx, rec, pid)
	}
	fs, err := d.Files(ctx, id)
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	alive := func(ctx context.Context, pid int) (bool, error) {
		ps, err := d.Processes(ctx, id)
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(ps, func(p sandbox.Process) bool { return p.PID == pid }), nil
	}
	st, err := procwait.Wait(ctx, fs, pid, alive, procwait.Options{})
	if err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return st, nil
}
