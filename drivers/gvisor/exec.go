package gvisor

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/creack/pty"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/drivers/internal/procwait"
)

// drainGrace is how long Exec keeps copying output after the command has
// exited, for descendants that still hold its stdout/stderr (`cmd &`); then
// the pipes are closed and Exec returns.
const drainGrace = 200 * time.Millisecond

// killGrace bounds how long Exec waits for a command it killed (timeout or
// cancelled context) before it gives up on runsc exec itself.
const killGrace = 10 * time.Second

// Exec implements sandbox.Driver.
//
// Each call is one `runsc exec --process=<file>` whose standard streams are
// the only descriptors that reach the sandbox: pipes created by os/exec
// (never a file of the daemon or of the client: spec's readers and writers
// are wrapped so that os/exec cannot pass an *os.File through), or the
// replica of a pseudo-terminal opened here for TTY mode. os/exec marks
// every other descriptor of the daemon close-on-exec and ExtraFiles is
// empty, so runsc exec holds fds 0-2 only, and runsc donates exactly those
// to the new process.
//
// The process spec is a file rather than flags so that arguments, the
// environment (merged here: template, sandbox, call; later wins) and the
// working directory pass through verbatim. The sandbox-side PID comes back
// in --internal-pid-file; a timeout or a cancelled context kills the
// command's process group inside the sandbox with `runsc kill --pgid`
// (every exec'd process leads a new session and group), which also ends
// children that did not detach.
//
// That is the path of sandboxes of spec generations 0 and 1 (the sh init);
// a sandbox whose init is the agent (generation 2) runs the command as the
// agent's child instead (agentExec): no runsc process at all.
func (d *Driver) Exec(ctx context.Context, id string, spec sandbox.ExecSpec) (sandbox.ExitStatus, error) {
	rec, err := d.running(id)
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	return d.exec(ctx, rec, spec)
}

// exec runs spec in rec's sandbox to completion: through its agent, or
// with runsc exec in a sandbox of the sh init's generations.
func (d *Driver) exec(ctx context.Context, rec *record, spec sandbox.ExecSpec) (sandbox.ExitStatus, error) {
	if rec.SpecVersion >= 2 {
		return d.agentExec(ctx, rec, spec)
	}
	return d.runscExec(ctx, rec, spec)
}

// running loads the record of a sandbox that was started.
func (d *Driver) running(id string) (*record, error) {
	if err := validID(id); err != nil {
		return nil, errdefs.NotFoundf("sandbox %s", id)
	}
	rec, err := d.loadRecord(id)
	if err != nil {
		return nil, err
	}
	if rec.Phase != phaseCreated {
		return nil, errdefs.FailedPreconditionf("sandbox %s is being created", id)
	}
	if err := d.stopIfLeftPaused(id); err != nil {
		return nil, err
	}
	return rec, nil
}

// readerOnly wraps a reader so that os/exec copies from it through a pipe
// instead of passing it to the child when it is an *os.File.
type readerOnly struct{ io.Reader }

// writerOnly does the same for a writer.
type writerOnly struct{ io.Writer }

