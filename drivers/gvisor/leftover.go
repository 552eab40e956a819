package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// A cut pauses the sentry and resumes it by calls on its control socket
// (checkpoint.go), which runsc's state does not see: a sandbox paused that
// way is "running" to runsc. A daemon SIGKILLed between the two calls
// leaves it paused for good, and a paused sentry acts on no signal —
// runsc kill --all leaves it as it is. So the cut marks the sandbox's
// directory before its Pause and clears the mark once it resumed (or
// stopped, for a LeaveStopped cut); a mark found while this driver holds
// the sandbox's lock (every cut holds it) is a cut that did not end.

// cutMarkName is the mark of a cut in progress, in the sandbox's directory.
const cutMarkName = "cut-in-progress"

func (d *Driver) cutMark(id string) string { return filepath.Join(d.dir(id), cutMarkName) }

// markCut writes the mark before a cut pauses sandbox id. It needs no
// fsync: it outlives the daemon's process (the page cache does), and a
// host that loses it lost the sandbox too.
func (d *Driver) markCut(id string) error {
	if err := os.WriteFile(d.cutMark(id), nil, 0o600); err != nil {
		return fmt.Errorf("mark the cut of %s: %w", id, err)
	}
	return nil
}

// clearCut removes the mark once sandbox id runs again or is stopped.
func (d *Driver) clearCut(id string) {
	if err := os.Remove(d.cutMark(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		d.log.Warn("the mark of a finished cut could not be removed; the next kill stops the sandbox by its cgroup at once", "sandbox", id, "err", err)
	}
}

// leftPaused reports whether sandbox id may have been left paused by a cut
// that did not end. The caller holds id's lock, so no cut of this process
// is under way.
func (d *Driver) leftPaused(id string) bool {
	_, err := os.Stat(d.cutMark(id))
	return err == nil
}

// stopPaused stops a sandbox that a checkpoint left paused (runsc
// checkpoint without --leave-running does not stop a paused sandbox, and
// runsc kill refuses a paused one): its host processes (the gVisor kernel,
// the gofer) are SIGKILLed while it is still paused, so nothing of it runs
// after the cut, and its runtime state is deleted (runsc would go on
// reporting it paused), and the mark of its cut cleared (leftover.go).
// The driver's record, the layer and the network namespace stay: Inspect
// reports the sandbox stopped, Restore and Destroy work as after Kill.
// Kill stops a sandbox a dead daemon's cut left paused the same way.
func (d *Driver) stopPaused(rec *record) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := rec.ID
	if err := killCgroup(rec.Cgroup, 10*time.Second); err != nil {
		return err
	}
	if _, err := d.run(ctx, rec, "delete", "--force", runtimeID(id)); err != nil && !notExist(err) {
		d.log.Debug("checkpoint: runsc delete of the stopped sandbox failed; removing its state by hand", "sandbox", id, "err", err)
	}
	if err := killCgroup(rec.Cgroup, 10*time.Second); err != nil {
		return err
	}
	d.clearCut(id)
	return d.removeRuntimeState(id)
}

// stopIfLeftPaused stops sandbox id when a cut that did not end left it
// paused, for a caller that does not hold id's lock (running: an exec
// would wait on a sentry that runs nothing). A mark whose lock is held is
// a cut of this process under way: left alone.
func (d *Driver) stopIfLeftPaused(id string) error {
	if !d.leftPaused(id) {
		return nil
	}
	unlock, ok := d.tryLock(id)
	if !ok {
		return nil
	}
	defer unlock()
	return d.stopLeftPausedLocked(id)
}

// stopLeftPausedLocked is stopIfLeftPaused under id's lock (Checkpoint:
// a new cut's Pause on a sentry left paused stacks on the old one, and
// its Resume leaves the sandbox paused, its mark gone — chaos seed 303381:
// the next kill waited runsc kill's 10 s and the cgroup's 5 s). Whether
// the dead cut's Pause was made is unknown (the mark comes first), and a
// Resume without one takes the sentry down, so the sandbox is stopped as
// a crash stops it: it is restored from its last checkpoint.
func (d *Driver) stopLeftPausedLocked(id string) error {
	if !d.leftPaused(id) {
		return nil
	}
	rec, err := d.loadRecord(id)
	if err != nil {
		return err
	}
	d.log.Warn("a cut that did not end (its daemon died mid-cut) left the sandbox paused; stopping it", "sandbox", id)
	if err := d.stopPaused(rec); err != nil {
		return fmt.Errorf("stop sandbox %s left paused: %w", id, err)
	}
	d.mu.Lock()
	d.calls["stop:left-paused"]++
	d.mu.Unlock()
	return errdefs.FailedPreconditionf("sandbox %s was left paused by a cut that did not end (its daemon died mid-cut) and is stopped; restore it from its last checkpoint", id)
}
