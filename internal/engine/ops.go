package engine

import (
	"context"
	"io"
	"os"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/obs/tracing"
	"github.com/amber-run/amber/internal/state/meta"
)

// inSandbox marks a call that runs something in sandbox id (exec, start,
// ps, signal) until the returned func is called. A checkpoint's cut waits
// for such calls to end and holds new ones until the sandbox runs again:
// runsc refuses to checkpoint during an exec, and a command must not see
// its sandbox paused mid-call. A call waits behind a cut for at most
// DriverTimeout + CutLockTimeout, then fails Unavailable (cutLocks).
func (e *Engine) inSandbox(ctx context.Context, id string) (func(), error) {
	return e.cuts.call(ctx, id)
}

// cutLock is sandbox id's cut lock. Its writers change the sandbox's
// layer under everyone's feet: a checkpoint's cut (which archives the
// layer: Checkpoint) and a restore's driver call (which rebuilds it:
// restoreOnce), each holding the sandbox's lock already. Its readers are
// the calls into the sandbox (inSandbox: exec, start, ps, signal, stats)
// and the file operations (Files, heldFS), which so never race the
// archive walk or the extraction.
//
// Lock order: e.lock(id), then cutLock(id). A reader holds nothing else
// while it holds the cut lock, and takes neither e.lock(id) nor the cut
// lock again before it lets go (a reader that waits for a second read
// lock behind a waiting writer gets it only when that writer gives up).
// A long reader (a command, a file streamed to a slow client) delays a
// cut until it ends or the cut's wait, RecoveryOptions.CutLockTimeout,
// passes (then the cut fails Unavailable and its loop tries again); the
// cut, once waiting, holds new readers back. Every wait has a deadline:
// see cutLocks (cutlock.go) for both sides'.
func (e *core) cutLock(id string) *cutMutex {
	return e.cuts.get(id)
}

// enter returns tenant's sandbox id, running, with a hold on it that a
// checkpoint's cut waits for (see inSandbox); the caller releases it with
// the returned func. A sandbox stopped for being idle is resumed first. The
// call counts as activity for the idle timeout, at its start and its end.
func (e *Engine) enter(ctx context.Context, tenant, id string) (meta.Sandbox, func(), error) {
	for attempt := 0; ; attempt++ {
		sb, err := e.Get(ctx, tenant, id)
		if err != nil {
			return sb, nil, err
		}
		if e.suspended(sb) && attempt < 3 {
			if _, err := e.resume(ctx, sb); err != nil {
				return sb, nil, err
			}
			continue
		}
		if sb.State == meta.StateRestoring && attempt < 3 {
			// Another call is resuming (or someone restoring) it: wait
			// for that to end under the sandbox's lock, then look again.
			e.lock(id)()
			continue
		}
		if to, ok := MovingTo(sb); ok {
			return sb, nil, errdefs.Unavailablef("sandbox %s is moving to node %s (its node is draining); retry in a few seconds", id, to)
		}
		if sb.State != meta.StateRunning {
			return sb, nil, errdefs.FailedPreconditionf("sandbox %s is %s, not running", id, sb.State)
		}
		unlock, err := e.inSandbox(ctx, id)
		if err != nil {
			return sb, nil, err
		}
		// A cut (an idle stop) may have ended while this call waited.
		if cur, err := e.meta.Get(ctx, id); err == nil && cur.State == meta.StateRunning {
			e.touch(id)
			return cur, func() { e.touch(id); unlock() }, nil
		}
		unlock()
		if attempt >= 3 {
			return sb, nil, errdefs.FailedPreconditionf("sandbox %s stopped while the call waited", id)
		}
	}
}

// Wake returns tenant's sandbox id running: one stopped for being idle (or
// suspended by a lifecycle observer) is resumed first, as by every call
// into it (enter); any other state that is not running is
// FailedPrecondition. The API calls it before it answers a call whose
// answer starts before the work does (an exec's stream, a terminal's
// ticket), so that an idle sandbox wakes as it does for files and MCP.
func (e *Engine) Wake(ctx context.Context, tenant, id string) (meta.Sandbox, error) {
	sb, unlock, err := e.enter(ctx, tenant, id)
	if err != nil {
		return sb, err
	}
	unlock()
	return sb, nil
}

// running returns sandbox id if tenant owns it and it runs.
func (e *core) running(ctx context.Context, tenant, id string) (meta.Sandbox, error) {
	sb, err := e.Get(ctx, tenant, id)
	if err != nil {
		return sb, err
	}
	if err := e.ownedHere(sb); err != nil {
		return sb, err
	}
	if sb.State != meta.StateRunning {
		return sb, errdefs.FailedPreconditionf("sandbox %s is %s, not running", id, sb.State)
	}
	return sb, nil
}