// runscExec is one `runsc exec` (generations 0 and 1).
func (d *Driver) runscExec(ctx context.Context, rec *record, spec sandbox.ExecSpec) (sandbox.ExitStatus, error) {
	if len(spec.Args) == 0 {
		return sandbox.ExitStatus{}, errdefs.InvalidArgumentf("exec: no command")
	}
	cwd := spec.Cwd
	if cwd == "" {
		cwd = rec.Cwd
	}
	if !strings.HasPrefix(cwd, "/") {
		return sandbox.ExitStatus{}, errdefs.InvalidArgumentf("exec: cwd %q is not absolute", cwd)
	}
	proc := specs.Process{
		Terminal:     spec.TTY,
		Args:         spec.Args,
		Env:          mergeEnv(rec.UID, rec.Env, spec.Env),
		Cwd:          cwd,
		User:         specs.User{UID: rec.UID, GID: rec.GID},
		Capabilities: caps(),
		// Not part of the checkpointed spec: every exec has it, in
		// sandboxes of either spec generation.
		NoNewPrivileges: true,
	}
	if spec.TTY {
		proc.Env = mergeEnv(rec.UID, []string{"TERM=xterm"}, rec.Env, spec.Env)
	}
	files, err := d.newExecFiles(rec.ID, &proc)
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	defer files.remove()

	args := append(d.globalFlags(rec, files.log), "exec", "--process="+files.process, "--internal-pid-file="+files.pid, runtimeID(rec.ID))
	d.countRunsc(args)
	cmd := exec.Command(d.runsc, args...)
	cmd.Env = []string{"PATH=" + defaultPath}
	var (
		ptm      *os.File // TTY mode: our end of the pseudo-terminal
		copyDone chan struct{}
	)
	if spec.TTY {
		m, s, err := pty.Open()
		if err != nil {
			return sandbox.ExitStatus{}, fmt.Errorf("exec: pty: %w", err)
		}
		ptm = m
		defer ptm.Close()
		_ = pty.Setsize(ptm, &pty.Winsize{Rows: 24, Cols: 80})
		cmd.Stdin, cmd.Stdout, cmd.Stderr = s, s, s
		// runsc exec must have the terminal as its controlling
		// terminal to forward job-control signals to the command.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		defer s.Close()
		copyDone = make(chan struct{})
		go func() {
			defer close(copyDone)
			out := spec.Stdout
			if out == nil {
				out = io.Discard
			}
			_, _ = io.Copy(out, ptm) // ends with EIO once every replica is closed
		}()
		if spec.Stdin != nil {
			go func() {
				_, _ = io.Copy(ptm, spec.Stdin)
				// End of input: a terminal has no EOF of its own;
				// ^D at the start of a line is how a reader sees one.
				_, _ = ptm.Write([]byte{4})
			}()
		}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		// Always pipes, also for absent streams (empty input, discarded
		// output): the command never gets a host file, not even
		// /dev/null.
		cmd.Stdin, cmd.Stdout, cmd.Stderr = readerOnly{strings.NewReader("")}, writerOnly{io.Discard}, writerOnly{io.Discard}
		if spec.Stdin != nil {
			cmd.Stdin = readerOnly{spec.Stdin}
		}
		if spec.Stdout != nil {
			cmd.Stdout = writerOnly{spec.Stdout}
		}
		if spec.Stderr != nil {
			cmd.Stderr = writerOnly{spec.Stderr}
		}
		cmd.WaitDelay = drainGrace
	}
	if err := cmd.Start(); err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec: start runsc: %w", err)
	}
	if spec.TTY {
		// The child has the replica now; ours would keep the master
		// from ever seeing EOF.
		cmd.Stdin.(*os.File).Close()
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	var timeout <-chan time.Time
	if spec.Timeout > 0 {
		t := time.NewTimer(spec.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	var (
		waitErr  error
		timedOut bool
		ctxErr   error
	)
	select {
	case waitErr = <-done:
	case <-timeout:
		timedOut = true
		waitErr = d.killExec(rec, files.pid, cmd, done)
	case <-ctx.Done():
		ctxErr = ctx.Err()
		waitErr = d.killExec(rec, files.pid, cmd, done)
	}
	if copyDone != nil {
		// Like WaitDelay for pipes: a descendant may hold the terminal.
		select {
		case <-copyDone:
		case <-time.After(drainGrace):
		}
		ptm.Close()
		<-copyDone // no write to spec.Stdout after Exec returns
	}
	if msgs := logMessages(files.log); len(msgs) > 0 && !timedOut && ctxErr == nil {
		return d.execFailure(rec, spec, strings.Join(msgs, "; "))
	}
	if ctxErr != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in %s: %w", rec.ID, ctxErr)
	}
	if timedOut {
		return sandbox.ExitStatus{Code: 128 + int(syscall.SIGKILL), Signal: "SIGKILL", TimedOut: true}, nil
	}
	if waitErr != nil && !errors.Is(waitErr, exec.ErrWaitDelay) {
		var ee *exec.ExitError
		if !errors.As(waitErr, &ee) {
			return sandbox.ExitStatus{}, fmt.Errorf("exec in %s: %w", rec.ID, waitErr)
		}
	}
	// runsc exec exits with the command's status, or 128+n when a signal
	// n ended it (like a shell); the two cannot be told apart here.
	code := cmd.ProcessState.ExitCode()
	if code < 0 {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in %s: runsc exec ended by %v", rec.ID, cmd.ProcessState)
	}
	return sandbox.ExitStatus{Code: code}, nil
}

// execFailure turns runsc's own error for an exec into the caller's
// result: a missing or non-executable program is exit status 127 or 126
// with runsc's reason on stderr (what a shell does); a dead sandbox is an
// error.
func (d *Driver) execFailure(rec *record, spec sandbox.ExecSpec, msg string) (sandbox.ExitStatus, error) {
	// runsc's message names host-independent things only (the command and
	// the sandbox path); keep the part after the last "in sandbox:".
	short := msg
	if i := strings.LastIndex(short, "in sandbox: "); i >= 0 {
		short = short[i+len("in sandbox: "):]
	}
	// runsc has already written its message to the command's stderr (its
	// stderr is the command's).
	switch {
	case strings.Contains(msg, "failed to load") && strings.Contains(msg, "no such file or directory"):
		return sandbox.ExitStatus{Code: 127}, nil
	case strings.Contains(msg, "failed to load"):
		return sandbox.ExitStatus{Code: 126}, nil
	case strings.Contains(msg, "initial working directory"):
		return sandbox.ExitStatus{}, errdefs.InvalidArgumentf("exec in %s: %s", rec.ID, short)
	}
	return sandbox.ExitStatus{}, d.deadOrErr(rec, msg)
}

// deadOrErr explains a failure to reach the sandbox: stopped (killed,
// crashed, or out of memory) or another error.
func (d *Driver) deadOrErr(rec *record, msg string) error {
	// Any process of the sandbox killed by its memory cgroup takes the
	// whole sandbox down (the gVisor kernel and its systrap stubs are one
	// unit), so one OOM kill explains the failure.
	if n := oomKills(rec.Cgroup); n > 0 {
		return errdefs.ResourceExhaustedf("killed: %s: sandbox %s was stopped by the out-of-memory killer; its files are kept", sandbox.OutOfMemory(rec.Limits.MemoryBytes), rec.ID)
	}
	// runsc may take a moment to notice that the sandbox died.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 20; i++ {
		st, ok, err := d.state(ctx, rec, rec.ID)
		if err != nil {
			break
		}
		if !ok || st.Status != "running" {
			return errdefs.FailedPreconditionf("sandbox %s is not running", rec.ID)
		}
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			break
		}
	}
	return fmt.Errorf("exec in %s: runsc: %s", rec.ID, msg)
}

