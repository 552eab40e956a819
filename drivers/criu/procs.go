package criu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/procwait"
)

// procStatus is what the driver reads from /proc/<pid>/status.
type procStatus struct {
	ppid  int   // in the host's PID namespace
	nspid []int // NSpid: host first, sandbox last
}

func readStatus(pid int) (procStatus, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procStatus{}, err
	}
	var st procStatus
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch k {
		case "PPid":
			st.ppid, _ = strconv.Atoi(strings.TrimSpace(v))
		case "NSpid":
			for _, f := range strings.Fields(v) {
				n, err := strconv.Atoi(f)
				if err != nil {
					return procStatus{}, fmt.Errorf("/proc/%d/status: NSpid %q", pid, v)
				}
				st.nspid = append(st.nspid, n)
			}
		}
	}
	if len(st.nspid) == 0 {
		return procStatus{}, fmt.Errorf("/proc/%d/status: no NSpid", pid)
	}
	return st, nil
}

// procStat holds fields of /proc/<pid>/stat.
type procStat struct {
	state      string
	startTicks uint64 // field 22, host clock ticks since boot
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// The command name (field 2) may hold spaces and ')'; fields resume
	// after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); field 22 is f[19].
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat: starttime %q", pid, f[19])
	}
	return procStat{state: f[0], startTicks: start}, nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times (100 on every
// Linux architecture Go supports).
const clockTicks = 100

// boottimeOffsetTicks is the time namespace's CLOCK_BOOTTIME offset of pid,
// in clock ticks: what to add to a host start time to get the one the
// sandbox sees. It is 0 for a new sandbox and set by CRIU on restore.
func boottimeOffsetTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/timens_offsets", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && (f[0] == "boottime" || f[0] == "7") {
			s, _ := strconv.ParseInt(f[1], 10, 64)
			ns, _ := strconv.ParseInt(f[2], 10, 64)
			return s*clockTicks + ns/(1e9/clockTicks)
		}
	}
	return 0
}

// sandboxPids maps the sandbox-side PID of every process in the sandbox's
// cgroup to its host PID.
func (d *Driver) sandboxPids(ls *liveSandbox) (map[int]int, map[int]procStatus, error) {
	hostPids, err := ls.c.Processes()
	if err != nil {
		return nil, nil, recordErr(ls.rec.ID, err)
	}
	toHost := make(map[int]int, len(hostPids))
	status := make(map[int]procStatus, len(hostPids))
	for _, hp := range hostPids {
		st, err := readStatus(hp)
		if err != nil {
			continue // exited meanwhile
		}
		// A process of the sandbox's cgroup that is not (yet) in its
		// PID namespace (libcontainer's setns helper) has a single NSpid.
		if len(st.nspid) < 2 {
			continue
		}
		toHost[st.nspid[len(st.nspid)-1]] = hp
		status[hp] = st
	}
	return toHost, status, nil
}

