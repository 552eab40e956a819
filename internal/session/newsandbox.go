package session

import (
	"context"
	"fmt"
	"strconv"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/engine"
)

// The labels of a session's sandboxes (the engine's sandbox metadata).
// They are under engine.ReservedLabelPrefix, which only Amber's own
// creates may set: a tenant cannot label a sandbox of its own so that a
// Wake takes it for one an earlier attempt made (newSandbox).
const (
	// LabelSession is the session a sandbox was made for.
	LabelSession = engine.ReservedLabelPrefix + "session"
	// LabelSessionSandbox is which of the session's sandboxes it is: n for
	// the n-th the log names (State.SandboxesNamed+1 when it was made).
	LabelSessionSandbox = engine.ReservedLabelPrefix + "session.sandbox"
)

func sandboxLabels(session string, n int) map[string]string {
	return map[string]string{LabelSession: session, LabelSessionSandbox: strconv.Itoa(n)}
}

// newSandbox returns the sandbox to be the session's next one (the
// SandboxesNamed+1-th), before the log names it.
//
// Making it and naming it are two steps: a Wake whose record failed (a log
// full or failing for a while) or a daemon that died in between left a
// sandbox the log does not know, and the next attempt would make another
// — the first one running, and counted in the tenant's quota, for good.
// So every sandbox is made with labels naming the session and which of
// its sandboxes it is, and an attempt first looks for one made by an
// earlier attempt for the same place (Labeled). One that runs is taken
// instead of a new one: the log names a sandbox before anything runs in it
// or a checkpoint is cut of it (sandbox() and recover() record it first),
// so a sandbox the log has not named is exactly as a new one would be —
// the session's effects (the egress gateway keys them by the sandbox and
// its cut) are the same as if it had been made now. One that no longer
// runs is destroyed, as are any others of that place (two attempts raced,
// which the session's lease rules out but for a stalled holder).
func (r *run) newSandbox(ctx context.Context) (string, error) {
	st := r.st
	labels := sandboxLabels(r.id, st.SandboxesNamed+1)
	ids, err := r.h.Boxes.Labeled(ctx, st.Tenant, labels)
	if err != nil {
		return "", fmt.Errorf("look for a sandbox an earlier attempt made: %w", err)
	}
	reuse := ""
	for _, id := range ids {
		if reuse == "" {
			ok, err := r.h.Boxes.Running(ctx, st.Tenant, id)
			if err != nil && !errdefs.IsNotFound(err) {
				return "", fmt.Errorf("sandbox %s an earlier attempt made: %w", id, err)
			}
			if ok {
				reuse = id
				continue
			}
		}
		r.destroyUnrecorded(ctx, id)
	}
	if reuse != "" {
		r.h.Logger.InfoContext(ctx, "session sandbox made by an earlier attempt and not recorded: reused", "session", r.id, "sandbox", reuse)
	} else if reuse, err = r.h.Boxes.Create(ctx, st.Tenant, st.Def.Template, labels); err != nil {
		return "", fmt.Errorf("create sandbox: %w", err)
	}
	if err := r.h.Failpoints.Eval(FPSandboxBeforeRecord); err != nil {
		return "", err
	}
	return reuse, nil
}

// destroyUnrecorded destroys sandbox id, one the log never named (or one
// of a terminated session). A failure is logged, not returned: the session
// goes on, and its termination tries again (destroyLabeled).
func (r *run) destroyUnrecorded(ctx context.Context, id string) {
	if err := r.h.Boxes.Destroy(ctx, r.st.Tenant, id); err != nil && !errdefs.IsNotFound(err) {
		r.h.Logger.WarnContext(ctx, "destroy session sandbox", "session", r.id, "sandbox", id, "err", err)
	}
}

// destroyLabeled destroys, at the session's termination, every sandbox
// still labeled as the session's: its own, and any an attempt made and
// the log never named.
func (r *run) destroyLabeled(ctx context.Context) {
	ids, err := r.h.Boxes.Labeled(ctx, r.st.Tenant, map[string]string{LabelSession: r.id})
	if err != nil {
		r.h.Logger.WarnContext(ctx, "list the session's sandboxes", "session", r.id, "err", err)
		return
	}
	for _, id := range ids {
		r.destroyUnrecorded(ctx, id)
	}
}
