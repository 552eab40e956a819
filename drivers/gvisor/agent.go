package gvisor

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
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/agent"
	"github.com/amber-run/amber/drivers/internal/procwait"
	"github.com/amber-run/amber/lib/agentproto"
)

// This file is the driver's side of amber-agent, the init of every sandbox
// of spec generation 2 (see specVersion and lib/agentproto). Exec, Start,
// Signal, Processes, Wait and Output of such a sandbox are calls to its
// agent over one HTTP/2 connection that the driver's own port dialer opens
// (`runsc port-forward --stream` to agentproto.Port on the sandbox's
// loopback): no `runsc exec`, so every process is a child of the agent,
// in the sandbox's process tree, and comes back with a restore (gVisor's
// restore SIGKILLs whatever descends from a runsc exec).
//
// What the agent answers is the sandbox's word. The client bounds what it
// reads and decodes frames with a checked decoder; the driver decides
// nothing for the host from it (a PID, a process list, an exit status are
// reported to the caller as the sandbox's).

var _ sandbox.OutputReader = (*Driver)(nil)

// agentReadyTimeout bounds how long Create and Restore wait for the agent
// to answer its health call.
const agentReadyTimeout = time.Minute

// openAgentStore opens <StateDir>/agents and adds the agent binary this
// driver gives new sandboxes.
func (d *Driver) openAgentStore() error {
	st, err := agent.NewStore(filepath.Join(d.opts.StateDir, "agents"))
	if err != nil {
		return fmt.Errorf("gvisor: agent store: %w", err)
	}
	bin := d.opts.AgentBinary
	if bin == "" {
		if bin, err = agent.FindBinary(); err != nil {
			return fmt.Errorf("gvisor: %w", err)
		}
	}
	build, err := st.Add(bin)
	if err != nil {
		return fmt.Errorf("gvisor: agent store: add %s: %w", bin, err)
	}
	d.agents, d.agentBuild = st, build
	return nil
}

// newAgentToken draws a sandbox's agent token: 32 random bytes.
func newAgentToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// agentSource is the host file bound at agentproto.Path in rec's sandbox
// ("" for the sh init's generations). A build this node does not have is
// ErrFailedPrecondition: a checkpointed agent must be restored with the
// very binary it has mapped.
func (d *Driver) agentSource(rec *record) (string, error) {
	if rec.SpecVersion < 2 {
		return "", nil
	}
	p, err := d.agents.Path(rec.AgentBuild)
	if err == nil {
		err = checkAgentFile(p)
	}
	if err != nil {
		return "", fmt.Errorf("sandbox %s: its agent: %w", rec.ID, err)
	}
	return p, nil
}

// agentClient is the cached client of one sandbox's agent.
type agentClient struct {
	token string
	c     *agent.Client
}

// agentFor returns the client of rec's agent, made on first use. A client
// made for another token (the sandbox was restored from an image of
// another life of the same id) is dropped and replaced.
func (d *Driver) agentFor(rec *record) *agent.Client {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ac := d.clients[rec.ID]; ac != nil {
		if ac.token == rec.AgentToken {
			return ac.c
		}
		ac.c.Drop()
	}
	id := rec.ID
	c := agent.New(id, rec.AgentToken, func(ctx context.Context) (net.Conn, error) {
		release, err := d.agentDial(ctx, id)
		if err != nil {
			return nil, err
		}
		defer release()
		// The record of the moment: a restore may have changed the
		// runsc flags.
		rec, err := d.loadRecord(id)
		if err != nil {
			return nil, err
		}
		return d.dialPort(ctx, rec, agentproto.Port)
	})
	c.Alive = func(ctx context.Context) error { return d.agentAlive(ctx, id) }
	d.clients[id] = &agentClient{token: rec.AgentToken, c: c}
	return c
}

