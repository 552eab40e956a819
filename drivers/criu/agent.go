package criu

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/agent"
	"github.com/amber-run/amber/drivers/internal/hostproc"
	"github.com/amber-run/amber/lib/agentproto"
)

// The agent (cmd/amber-agent) is the init of every sandbox this driver
// creates: PID 1 of the sandbox's PID namespace, started by libcontainer
// as the container's init, so every process it starts (Exec, Start) is its
// child, in the sandbox's tree, part of every checkpoint and back after
// every restore with its PID. The daemon talks to it over HTTP/2 on
// 127.0.0.1:agentproto.Port of the sandbox's network namespace, dialled
// with DialPort (a socket created inside that namespace: never through a
// network the host or another sandbox can reach).

// agentReadyTimeout bounds how long Create and Restore wait for the agent
// to answer.
const agentReadyTimeout = 30 * time.Second

// initAgentStore opens <StateDir>/agents and adds the agent binary new
// sandboxes run (Options.AgentBinary, else agent.FindBinary).
func (d *Driver) initAgentStore() error {
	st, err := agent.NewStore(filepath.Join(d.opts.StateDir, "agents"))
	if err != nil {
		return fmt.Errorf("agent store: %w", err)
	}
	d.agentStore = st
	bin := d.opts.AgentBinary
	if bin == "" {
		if bin, err = agent.FindBinary(); err != nil {
			return err
		}
	}
	if d.agentBuild, err = st.Add(bin); err != nil {
		return fmt.Errorf("agent store: add %s: %w", bin, err)
	}
	return nil
}

// agentBinary is the host file bound at agentproto.Path in rec's sandbox:
// a copy of rec's agent build under <RunDir>/.agents/<digest>/. A build
// the store does not have is ErrFailedPrecondition.
//
// Why a copy: CRIU's restore opens a bind mount's source from inside the
// sandbox's user namespace (mount-v2's open_tree runs as sandbox root, an
// unprivileged host uid), and the store lies in the private state
// directory, which that uid cannot search. RunDir is searchable by all
// (not listable); the copy's directories are 0711 and the file 0555, all
// owned by host root, so sandbox root can execute it and nobody but host
// root can change it. The copy is per build, not per sandbox; it is made
// again from the store when RunDir was emptied (a reboot).
func (d *Driver) agentBinary(rec *record) (string, error) {
	if !rec.hasAgent() {
		return "", nil
	}
	src, err := d.agentStore.Path(rec.AgentBuild)
	if err != nil {
		return "", recordErr(rec.ID, fmt.Errorf("its agent: %w", err))
	}
	hexSum := strings.TrimPrefix(rec.AgentBuild, "sha256:")
	dir := filepath.Join(d.opts.RunDir, ".agents", hexSum)
	dst := filepath.Join(dir, agent.BinaryName)
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	for _, p := range []string{filepath.Dir(dir), dir} {
		if err := os.Mkdir(p, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("agent copy: %w", err)
		}
	}
	if err := copyExecutable(src, dst); err != nil {
		return "", fmt.Errorf("agent copy: %w", err)
	}
	return dst, nil
}

// copyExecutable copies src to dst (mode 0555) through a temporary file
// and a rename, so a concurrent reader sees the whole file or none.
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o555); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

// newAgentToken draws a sandbox's agent token.
func newAgentToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// agentInit is the container's init process of an agent sandbox. Its
// environment is the template's and the token (which the agent removes
// from its own environment before it starts anything); the agent hands
// every process it starts the whole environment the call names.
//
// (The agent's listener is plain TCP by its own choice — CRIU cannot dump
// the MPTCP sockets Go's net.Listen makes by default.)
func agentInit(rec *record) *libcontainer.Process {
	env := []string{"PATH=" + defaultPath}
	env = append(env, rec.Template.Env...)
	env = append(env, agentproto.TokenEnv+"="+rec.AgentToken)
	return &libcontainer.Process{
		Args: []string{agentproto.Path},
		Env:  env,
		Cwd:  "/",
		Init: true,
	}
}

