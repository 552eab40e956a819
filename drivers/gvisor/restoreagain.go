package gvisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// Restore implements sandbox.Checkpointer: restoreOnce (checkpoint.go),
// and once more when the restored agent stays silent.
func (d *Driver) Restore(ctx context.Context, spec sandbox.Spec, imageDir string, opts sandbox.RestoreOptions) (sandbox.RestoreStats, error) {
	stats, err := d.restoreOnce(ctx, spec, imageDir, opts, restoreAgentWait)
	if !errors.Is(err, errAgentSilent) || ctx.Err() != nil {
		return stats, err
	}
	// A restored sandbox whose agent never answered (seen in CI under
	// load, twice in two days: every dial for 60 s timed out, the other
	// sandboxes restored from the same node fine) is killed and restored
	// again from the same image: its layer is put back from the image
	// too, so nothing the silent copy wrote survives. Its runsc log is
	// logged for the diagnosis.
	d.log.Warn("restore: the restored agent did not answer; killing the sandbox and restoring it again",
		"sandbox", spec.ID, "waited", restoreAgentWait, "err", err, "runsc_log", d.logTail(spec.ID, 4096))
	d.mu.Lock()
	d.calls["restore:again"]++
	d.mu.Unlock()
	if kerr := d.Kill(ctx, spec.ID); kerr != nil && !errdefs.IsNotFound(kerr) {
		return stats, errors.Join(err, kerr)
	}
	return d.restoreOnce(ctx, spec, imageDir, opts, agentReadyTimeout)
}

// restoreAgentWait bounds a restore's first wait for its agent (Restore
// then restores again, waiting agentReadyTimeout): a restored agent
// answers in milliseconds, or within seconds on a loaded host. A variable
// for tests.
var restoreAgentWait = 20 * time.Second

// errAgentSilent: a restored sandbox's agent did not answer in time.
var errAgentSilent = errors.New("the restored agent does not answer")

// waitRestoredAgent is waitAgentFor after a restore: an agent that does
// not answer is errAgentSilent (Restore restores again).
func (d *Driver) waitRestoredAgent(ctx context.Context, rec *record, wait time.Duration) error {
	err := d.waitAgentFor(ctx, rec, wait)
	if err != nil && errdefs.IsUnavailable(err) && ctx.Err() == nil {
		return fmt.Errorf("%w: %w", errAgentSilent, err)
	}
	return err
}
