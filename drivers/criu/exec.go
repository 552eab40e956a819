package criu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/procwait"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// drainGrace is how long Exec keeps copying output after the command
// exited, for descendants that still hold its stdout/stderr; then the pipes
// are closed and Exec returns.
const drainGrace = 200 * time.Millisecond

// parseUser reads a template's "uid:gid" (numeric; empty means 0:0).
func parseUser(s string) (uid, gid int, err error) {
	if s == "" {
		return 0, 0, nil
	}
	u, g, ok := strings.Cut(s, ":")
	if !ok {
		g = u
	}
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if err1 != nil || err2 != nil || uid < 0 || gid < 0 || uid >= idsPerSandbox || gid >= idsPerSandbox {
		return 0, 0, errdefs.InvalidArgumentf("template user %q: want numeric \"uid:gid\" below %d", s, idsPerSandbox)
	}
	return uid, gid, nil
}

// processEnv is the environment of a sandbox process: a default PATH and
// HOME, the template's, the sandbox's, then the call's (later wins).
func processEnv(rec *record, uid int, extra []string) []string {
	home := "/root"
	if uid != 0 {
		home = "/"
	}
	env := []string{"PATH=" + defaultPath, "HOME=" + home}
	env = append(env, rec.Template.Env...)
	env = append(env, rec.Env...)
	env = append(env, extra...)
	// Keep the last value of each name.
	seen := map[string]int{}
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if i, ok := seen[name]; ok {
			out[i] = kv
			continue
		}
		seen[name] = len(out)
		out = append(out, kv)
	}
	return out
}

func (d *Driver) process(ls *liveSandbox, spec sandbox.ExecSpec) (*libcontainer.Process, error) {
	if len(spec.Args) == 0 {
		return nil, errdefs.InvalidArgumentf("exec: no command")
	}
	uid, gid, err := parseUser(ls.rec.Template.User)
	if err != nil {
		return nil, err
	}
	cwd := spec.Cwd
	if cwd == "" {
		cwd = ls.rec.Template.Cwd
	}
	if cwd == "" {
		cwd = "/"
	}
	return &libcontainer.Process{
		Args: spec.Args,
		Env:  processEnv(ls.rec, uid, spec.Env),
		Cwd:  cwd,
		UID:  uid,
		GID:  gid,
	}, nil
}

func (d *Driver) running(id string) (*liveSandbox, error) {
	ls, err := d.container(id)
	if err != nil {
		return nil, err
	}
	st, err := ls.c.Status()
	if err != nil {
		return nil, recordErr(id, err)
	}
	if st == libcontainer.Paused && d.thawLeftover(id, ls) {
		st = libcontainer.Running
	}
	if st != libcontainer.Running {
		return nil, errdefs.FailedPreconditionf("sandbox %s is %s", id, st)
	}
	return ls, nil
}

// libcontainerExecs counts the commands started with libcontainer's exec
// (container.Run of a non-init process): only sandboxes without the agent
// (record.Init empty) still take that path. Tests read it.
var libcontainerExecs atomic.Int64

// Exec implements sandbox.Driver. In a sandbox whose init is the agent the
// command is the agent's child (agentExec), its stdio pipes or a
// pseudo-terminal of the agent's, streamed over the agent's connection; no
// descriptor of the daemon is passed in. A sandbox made before the agent
// runs it with libcontainer's exec (legacyExec).
func (d *Driver) Exec(ctx context.Context, id string, spec sandbox.ExecSpec) (sandbox.ExitStatus, error) {
	ls, err := d.running(id)
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	if len(spec.Args) == 0 {
		return sandbox.ExitStatus{}, errdefs.InvalidArgumentf("exec: no command")
	}
	if ls.rec.hasAgent() {
		return d.agentExec(ctx, ls, spec)
	}
	return d.legacyExec(ctx, ls, spec)
}