// agentClient returns the cached client of sandbox id's agent, made on
// first use (also by a driver that did not create the sandbox: the token
// is in the record).
func (d *Driver) agentClient(ls *liveSandbox) *agent.Client {
	id := ls.rec.ID
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.agents[id]; ok {
		return c
	}
	c := agent.New(id, ls.rec.AgentToken, func(ctx context.Context) (net.Conn, error) {
		if err := d.waitCut(ctx, id); err != nil {
			return nil, err
		}
		return d.DialPort(ctx, id, agentproto.Port)
	})
	// A stream breaks off for good when the sandbox stopped; a frozen
	// sandbox (a checkpoint's cut) is still alive, and the stream
	// re-attaches once it thaws.
	c.Alive = func(ctx context.Context) error {
		ls, err := d.container(id)
		if err != nil {
			return err
		}
		st, err := ls.c.Status()
		if err != nil {
			return recordErr(id, err)
		}
		if st != libcontainer.Running && st != libcontainer.Paused {
			return errdefs.FailedPreconditionf("sandbox %s is %s", id, st)
		}
		return nil
	}
	d.agents[id] = c
	return c
}

// dropAgent closes the connections of sandbox id's client (the sandbox
// stopped, or is being cut) and, with forget, removes it from the cache.
func (d *Driver) dropAgent(id string, forget bool) {
	d.mu.Lock()
	c, ok := d.agents[id]
	if forget {
		delete(d.agents, id)
	}
	d.mu.Unlock()
	if ok {
		c.Drop()
	}
}

// waitAgent waits until the sandbox's agent answers and checks that it
// runs the build the record names.
func (d *Driver) waitAgent(ctx context.Context, ls *liveSandbox) error {
	ctx, cancel := context.WithTimeout(ctx, agentReadyTimeout)
	defer cancel()
	h, err := d.agentClient(ls).WaitReady(ctx)
	if err != nil {
		return err
	}
	if h.Build != ls.rec.AgentBuild {
		return errdefs.FailedPreconditionf("sandbox %s: its agent reports build %s, the record names %s", ls.rec.ID, h.Build, ls.rec.AgentBuild)
	}
	if !h.Init || h.PID != 1 {
		return fmt.Errorf("sandbox %s: the agent is pid %d (init %v), want the sandbox's init", ls.rec.ID, h.PID, h.Init)
	}
	return nil
}

// agentBase is the part of an agent Start that the sandbox decides: the
// environment (template, sandbox, call), working directory and user.
func agentBase(rec *record, spec sandbox.ExecSpec) (agentproto.Start, error) {
	uid, gid, err := parseUser(rec.Template.User)
	if err != nil {
		return agentproto.Start{}, err
	}
	cwd := spec.Cwd
	if cwd == "" {
		cwd = rec.Template.Cwd
	}
	if cwd == "" {
		cwd = "/"
	}
	return agentproto.Start{Env: processEnv(rec, uid, spec.Env), Cwd: cwd, UID: uint32(uid), GID: uint32(gid)}, nil
}

// agentExec is Exec through the sandbox's agent.
func (d *Driver) agentExec(ctx context.Context, ls *liveSandbox, spec sandbox.ExecSpec) (sandbox.ExitStatus, error) {
	base, err := agentBase(ls.rec, spec)
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	oomBefore := oomKills(ls)
	st, err := d.agentClient(ls).Exec(ctx, spec, base)
	if err == nil && (st.Signal == "SIGKILL" || st.Code == 137) && !st.TimedOut && oomBefore >= 0 && oomKills(ls) > oomBefore {
		// The sandbox's memory cgroup killed a process while the command
		// ran, and the command died of SIGKILL (or is a shell whose child
		// did: 137): say so, not just 137.
		st.Reason = sandbox.OutOfMemory(ls.rec.Limits.MemoryBytes)
	}
	return st, err
}