// killExec kills an exec'd command's process group inside the sandbox and
// waits for runsc exec to report its end. It returns runsc exec's Wait
// result.
func (d *Driver) killExec(rec *record, pidFile string, cmd *exec.Cmd, done <-chan error) error {
	deadline := time.Now().Add(killGrace)
	var pid int
	for pid == 0 && time.Now().Before(deadline) {
		if b, err := os.ReadFile(pidFile); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if pid != 0 {
			break
		}
		select {
		case err := <-done:
			return err // ended before it started
		case <-time.After(10 * time.Millisecond):
		}
	}
	if pid > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), killGrace)
		_, err := d.run(ctx, rec, "kill", "--pgid="+strconv.Itoa(pid), runtimeID(rec.ID), "KILL")
		if err != nil {
			_, _ = d.run(ctx, rec, "kill", "--pid="+strconv.Itoa(pid), runtimeID(rec.ID), "KILL")
		}
		cancel()
	}
	select {
	case err := <-done:
		return err
	case <-time.After(time.Until(deadline)):
	}
	d.log.Warn("runsc exec does not return after killing its command; killing runsc exec", "sandbox", rec.ID, "pid", pid)
	_ = cmd.Process.Kill()
	return <-done
}

// execFiles are the per-exec files runsc exec reads and writes, in
// <sandbox dir>/exec/.
type execFiles struct {
	process, pid, log string
}

func (d *Driver) newExecFiles(id string, proc *specs.Process) (*execFiles, error) {
	dir := d.execDir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	base := filepath.Join(dir, hex.EncodeToString(rnd[:]))
	f := &execFiles{process: base + ".json", pid: base + ".pid", log: base + ".log"}
	b, err := json.Marshal(proc)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(f.process, b, 0o600); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *execFiles) remove() {
	for _, p := range []string{f.process, f.pid, f.log} {
		_ = os.Remove(p)
	}
}

// Background processes are children of the sandbox's init, not of a
// `runsc exec`: gVisor's restore SIGKILLs every task descended from a
// runsc exec (its caller is gone), so only the init's descendants survive
// a checkpoint. Start therefore hands the command to the init: a short
// exec (spawnScript) writes the request into spawnDir (a directory of the
// sandbox's /dev tmpfs, in its memory) and signals the init with USR1; the
// init's trap (initScript) runs every pending request in the background
// and writes its PID next to it.
//
// What the init runs is the waiter of drivers/internal/procwait: a shell that
// starts the command as its child (that child points its stdio at
// /run/amber/proc/<its own pid>.log, sets the environment and working
// directory, and execs the command, which so keeps that PID), reports the
// command's PID into spawnDir, and stays to record the command's exit
// status for Wait. The waiter's body (command, environment) is a file the
// waiter reads and removes as it starts, so that its command line, which
// Processes lists for as long as the command runs, holds none of the
// environment's values. No host process stays behind for it.