// agentDial waits while sandbox id is being cut (holdAgentDials), then
// counts a dial in progress until release is called.
func (d *Driver) agentDial(ctx context.Context, id string) (release func(), err error) {
	for {
		d.mu.Lock()
		cut := d.cuts[id]
		if cut == nil {
			d.dialing[id]++
			d.mu.Unlock()
			return func() {
				d.mu.Lock()
				if d.dialing[id]--; d.dialing[id] == 0 {
					delete(d.dialing, id)
				}
				d.mu.Unlock()
			}, nil
		}
		d.mu.Unlock()
		select {
		case <-cut:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// holdAgentDials readies sandbox id for a checkpoint: no connection to its
// agent may be open at the cut. A `runsc port-forward` connection is a
// proxy in the sentry whose waiter entries gVisor cannot save (measured
// with the pinned runsc: "encoding error: type waiter.ChannelNotifier is
// not known", and the checkpoint fails). New agent dials wait, the ones in
// progress are let finish, and every connection is closed; the client's
// streams break and re-attach by offset once resume is called (Exec
// output, Output, Wait go on without a gap or a repeat). Closing the host
// end is enough: the sentry's proxy sees end of file and unregisters
// before the sandbox is paused (measured: a checkpoint right after the
// close succeeds).
func (d *Driver) holdAgentDials(ctx context.Context, id string) (resume func(), err error) {
	cut := make(chan struct{})
	d.mu.Lock()
	if d.cuts[id] != nil {
		d.mu.Unlock()
		return nil, errdefs.FailedPreconditionf("sandbox %s is being checkpointed", id)
	}
	d.cuts[id] = cut
	d.mu.Unlock()
	resume = func() {
		d.mu.Lock()
		delete(d.cuts, id)
		d.mu.Unlock()
		close(cut)
	}
	for deadline := time.Now().Add(dialTimeout + 5*time.Second); ; {
		d.mu.Lock()
		n := d.dialing[id]
		ac := d.clients[id]
		d.mu.Unlock()
		if n == 0 {
			if ac != nil {
				ac.c.Drop()
			}
			if k := d.closePortConns(id); k > 0 {
				d.log.Info("checkpoint closes the port connections into the sandbox", "sandbox", id, "connections", k)
			}
			return resume, nil
		}
		if time.Now().After(deadline) {
			resume()
			return nil, errdefs.Unavailablef("sandbox %s: an agent dial does not end", id)
		}
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
			resume()
			return nil, err
		}
	}
}

// dropAgent closes the connections of sandbox id's agent client and
// forgets it (Kill, Destroy, Restore: a connection into a sandbox that is
// gone, or was replaced, is stale).
func (d *Driver) dropAgent(id string) {
	d.mu.Lock()
	ac := d.clients[id]
	delete(d.clients, id)
	d.mu.Unlock()
	if ac != nil {
		ac.c.Drop()
	}
}

// agentAlive is asked before a broken stream re-attaches: an error (the
// sandbox stopped, or the out-of-memory killer stopped it) ends the stream.
// A paused sandbox (a checkpoint in progress) is alive.
func (d *Driver) agentAlive(ctx context.Context, id string) error {
	rec, err := d.loadRecord(id)
	if err != nil {
		return err
	}
	if n := oomKills(rec.Cgroup); n > 0 {
		return errdefs.ResourceExhaustedf("killed: %s: sandbox %s was stopped by the out-of-memory killer; its files are kept", sandbox.OutOfMemory(rec.Limits.MemoryBytes), id)
	}
	if rec.Phase != phaseCreated {
		return nil // being restored: the stream re-attaches once it runs
	}
	st, ok, err := d.state(ctx, rec, id)
	if err != nil {
		return nil // runsc could not say: try again
	}
	if !ok || (st.Status != "running" && st.Status != "paused") {
		return errdefs.FailedPreconditionf("sandbox %s is not running", id)
	}
	return nil
}

// FPAgentWait is evaluated (with the sandbox id) as a wait for an agent
// begins, under the wait's deadline: an armed failpoint.Hang is an agent
// that never answers (tests).
const FPAgentWait = "gvisor.agent.wait"

// logTail is the last max bytes of sandbox id's runsc log ("" if none).
func (d *Driver) logTail(id string, max int64) string {
	f, err := os.Open(filepath.Join(d.dir(id), "runsc.log"))
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > max {
		_, _ = f.Seek(st.Size()-max, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, max))
	return string(b)
}

// waitAgent waits until rec's agent answers, and checks that it runs the
// build the record names.
func (d *Driver) waitAgent(ctx context.Context, rec *record) error {
	return d.waitAgentFor(ctx, rec, agentReadyTimeout)
}

// waitAgentFor is waitAgent waiting up to wait.
func (d *Driver) waitAgentFor(ctx context.Context, rec *record, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := d.opts.Failpoints.EvalCtx(ctx, FPAgentWait, rec.ID); err != nil {
		return errdefs.Unavailablef("sandbox %s: agent unavailable: not ready: %v", rec.ID, err)
	}
	h, err := d.agentFor(rec).WaitReady(ctx)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", rec.ID, err)
	}
	if h.Build != rec.AgentBuild || !h.Init {
		return errdefs.FailedPreconditionf("sandbox %s: its agent reports build %s (init %v), the record names %s", rec.ID, h.Build, h.Init, rec.AgentBuild)
	}
	return nil
}

// agentBase is what every process the agent starts for rec gets: the
// merged environment (template, sandbox, call; later wins), the working
// directory and the template's user.
func agentBase(rec *record, spec sandbox.ExecSpec) (agentproto.Start, error) {
	cwd := spec.Cwd
	if cwd == "" {
		cwd = rec.Cwd
	}
	if !strings.HasPrefix(cwd, "/") {
		return agentproto.Start{}, errdefs.InvalidArgumentf("exec: cwd %q is not absolute", cwd)
	}
	env := mergeEnv(rec.UID, rec.Env, spec.Env)
	if spec.TTY {
		env = mergeEnv(rec.UID, []string{"TERM=xterm"}, rec.Env, spec.Env)
	}
	return agentproto.Start{Env: env, Cwd: cwd, UID: rec.UID, GID: rec.GID}, nil
}

// agentExec is Exec through the agent.
func (d *Driver) agentExec(ctx context.Context, rec *record, spec sandbox.ExecSpec) (sandbox.ExitStatus, error) {
	if len(spec.Args) == 0 {
		return sandbox.ExitStatus{}, errdefs.InvalidArgumentf("exec: no command")
	}
	base, err := agentBase(rec, spec)
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	d.mu.Lock()
	d.calls["agent:exec"]++
	d.mu.Unlock()
	st, err := d.agentFor(rec).Exec(ctx, spec, base)
	if err != nil {
		return sandbox.ExitStatus{}, d.agentErr(ctx, rec, err)
	}
	return st, nil
}

// agentErr explains a failed agent call: a sandbox that stopped (or that
// the out-of-memory killer stopped) rather than "agent unavailable".
func (d *Driver) agentErr(ctx context.Context, rec *record, err error) error {
	if ctx.Err() != nil || !(errdefs.IsUnavailable(err) || errors.Is(err, errdefs.ErrFailedPrecondition)) {
		return err
	}
	if errors.Is(err, errdefs.ErrResourceExhausted) {
		return err
	}
	return d.deadOrErr(rec, err.Error())
}

// agentStart is Start through the agent: the process is the agent's child,
// its stdin empty, its output in its ring and in procwait's log
// (/run/amber/proc/<pid>.log), its exit status in <pid>.exit, which the
// agent writes when it reaps it.
func (d *Driver) agentStart(ctx context.Context, rec *record, spec sandbox.ExecSpec) (int, error) {
	s, err := agentBase(rec, spec)
	if err != nil {
		return 0, err
	}
	s.Args = spec.Args
	s.Log = true
	s.Stdin = spec.OpenStdin
	s.Hold = spec.Hold
	pid, err := d.agentFor(rec).Start(ctx, s)
	if err != nil {
		var ae *agent.Error
		if errors.As(err, &ae) && (ae.Code == "no_program" || ae.Code == "not_executable") {
			return 0, errdefs.InvalidArgumentf("start in %s: %s", rec.ID, ae.Message)
		}
		return 0, d.agentErr(ctx, rec, err)
	}
	return pid, nil
}

// agentProcesses lists the sandbox's processes through the agent, which
// leaves itself (PID 1) out.
func (d *Driver) agentProcesses(ctx context.Context, rec *record) ([]sandbox.Process, error) {
	ps, err := d.agentFor(rec).Processes(ctx)
	if err != nil {
		return nil, d.agentErr(ctx, rec, err)
	}
	out := make([]sandbox.Process, 0, len(ps))
	for _, p := range ps {
		out = append(out, sandbox.Process{PID: p.PID, PPID: p.PPID, Args: p.Args, StartTicks: p.StartTicks, State: p.State})
	}
	return out, nil
}

// agentSignal signals pid through the agent. A pid that is not listed is
// ErrNotFound: the agent answers a signal to a process it started and has
// reaped with success (its handler excuses ESRCH for an ended process of
// its table), so the listing decides first.
func (d *Driver) agentSignal(ctx context.Context, rec *record, pid int, sig syscall.Signal) error {
	// The agent is pid 1 and not the tenant's process; a pid that is not
	// there is the agent's not_found (ErrNotFound).
	if pid == 1 {
		return errdefs.NotFoundf("sandbox %s: process %d", rec.ID, pid)
	}
	if err := d.agentFor(rec).Signal(ctx, pid, int(sig), false); err != nil {
		return d.agentErr(ctx, rec, err)
	}
	return nil
}

// agentWait waits through the agent for a process Start made. Start made
// it if its exit file exists (procwait's contract: a pid Start did not
// make is ErrNotFound); the agent, its parent, answers when it is reaped.
// A process the agent no longer remembers (it keeps the last 512 ended
// ones) is read from its exit file.
func (d *Driver) agentWait(ctx context.Context, rec *record, pid int) (sandbox.ExitStatus, error) {
	fs, _, err := d.hostFiles(rec.ID) // the exit file is in the layer
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	if _, err := fs.Stat(ctx, procwait.ExitPath(pid)); err != nil {
		if errdefs.IsNotFound(err) {
			return sandbox.ExitStatus{}, errdefs.NotFoundf("sandbox %s: process %d: not started by Start (no %s)", rec.ID, pid, procwait.ExitPath(pid))
		}
		return sandbox.ExitStatus{}, err
	}
	c := d.agentFor(rec)
	e, err := c.Wait(ctx, pid)
	if err == nil {
		return sandbox.ExitStatus{Code: e.Code, Signal: e.Signal, TimedOut: e.TimedOut}, nil
	}
	if ctx.Err() != nil {
		return sandbox.ExitStatus{}, ctx.Err()
	}
	if !errdefs.IsNotFound(err) {
		return sandbox.ExitStatus{}, d.agentErr(ctx, rec, err)
	}
	alive := func(ctx context.Context, pid int) (bool, error) {
		ps, err := d.agentProcesses(ctx, rec)
		if err != nil {
			return false, err
		}
		for _, p := range ps {
			if p.PID == pid {
				return true, nil
			}
		}
		return false, nil
	}
	st, err := procwait.Wait(ctx, fs, pid, alive, procwait.Options{})
	if err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("sandbox %s: %w", rec.ID, err)
	}
	return st, nil
}