// legacyExec runs a command in the container's namespaces with
// libcontainer's setns path: the command's stdio are pipes (or a
// pseudo-terminal) created for this call, and libcontainer's init closes
// every other descriptor before it execs the command.
func (d *Driver) legacyExec(ctx context.Context, ls *liveSandbox, spec sandbox.ExecSpec) (sandbox.ExitStatus, error) {
	id := ls.rec.ID
	p, err := d.process(ls, spec)
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	if spec.TTY {
		return d.execTTY(ctx, ls, p, spec)
	}
	var (
		closers  []*os.File // our ends, closed when we are done
		children []*os.File // the command's ends, closed once it started
		copiers  sync.WaitGroup
	)
	defer func() {
		for _, f := range append(closers, children...) {
			f.Close()
		}
	}()
	// stdin
	inR, inW, err := os.Pipe()
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	children, closers = append(children, inR), append(closers, inW)
	p.Stdin = inR
	// stdout, stderr
	outputs := []io.Writer{spec.Stdout, spec.Stderr}
	readers := make([]*os.File, 2)
	for i := range outputs {
		r, w, err := os.Pipe()
		if err != nil {
			return sandbox.ExitStatus{}, err
		}
		children, closers = append(children, w), append(closers, r)
		readers[i] = r
	}
	p.Stdout, p.Stderr = children[1], children[2]

	libcontainerExecs.Add(1)
	if err := ls.c.Run(p); err != nil {
		return sandbox.ExitStatus{}, recordErr(id, execError(spec.Args[0], err))
	}
	for _, f := range children {
		f.Close()
	}
	children = nil

	go func() {
		if spec.Stdin != nil {
			_, _ = io.Copy(inW, spec.Stdin)
		}
		inW.Close()
	}()
	copies := make([]*outputCopy, len(readers))
	for i, r := range readers {
		copies[i] = startCopy(outputs[i], r, &copiers)
	}
	st, err := d.wait(ctx, ls, p, spec.Timeout)
	drainOutputs(copies, &copiers)
	return st, err
}

// outputCopy copies a command's output pipe to the caller's writer and
// tracks whether it is idle: blocked reading an empty pipe, not busy
// writing to a slow caller.
type outputCopy struct {
	r        *os.File
	mu       sync.Mutex
	writing  bool
	lastData time.Time
}

func startCopy(w io.Writer, r *os.File, wg *sync.WaitGroup) *outputCopy {
	if w == nil {
		w = io.Discard
	}
	c := &outputCopy{r: r, lastData: time.Now()}
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				c.mu.Lock()
				c.writing, c.lastData = true, time.Now()
				c.mu.Unlock()
				_, werr := w.Write(buf[:n])
				c.mu.Lock()
				c.writing, c.lastData = false, time.Now()
				c.mu.Unlock()
				if werr != nil {
					_, _ = io.Copy(io.Discard, r) // keep the command from blocking
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	return c
}

// drainOutputs waits, after the command exited, until its output pipes
// are drained. A descendant that keeps a pipe open (a background child)
// would hold it forever, so a pipe that has been idle for drainGrace (empty
// and not being written to the caller) is cut. Output is never lost to a
// slow caller: a copy that is writing is not idle.
func drainOutputs(copies []*outputCopy, wg *sync.WaitGroup) {
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	tick := time.NewTicker(drainGrace / 4)
	defer tick.Stop()
	for {
		select {
		case <-drained:
			return
		case <-tick.C:
		}
		for _, c := range copies {
			c.mu.Lock()
			idle := !c.writing && time.Since(c.lastData) >= drainGrace
			c.mu.Unlock()
			if idle && pipeEmpty(c.r) {
				_ = c.r.SetReadDeadline(time.Now())
			}
		}
	}
}

// pipeEmpty reports whether nothing is left to read in the pipe (a read
// with an expired deadline returns without reading what is there).
func pipeEmpty(f *os.File) bool {
	conn, err := f.SyscallConn()
	if err != nil {
		return true
	}
	n := 0
	_ = conn.Control(func(fd uintptr) {
		n, err = unix.IoctlGetInt(int(fd), unix.TIOCINQ) // FIONREAD
	})
	return err != nil || n == 0
}

// execError classifies a failure to start a command. libcontainer reports
// the init's execve error as text over its sync pipe, so the kind is read
// from the message.
func execError(cmd string, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "no such file or directory") || strings.Contains(msg, "executable file not found"):
		return errdefs.InvalidArgumentf("exec %q: command not found in the sandbox (%v)", cmd, err)
	case strings.Contains(msg, "permission denied"):
		return errdefs.PermissionDeniedf("exec %q: %v", cmd, err)
	}
	return fmt.Errorf("exec %q: %w", cmd, err)
}