// oomKills is the oom_kill count of the sandbox's memory cgroup (-1 when
// it cannot be read).
func oomKills(ls *liveSandbox) int64 {
	cm, err := manager.New(ls.c.Config().Cgroups)
	if err != nil {
		return -1
	}
	return hostproc.OOMKills(cm.Path("memory"))
}

// agentStart is Start through the sandbox's agent: the process is the
// agent's child, its output goes to its ring and to
// /run/amber/proc/<pid>.log, its status to <pid>.exit (procwait's format,
// which Wait reads).
func (d *Driver) agentStart(ctx context.Context, ls *liveSandbox, spec sandbox.ExecSpec) (int, error) {
	s, err := agentBase(ls.rec, spec)
	if err != nil {
		return 0, err
	}
	s.Args = spec.Args
	s.Log = true
	s.Stdin = spec.OpenStdin
	s.Hold = spec.Hold
	pid, err := d.agentClient(ls).Start(ctx, s)
	if err != nil {
		var ae *agent.Error
		if errors.As(err, &ae) && (ae.Code == "no_program" || ae.Code == "not_executable") {
			return 0, errdefs.InvalidArgumentf("sandbox %s: start %q: %s", ls.rec.ID, spec.Args[0], ae.Message)
		}
		return 0, err
	}
	return pid, nil
}

// agentSignal signals a process through the agent, which refuses its own
// PID (the sandbox's init is not the tenant's to kill). A PID that no
// process of the sandbox has is ErrNotFound, checked on the host first:
// the agent answers success for a process it started that has ended (it
// keeps such PIDs in its table for their exit status and output).
func (d *Driver) agentSignal(ctx context.Context, ls *liveSandbox, pid int, sig unix.Signal) error {
	toHost, _, err := d.sandboxPids(ls)
	if err != nil {
		return err
	}
	if _, ok := toHost[pid]; !ok || pid == 1 {
		return errdefs.NotFoundf("sandbox %s: no process %d", ls.rec.ID, pid)
	}
	return d.agentClient(ls).Signal(ctx, pid, int(sig), false)
}

var _ sandbox.OutputReader = (*Driver)(nil)

// Output implements sandbox.OutputReader with the agent's output rings.
// A sandbox whose init is not the agent (made before it) keeps no rings:
// ErrFailedPrecondition.
func (d *Driver) Output(ctx context.Context, id string, pid int, offset int64, follow bool, fn func(sandbox.OutputFrame) error) error {
	ls, err := d.running(id)
	if err != nil {
		return err
	}
	if !ls.rec.hasAgent() {
		return errdefs.FailedPreconditionf("sandbox %s runs no agent (created before it): no output to re-attach to", id)
	}
	return d.agentClient(ls).SandboxOutput(ctx, pid, offset, follow, fn)
}

// agentConnsGone waits until no agent end of a TCP connection is left in
// the network namespace of host process initPid (closed after Drop), up to
// timeout or until ctx ends.
func agentConnsGone(ctx context.Context, initPid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if countPortConns(initPid, agentproto.Port) == 0 {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// countPortConns counts the agent's ends of connections in pid's network
// namespace: TCP sockets whose local port is port, in any state but
// LISTEN (0A), TIME_WAIT (06) and CLOSE (07) — established, or closing
// but still held by the agent (CLOSE_WAIT, LAST_ACK, ...). The daemon's
// ends (remote port == port) belong to no process of the sandbox and are
// not counted.
func countPortConns(pid, port int) int {
	local := fmt.Sprintf(":%04X", port)
	n := 0
	for _, f := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fl := strings.Fields(line)
			if len(fl) < 4 || !strings.HasSuffix(fl[1], local) {
				continue
			}
			switch fl[3] {
			case "0A", "06", "07":
				continue
			}
			n++
		}
	}
	return n
}

// dropAgentBeforeCut makes a checkpoint close the daemon's connections to
// the agent, and wait until the agent's ends are closed, before the cut
// (quiesceAgent). Without it CRIU dumps the agent's end of the open
// connection (TcpEstablished).
var dropAgentBeforeCut = true