// Output implements sandbox.OutputReader through the agent's output ring.
// A sandbox of the sh init's generations keeps no ring:
// ErrFailedPrecondition.
func (d *Driver) Output(ctx context.Context, id string, pid int, offset int64, follow bool, fn func(sandbox.OutputFrame) error) error {
	rec, err := d.running(id)
	if err != nil {
		return err
	}
	if rec.SpecVersion < 2 {
		return errdefs.FailedPreconditionf("sandbox %s runs the sh init of an older driver (spec generation %d): it keeps no output to re-attach to; its background output is in %s/<pid>.log", id, rec.SpecVersion, procwait.Dir)
	}
	if pid <= 0 || offset < 0 {
		return errdefs.InvalidArgumentf("output: pid %d, offset %d", pid, offset)
	}
	if err := d.agentFor(rec).SandboxOutput(ctx, pid, offset, follow, fn); err != nil {
		return d.agentErr(ctx, rec, err)
	}
	return nil
}

// countRunsc records one runsc invocation with args (global flags, then the
// subcommand); runscCalls reads the counts (tests: no `runsc exec` for a
// sandbox whose init is the agent).
func (d *Driver) countRunsc(args []string) {
	sub := ""
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			sub = a
			break
		}
	}
	d.mu.Lock()
	d.calls[sub]++
	d.mu.Unlock()
}