// withEnv adds the sandbox's claimed env in front of a command's own: the
// driver already has the env of sandboxes it created for a tenant, but a
// sandbox from the warm pool was created before its env was known.
func withEnv(sb meta.Sandbox, spec sandbox.ExecSpec) sandbox.ExecSpec {
	if sb.FromPool && len(sb.Env) > 0 {
		spec.Env = append(append([]string{}, sb.Env...), spec.Env...)
	}
	return spec
}

func validateExec(spec sandbox.ExecSpec) error {
	if len(spec.Args) == 0 || spec.Args[0] == "" {
		return errdefs.InvalidArgumentf("no command given")
	}
	if spec.Timeout < 0 {
		return errdefs.InvalidArgumentf("timeout must not be negative")
	}
	return nil
}

// Exec runs a command in sandbox id to completion, streaming its output.
func (e *Engine) Exec(ctx context.Context, tenant, id string, spec sandbox.ExecSpec) (st sandbox.ExitStatus, err error) {
	ctx, span := e.span(ctx, "engine.exec", tenant, id)
	defer func() {
		span.SetAttributes(tracing.ExitCode.Int(st.Code))
		tracing.End(span, err)
	}()
	if err := validateExec(spec); err != nil {
		return sandbox.ExitStatus{}, err
	}
	if err := e.admit(ctx, tenant); err != nil {
		return sandbox.ExitStatus{}, err
	}
	sb, unlock, err := e.enter(ctx, tenant, id)
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	// Driver errors name the sandbox already.
	began := time.Now()
	st, err = e.drv.Exec(ctx, id, withEnv(sb, spec))
	unlock()
	if err != nil {
		return st, err
	}
	return st, e.afterExec(ctx, sb, time.Since(began))
}

// StartProcess runs a command in the background in sandbox id and returns
// its sandbox-side PID.
func (e *Engine) StartProcess(ctx context.Context, tenant, id string, spec sandbox.ExecSpec) (int, error) {
	if err := validateExec(spec); err != nil {
		return 0, err
	}
	if err := e.admit(ctx, tenant); err != nil {
		return 0, err
	}
	sb, unlock, err := e.enter(ctx, tenant, id)
	if err != nil {
		return 0, err
	}
	defer unlock()
	return e.drv.Start(ctx, id, withEnv(sb, spec))
}