// quiesceAgent prepares agent sandbox id (initPid: its init's host PID)
// for the cut: new dials to the agent wait (waitCut), every connection of
// the daemon's is dropped, and it waits (up to quiesceWait) until no agent
// end of a connection is left in the sandbox's network namespace. Streams
// re-attach by offset once release is called (after the dump). d holds
// id's lock.
//
// The wait is best effort: a process of the sandbox may hold a connection
// to the agent of its own (the agent's port is open to the sandbox), and
// must not be able to stop checkpoints so. CRIU dumps an open connection
// as well (TcpEstablished); the drop only keeps the daemon's out of the
// image.
func (d *Driver) quiesceAgent(ctx context.Context, id string, initPid int) (release func()) {
	if !dropAgentBeforeCut {
		return func() {}
	}
	gate := make(chan struct{})
	d.mu.Lock()
	d.cuts[id] = gate
	d.mu.Unlock()
	release = func() {
		d.mu.Lock()
		if d.cuts[id] == gate {
			delete(d.cuts, id)
		}
		d.mu.Unlock()
		close(gate)
	}
	d.dropAgent(id, false)
	if !agentConnsGone(ctx, initPid, quiesceWait) {
		d.log.Warn("connections to the agent still open at the cut; dumping them", "sandbox", id, "connections", countPortConns(initPid, agentproto.Port))
	}
	return release
}

// quiesceWait bounds quiesceAgent's wait for the agent's ends to close.
const quiesceWait = time.Second

// waitCut holds a dial to sandbox id's agent while a checkpoint cuts it.
func (d *Driver) waitCut(ctx context.Context, id string) error {
	d.mu.Lock()
	gate := d.cuts[id]
	d.mu.Unlock()
	if gate == nil {
		return nil
	}
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// agentWait waits for pid through the agent of sandbox id; ok is false when
// the sandbox has no agent or the agent does not know pid (Wait reads the
// exit file then).
func (d *Driver) agentWait(ctx context.Context, id string, pid int) (st sandbox.ExitStatus, ok bool, err error) {
	ls, err := d.container(id)
	if err != nil || !ls.rec.hasAgent() {
		return st, false, nil
	}
	if ls, err = d.running(id); err != nil {
		return st, false, nil
	}
	e, err := d.agentClient(ls).Wait(ctx, pid)
	if errdefs.IsNotFound(err) {
		return st, false, nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return st, true, ctx.Err()
		}
		return st, true, recordErr(id, err)
	}
	return sandbox.ExitStatus{Code: e.Code, Signal: e.Signal, TimedOut: e.TimedOut}, true, nil
}

var _ sandbox.Watcher = (*Driver)(nil)

var _ sandbox.StdinWriter = (*Driver)(nil)

// WriteStdin implements sandbox.StdinWriter through the sandbox's agent,
// which holds the stdin of the processes it started with OpenStdin.
func (d *Driver) WriteStdin(ctx context.Context, id string, pid int, r io.Reader, closeAfter bool) error {
	ls, err := d.running(id)
	if err != nil {
		return err
	}
	if !ls.rec.hasAgent() {
		return errdefs.FailedPreconditionf("sandbox %s runs no agent (created before it): its background processes take no input", id)
	}
	return d.agentClient(ls).Stdin(ctx, pid, r, closeAfter)
}

// Watch implements sandbox.Watcher through the sandbox's agent.
func (d *Driver) Watch(ctx context.Context, id, path string, recursive bool, ready chan<- struct{}, fn func(sandbox.WatchEvent) error) error {
	ls, err := d.running(id)
	if err != nil {
		return err
	}
	if !ls.rec.hasAgent() {
		return errdefs.FailedPreconditionf("sandbox %s runs no agent (created before it): no file watch", id)
	}
	return d.agentClient(ls).Watch(ctx, path, recursive, ready, func(e agentproto.WatchEvent) error {
		return fn(sandbox.WatchEvent{Path: e.Path, Op: e.Op})
	})
}