// wait waits for p, SIGKILLing it and its descendants on timeout or when
// ctx ends.
func (d *Driver) wait(ctx context.Context, ls *liveSandbox, p *libcontainer.Process, timeout time.Duration) (sandbox.ExitStatus, error) {
	pid, err := p.Pid()
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	type result struct {
		ps  *os.ProcessState
		err error
	}
	done := make(chan result, 1)
	go func() {
		ps, err := p.Wait()
		done <- result{ps, err}
	}()
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	var st sandbox.ExitStatus
	var ctxErr error
	select {
	case r := <-done:
		return exitStatus(r.ps, r.err)
	case <-timer:
		st.TimedOut = true
	case <-ctx.Done():
		ctxErr = ctx.Err()
	}
	killTree(ls.c, pid)
	r := <-done
	s, err := exitStatus(r.ps, r.err)
	s.TimedOut = st.TimedOut
	if ctxErr != nil {
		return s, ctxErr
	}
	return s, err
}

func exitStatus(ps *os.ProcessState, err error) (sandbox.ExitStatus, error) {
	if ps == nil {
		return sandbox.ExitStatus{}, err
	}
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if !ok {
		return sandbox.ExitStatus{Code: ps.ExitCode()}, nil
	}
	switch {
	case ws.Exited():
		return sandbox.ExitStatus{Code: ws.ExitStatus()}, nil
	case ws.Signaled():
		return sandbox.ExitStatus{Code: 128 + int(ws.Signal()), Signal: unix.SignalName(ws.Signal())}, nil
	}
	return sandbox.ExitStatus{Code: ps.ExitCode()}, nil
}

// killTree SIGKILLs host pid and every descendant of it inside the
// sandbox's cgroup, the cgroup frozen meanwhile so nothing forks away.
func killTree(c *libcontainer.Container, pid int) {
	paused := c.Pause() == nil
	defer func() {
		if paused {
			_ = c.Resume()
		}
	}()
	hostPids, err := c.Processes()
	if err != nil {
		_ = unix.Kill(pid, unix.SIGKILL)
		return
	}
	parent := map[int]int{}
	for _, hp := range hostPids {
		if st, err := readStatus(hp); err == nil {
			parent[hp] = st.ppid
		}
	}
	victims := map[int]bool{pid: true}
	for changed := true; changed; {
		changed = false
		for hp, pp := range parent {
			if victims[pp] && !victims[hp] {
				victims[hp], changed = true, true
			}
		}
	}
	for hp := range victims {
		_ = unix.Kill(hp, unix.SIGKILL)
	}
}

// execTTY runs p on a new pseudo-terminal that libcontainer creates inside
// the sandbox (its devpts) and hands back through a socket.
func (d *Driver) execTTY(ctx context.Context, ls *liveSandbox, p *libcontainer.Process, spec sandbox.ExecSpec) (sandbox.ExitStatus, error) {
	parentSock, childSock, err := socketPair()
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	defer parentSock.Close()
	p.ConsoleSocket = childSock
	p.ConsoleWidth, p.ConsoleHeight = 80, 24
	libcontainerExecs.Add(1)
	err = ls.c.Run(p)
	childSock.Close()
	if err != nil {
		return sandbox.ExitStatus{}, recordErr(ls.rec.ID, execError(spec.Args[0], err))
	}
	master, err := recvFile(parentSock)
	if err != nil {
		pid, _ := p.Pid()
		killTree(ls.c, pid)
		_, _ = p.Wait()
		return sandbox.ExitStatus{}, fmt.Errorf("receive pty: %w", err)
	}
	defer master.Close()
	// The end of the caller's input is typed as ^D (VEOF): the terminal
	// then reads as end of file. A ^D after a partial line only ends that
	// line, so such input gets a second one.
	go func() {
		var last byte = '\n'
		if spec.Stdin != nil {
			_, _ = io.Copy(master, readerFunc(func(p []byte) (int, error) {
				n, err := spec.Stdin.Read(p)
				if n > 0 {
					last = p[n-1]
				}
				return n, err
			}))
		}
		eof := []byte{4}
		if last != '\n' {
			eof = []byte{4, 4}
		}
		_, _ = master.Write(eof)
	}()
	out := spec.Stdout
	if out == nil {
		out = io.Discard
	}
	copied := make(chan struct{})
	go func() {
		_, _ = io.Copy(out, master) // ends with EIO once the last slave fd closes
		close(copied)
	}()
	st, err := d.wait(ctx, ls, p, spec.Timeout)
	select {
	case <-copied:
	case <-time.After(drainGrace):
		_ = master.SetReadDeadline(time.Now())
		<-copied
	}
	return st, err
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

func socketPair() (parent, child *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), "console-parent"), os.NewFile(uintptr(fds[1]), "console-child"), nil
}