// runscCalls returns how many times the driver ran runsc with subcommand
// sub ("ctl:<method>": control socket calls; "agent:exec": execs through
// the agent).
func (d *Driver) runscCalls(sub string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[sub]
}

// checkAgentFile is asked of the store's file before it is bound: a
// binary writable by anyone but root would let the host's other users
// change what every sandbox runs as its init.
func checkAgentFile(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return err
	}
	if st.Uid != uint32(os.Geteuid()) || st.Mode&0o022 != 0 {
		return errdefs.FailedPreconditionf("agent binary %s is writable by others or not owned by the daemon's user", path)
	}
	return nil
}

var _ sandbox.Watcher = (*Driver)(nil)

var _ sandbox.StdinWriter = (*Driver)(nil)

// WriteStdin implements sandbox.StdinWriter through the sandbox's agent,
// which holds the stdin of the processes it started with OpenStdin.
func (d *Driver) WriteStdin(ctx context.Context, id string, pid int, r io.Reader, closeAfter bool) error {
	rec, err := d.running(id)
	if err != nil {
		return err
	}
	if rec.SpecVersion < 2 {
		return errdefs.FailedPreconditionf("sandbox %s runs the sh init of an older driver (spec generation %d): its background processes take no input", id, rec.SpecVersion)
	}
	if err := d.agentFor(rec).Stdin(ctx, pid, r, closeAfter); err != nil {
		return d.agentErr(ctx, rec, err)
	}
	return nil
}

// Watch implements sandbox.Watcher through the sandbox's agent.
func (d *Driver) Watch(ctx context.Context, id, path string, recursive bool, ready chan<- struct{}, fn func(sandbox.WatchEvent) error) error {
	rec, err := d.running(id)
	if err != nil {
		return err
	}
	if rec.SpecVersion < 2 {
		return errdefs.FailedPreconditionf("sandbox %s runs the sh init of an older driver (spec generation %d): it has no agent to watch files", id, rec.SpecVersion)
	}
	err = d.agentFor(rec).Watch(ctx, path, recursive, ready, func(e agentproto.WatchEvent) error {
		return fn(sandbox.WatchEvent{Path: e.Path, Op: e.Op})
	})
	if err != nil && ctx.Err() == nil {
		return d.agentErr(ctx, rec, err)
	}
	return err
}