// Processes lists the processes of sandbox id, without the engine's own
// commands in it (withoutHelpers).
func (e *Engine) Processes(ctx context.Context, tenant, id string) ([]sandbox.Process, error) {
	_, unlock, err := e.enter(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	ps, err := e.drv.Processes(ctx, id)
	return withoutHelpers(ps), err
}

// withoutHelpers leaves out of a process list the engine's own commands
// in the sandbox (isHelper: Stats' df), which are not the tenant's.
func withoutHelpers(ps []sandbox.Process) []sandbox.Process {
	out := ps[:0:0]
	for _, p := range ps {
		if !isHelper(p.Args) {
			out = append(out, p)
		}
	}
	return out
}

// Signal sends sig to process pid of sandbox id.
func (e *Engine) Signal(ctx context.Context, tenant, id string, pid int, sig os.Signal) error {
	if pid <= 0 {
		return errdefs.InvalidArgumentf("pid %d is not a process", pid)
	}
	_, unlock, err := e.enter(ctx, tenant, id)
	if err != nil {
		return err
	}
	defer unlock()
	return e.drv.Signal(ctx, id, pid, sig)
}

// Wait waits for background process pid of sandbox id (one StartProcess
// made) to end and returns how it ended. The status is kept inside the
// sandbox, so a Wait after the end, or a second one, returns it too; when
// ctx ends first, Wait returns and the process runs on.
func (e *Engine) Wait(ctx context.Context, tenant, id string, pid int) (sandbox.ExitStatus, error) {
	if pid <= 0 {
		return sandbox.ExitStatus{}, errdefs.InvalidArgumentf("pid %d is not a process", pid)
	}
	_, unlock, err := e.enter(ctx, tenant, id)
	if err != nil {
		return sandbox.ExitStatus{}, err
	}
	// Waiting reads a status file from the host: it holds nothing that a
	// checkpoint would wait for.
	unlock()
	return e.drv.Wait(ctx, id, pid)
}

// Files gives access to sandbox id's filesystem. A stopped or crashed
// sandbox keeps its files, so they stay readable until it is destroyed.
// An idle (suspended) sandbox is resumed first, except for a call
// WithoutResume, which reads its stopped layer in place (idle.go).
// Finding the sandbox's root and each operation of the FS hold the cut
// lock for reading (see cutLock): a file operation waits for a cut's
// archive walk or a restore's extraction to end, and neither starts while
// one runs — a symlink the files API puts where a directory was cannot
// be followed by the walk half-way through.
func (e *Engine) Files(ctx context.Context, tenant, id string) (sandbox.FS, error) {
	sb, err := e.Get(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if sb.State == meta.StateDestroyed || sb.State == meta.StateCreating {
		return nil, errdefs.FailedPreconditionf("sandbox %s is %s", id, sb.State)
	}
	frozen := e.suspended(sb) && resumeForbidden(ctx) // read from its layer, not resumed (idle.go)
	if e.suspended(sb) && !frozen {
		if _, err := e.resume(ctx, sb); err != nil {
			return nil, err
		}
	}
	if !frozen {
		e.touch(id)
	}
	unlock, err := e.inSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	fs, err := e.drv.Files(ctx, id)
	if frozen && err != nil {
		// Its layer is not on this node (a moved sandbox, a layer
		// collected after the stop).
		e.lg.Info("a read of an idle sandbox has no layer here", "sandbox_id", id, "err", err)
		return nil, errNotResumed(sb)
	}
	if err != nil {
		return nil, err
	}
	return &heldFS{fs: fs, hold: func(ctx context.Context) (func(), error) { return e.inSandbox(ctx, id) }}, nil
}

// ProcessOutput streams process pid's output from offset to fn (see
// sandbox.OutputReader): the output is kept inside the sandbox, so a client
// re-attaches with the offset it had after a dropped connection, a daemon
// restart, a checkpoint or a restore. Like Wait, it holds nothing a
// checkpoint waits for: the sandbox lock is only taken to find the sandbox.
func (e *Engine) ProcessOutput(ctx context.Context, tenant, id string, pid int, offset int64, follow bool, fn func(sandbox.OutputFrame) error) error {
	if pid <= 0 {
		return errdefs.InvalidArgumentf("pid %d is not a process", pid)
	}
	if offset < 0 {
		return errdefs.InvalidArgumentf("offset %d is negative", offset)
	}
	or, ok := e.drv.(sandbox.OutputReader)
	if !ok {
		return errdefs.NotImplementedf("the %s driver keeps no process output", e.drv.Name())
	}
	_, unlock, err := e.enter(ctx, tenant, id)
	if err != nil {
		return err
	}
	unlock()
	return or.Output(ctx, id, pid, offset, follow, fn)
}

// WriteStdin copies r into background process pid's stdin (one
// StartProcess made with OpenStdin; see sandbox.StdinWriter). Like
// ProcessOutput it holds nothing a checkpoint waits for: a stream of input
// does not hold a cut back; one a cut breaks fails, and the client sends
// the rest again.
func (e *Engine) WriteStdin(ctx context.Context, tenant, id string, pid int, r io.Reader, closeAfter bool) error {
	if pid <= 0 {
		return errdefs.InvalidArgumentf("pid %d is not a process", pid)
	}
	sw, ok := e.drv.(sandbox.StdinWriter)
	if !ok {
		return errdefs.NotImplementedf("the %s driver cannot feed a background process's stdin", e.drv.Name())
	}
	_, unlock, err := e.enter(ctx, tenant, id)
	if err != nil {
		return err
	}
	unlock()
	return sw.WriteStdin(ctx, id, pid, r, closeAfter)
}

// WatchFiles streams changes under path in sandbox id to fn (see
// sandbox.Watcher) until ctx ends. It holds nothing a checkpoint waits for;
// a watch that a cut or a restore breaks ends with an error, and the client
// watches again.
func (e *Engine) WatchFiles(ctx context.Context, tenant, id, path string, recursive bool, ready chan<- struct{}, fn func(sandbox.WatchEvent) error) error {
	if !strings.HasPrefix(path, "/") || len(path) > 4096 {
		return errdefs.InvalidArgumentf("watch: path %.80q is not an absolute sandbox path", path)
	}
	w, ok := e.drv.(sandbox.Watcher)
	if !ok {
		return errdefs.NotImplementedf("the %s driver cannot watch files", e.drv.Name())
	}
	_, unlock, err := e.enter(ctx, tenant, id)
	if err != nil {
		return err
	}
	unlock()
	return w.Watch(ctx, id, path, recursive, ready, fn)
}