// recvFile receives one file descriptor sent with SCM_RIGHTS.
func recvFile(sock *os.File) (*os.File, error) {
	conn, err := sock.SyscallConn()
	if err != nil {
		return nil, err
	}
	name := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	var n, oobn int
	var rerr error
	err = conn.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), name, oob, unix.MSG_CMSG_CLOEXEC)
		return !errors.Is(rerr, unix.EAGAIN)
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("pty: want one control message, got %d (%v)", len(msgs), err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("pty: want one descriptor, got %d (%v)", len(fds), err)
	}
	return os.NewFile(uintptr(fds[0]), string(name[:n])), nil
}

// startScript starts "$@" in the background under the waiter of
// drivers/internal/procwait and prints the command's PID. The waiter starts the
// command as its child (which points its stdio at
// /run/amber/proc/<its pid>.log and execs the command, so keeping that
// PID), prints the PID and closes its stdout and stderr, so the command
// substitution here ends at once; it then stays, reparented to the
// sandbox's init when this shell exits, to record the command's exit
// status for Wait. Environment and working directory are the exec's own.
// (Create made the directory; mkdir -p covers a sandbox that removed it.)
var startScript = `mkdir -p ` + procwait.Dir + ` 2>/dev/null; amber_p=$(/bin/sh -c ` +
	procwait.ShQuote(procwait.Script(procwait.Dir, "", `echo "$amber_c"; exec >/dev/null 2>&1`)) +
	` amber-wait "$@" </dev/null &) && echo "$amber_p"`

// Start implements sandbox.Driver: through the agent (agentStart), or, in a
// sandbox made before it, with the procwait waiter started by a
// libcontainer exec (legacyStart).
func (d *Driver) Start(ctx context.Context, id string, spec sandbox.ExecSpec) (int, error) {
	if len(spec.Args) == 0 {
		return 0, errdefs.InvalidArgumentf("start: no command")
	}
	ls, err := d.running(id)
	if err != nil {
		return 0, err
	}
	if ls.rec.hasAgent() {
		return d.agentStart(ctx, ls, spec)
	}
	return d.legacyStart(ctx, ls, spec)
}

func (d *Driver) legacyStart(ctx context.Context, ls *liveSandbox, spec sandbox.ExecSpec) (int, error) {
	id := ls.rec.ID
	var out, errb strings.Builder
	wrapped := spec
	wrapped.Args = append([]string{"/bin/sh", "-c", startScript, "sh"}, spec.Args...)
	wrapped.Stdin, wrapped.Stdout, wrapped.Stderr, wrapped.TTY = nil, &out, &errb, false
	if wrapped.Timeout == 0 {
		wrapped.Timeout = 30 * time.Second
	}
	st, err := d.legacyExec(ctx, ls, wrapped)
	if err != nil {
		return 0, err
	}
	if st.Code != 0 {
		return 0, fmt.Errorf("sandbox %s: start %q: exit %d: %s", id, spec.Args[0], st.Code, strings.TrimSpace(errb.String()))
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("sandbox %s: start %q: wrapper printed %q (%s)", id, spec.Args[0], out.String(), strings.TrimSpace(errb.String()))
	}
	d.awaitExec(ctx, id, pid)
	return pid, nil
}

// awaitExec waits (up to 10s) until sandbox process pid runs its command,
// not one of the shells that start it (procwait.Starting), or has ended.
// Without it, a Processes right after Start could list the shell that
// opens the log (the criu driver's Start returns as soon as the waiter
// printed the PID).
func (d *Driver) awaitExec(ctx context.Context, id string, pid int) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		ls, err := d.container(id)
		if err != nil {
			return
		}
		toHost, _, err := d.sandboxPids(ls)
		if err != nil {
			return
		}
		hp, ok := toHost[pid]
		if !ok {
			return
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", hp))
		if err != nil {
			return
		}
		// An empty command line: in the middle of execve (or a zombie).
		if len(cmdline) > 0 && !procwait.Starting(strings.Split(string(cmdline), "\x00")) {
			return
		}
		if st, err := readStat(hp); err != nil || st.state == "Z" {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