// Processes implements sandbox.Driver: every process in the sandbox's
// cgroup, read from the host's /proc, with its sandbox-side PID and PPID
// (0 when the parent is outside the sandbox, as for a command a legacy
// Exec runs), but the agent: in an agent sandbox PID 1 is the agent,
// which is the platform's and not the tenant's (the agent's own list
// leaves itself out the same way). It is read on the host rather than
// asked of the agent so that start times keep their meaning across a
// restore (record.Restored, noteRestoredStarts).
func (d *Driver) Processes(ctx context.Context, id string) ([]sandbox.Process, error) {
	ls, err := d.container(id)
	if err != nil {
		return nil, err
	}
	toHost, status, err := d.sandboxPids(ls)
	if err != nil {
		return nil, err
	}
	toSandbox := make(map[int]int, len(toHost))
	for sp, hp := range toHost {
		toSandbox[hp] = sp
	}
	var offset int64
	out := make([]sandbox.Process, 0, len(toHost))
	for sp, hp := range toHost {
		if sp == 1 && ls.rec.hasAgent() {
			continue
		}
		stat, err := readStat(hp)
		if err != nil {
			continue
		}
		if offset == 0 {
			offset = boottimeOffsetTicks(hp)
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", hp))
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if len(cmdline) == 0 {
			args = nil
		}
		out = append(out, sandbox.Process{
			PID:        sp,
			PPID:       toSandbox[status[hp].ppid],
			Args:       args,
			StartTicks: ls.rec.startTicks(sp, stat.startTicks, offset),
			State:      stat.state,
		})
	}
	slices.SortFunc(out, func(a, b sandbox.Process) int { return a.PID - b.PID })
	return out, nil
}

// Signal implements sandbox.Driver. In an agent sandbox the agent sends it
// (kill(2) inside the sandbox's PID namespace; it refuses its own PID).
// Otherwise the sandbox PID is mapped to a host PID, opened as a pidfd and
// checked again before signalling, so a PID reused between the lookup and
// the kill is never hit.
func (d *Driver) Signal(ctx context.Context, id string, pid int, sig os.Signal) error {
	s, ok := sig.(unix.Signal)
	if !ok {
		return errdefs.InvalidArgumentf("signal %v: not a unix signal", sig)
	}
	if pid <= 0 {
		return errdefs.InvalidArgumentf("pid %d", pid)
	}
	ls, err := d.container(id)
	if err != nil {
		return err
	}
	if ls.rec.hasAgent() {
		if ls, err = d.running(id); err != nil {
			return err
		}
		return d.agentSignal(ctx, ls, pid, s)
	}
	toHost, _, err := d.sandboxPids(ls)
	if err != nil {
		return err
	}
	hp, ok := toHost[pid]
	if !ok {
		return errdefs.NotFoundf("sandbox %s: no process %d", id, pid)
	}
	fd, err := unix.PidfdOpen(hp, 0)
	if err != nil {
		return errdefs.NotFoundf("sandbox %s: process %d: %v", id, pid, err)
	}
	defer unix.Close(fd)
	if st, err := readStatus(hp); err != nil || len(st.nspid) < 2 || st.nspid[len(st.nspid)-1] != pid {
		return errdefs.NotFoundf("sandbox %s: process %d exited", id, pid)
	}
	if err := unix.PidfdSendSignal(fd, s, nil, 0); err != nil {
		return fmt.Errorf("sandbox %s: signal %d: %w", id, pid, err)
	}
	return nil
}

// Wait implements sandbox.Driver. In an agent sandbox it asks the agent,
// the process's parent, which keeps the status of the processes it started
// (the last 512 that ended); for a PID it does not know, and in a sandbox
// made before the agent, it uses drivers/internal/procwait: the exit file
// the process's waiter (or the agent) writes is read on the host, in the
// sandbox's root, every 100ms; every 2s the sandbox's cgroup is checked for
// the process (and the container for still running).
func (d *Driver) Wait(ctx context.Context, id string, pid int) (sandbox.ExitStatus, error) {
	if _, err := d.container(id); err != nil {
		return sandbox.ExitStatus{}, err
	}
	if pid <= 0 {
		return sandbox.ExitStatus{}, errdefs.InvalidArgumentf("wait: pid %d", pid)
	}
	if st, ok, err := d.agentWait(ctx, id, pid); ok {
		return st, err
	}
	fs, _, err := d.hostFiles(id) // the exit file is in the layer
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	alive := func(ctx context.Context, pid int) (bool, error) {
		ls, err := d.running(id)
		if err != nil {
			return false, err
		}
		toHost, _, err := d.sandboxPids(ls)
		if err != nil {
			return false, err
		}
		_, ok := toHost[pid]
		return ok, nil
	}
	st, err := procwait.Wait(ctx, fs, pid, alive, procwait.Options{})
	if err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return st, nil
}