// spawnScript is run by Start's exec with the request's name as $1 and
// the waiter's body on stdin. It waits for the init's trap to be installed
// (spawnDir is made after it), publishes the request atomically, and
// signals the init, again every half second until the init has written
// the waiter's PID (<name>.pid) and the waiter the command's
// (<name>.cpid); a signal that arrives while the init is not waiting is
// not lost, but the init may have scanned the directory just before the
// request appeared. It prints the command's PID once that process runs the
// command, no longer one of the shells that start it (procwait.Starting:
// their fourth argument is amber-proc).
const spawnScript = `d=` + spawnDir + `; n=$1; i=0
while [ ! -d $d ]; do i=$((i+1)); [ $i -lt 300 ] || { echo "the sandbox's init has no spawn directory" >&2; exit 1; }; sleep 0.01 2>/dev/null || sleep 1; done
cat > $d/$n.body || exit 1
echo "amber_b=\$(cat $d/$n.body) && rm -f $d/$n.body && eval \"\$amber_b\"" > $d/$n.new && mv $d/$n.new $d/$n.req || exit 1
i=0
while [ ! -s $d/$n.pid ] || [ ! -s $d/$n.cpid ]; do
  [ $((i % 50)) -ne 0 ] || kill -USR1 1
  i=$((i+1)); [ $i -lt 2000 ] || { rm -f $d/$n.req $d/$n.body; echo "the sandbox's init did not start the process" >&2; exit 1; }
  sleep 0.01 2>/dev/null || { sleep 1; i=$((i+49)); }
done
p=$(cat $d/$n.cpid); rm -f $d/$n.pid $d/$n.cpid
i=0
while [ $i -lt 1000 ]; do
  a=$(tr '\000' '\n' </proc/$p/cmdline 2>/dev/null | { read -r x; read -r x; read -r x; read -r x; echo "$x"; })
  case $a in amber-proc|amber-wait) ;; *) break ;; esac
  i=$((i+1)); sleep 0.01 2>/dev/null || { sleep 1; i=$((i+99)); }
done
echo $p`

// Start implements sandbox.Driver. The command's stdin is /dev/null and its
// stdout and stderr go to /run/amber/proc/<pid>.log inside the sandbox;
// spec's Stdin, Stdout, Stderr, TTY and Timeout do not apply. In a sandbox
// whose init is the agent, the agent starts it as its child (agentStart)
// and also keeps its output for Output; in one of the sh init's
// generations the init does, as above, which needs a POSIX /bin/sh in the
// template.
func (d *Driver) Start(ctx context.Context, id string, spec sandbox.ExecSpec) (int, error) {
	rec, err := d.running(id)
	if err != nil {
		return 0, err
	}
	if len(spec.Args) == 0 {
		return 0, errdefs.InvalidArgumentf("start: no command")
	}
	if spec.TTY {
		return 0, errdefs.InvalidArgumentf("start: a background process has no terminal")
	}
	if rec.SpecVersion >= 2 {
		return d.agentStart(ctx, rec, spec)
	}
	cwd := spec.Cwd
	if cwd == "" {
		cwd = rec.Cwd
	}
	if !strings.HasPrefix(cwd, "/") {
		return 0, errdefs.InvalidArgumentf("start: cwd %q is not absolute", cwd)
	}
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	name := hex.EncodeToString(nonce)
	var setup, body strings.Builder
	for _, kv := range mergeEnv(rec.UID, rec.Env, spec.Env) {
		setup.WriteString("export " + procwait.ShQuote(kv) + "\n")
	}
	setup.WriteString("cd " + procwait.ShQuote(cwd) + " || exit 127\n")
	body.WriteString("set --")
	for _, a := range spec.Args {
		body.WriteString(" " + procwait.ShQuote(a))
	}
	body.WriteString("\n")
	body.WriteString(procwait.Script(procwait.Dir, setup.String(), `echo "$amber_c" >`+spawnDir+"/"+name+".cpid"))
	var out, errb bytes.Buffer
	st, err := d.runscExec(ctx, rec, sandbox.ExecSpec{
		Args:    []string{"/bin/sh", "-c", spawnScript, "amber-start", name},
		Stdin:   strings.NewReader(body.String()),
		Stdout:  &out,
		Stderr:  &errb,
		Timeout: 30 * time.Second,
	})
	if err != nil {
		return 0, err
	}
	if st.Code != 0 {
		return 0, fmt.Errorf("start in %s: exit %d: %s", id, st.Code, strings.TrimSpace(errb.String()))
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("start in %s: unexpected output %q (%s)", id, out.String(), strings.TrimSpace(errb.String()))
	}
	return pid, nil
}
