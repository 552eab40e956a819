package engine

import (
	"context"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/internal/state/meta"
)

// Moving a sandbox off a draining node (internal/cluster drives it; see
// its package comment for who does what). The engine's part:
//
//   - MoveOut, on the draining node: a checkpoint with Stop (checkpoint.go:
//     the image is committed — chunks, manifest, pointer, the
//     sandbox.checkpointed event — before the sandbox stops), whose row
//     and sandbox.killed event carry MovingReason(target). Nothing that
//     ran before the stop is lost: the checkpoint is cut after it.
//   - MoveIn, on the target, once the row and the stream leases are its
//     own: an in-place restore from the latest committed checkpoint (that
//     one), one generation on (sandbox.restored). The sandbox is not
//     recorded crashed: it stopped cleanly at its cut.
//
// A sandbox stopped for a move is also what a failover restores (Adopt):
// if either node dies midway, whichever node ends up with the row brings
// it back from the same checkpoint.

const (
	movingPrefix = "moving to node "
	movingSuffix = ": checkpointed and stopped to move off a draining node"
)

// MovingReason is the reason of a sandbox stopped to move to node to.
func MovingReason(to string) string { return movingPrefix + to + movingSuffix }

// MovingTo returns the node sb is moving to when it is stopped for a move.
func MovingTo(sb meta.Sandbox) (string, bool) {
	if sb.State != meta.StateStopped {
		return "", false
	}
	rest, ok := strings.CutPrefix(sb.Reason, movingPrefix)
	if !ok {
		return "", false
	}
	to, ok := strings.CutSuffix(rest, movingSuffix)
	if !ok || to == "" {
		return "", false
	}
	return to, true
}

func isMoving(sb meta.Sandbox) bool { _, ok := MovingTo(sb); return ok }

// MoveOut checkpoints running sandbox sb (of this node) and leaves it
// stopped for a move to node to (see above). It fails with the
// checkpoint's error, and then the sandbox runs on here as before.
func (e *mover) MoveOut(ctx context.Context, sb meta.Sandbox, to string) (meta.Checkpoint, error) {
	if err := e.ownedHere(sb); err != nil {
		return meta.Checkpoint{}, err
	}
	return e.ckr.Checkpoint(ctx, CheckpointRequest{Tenant: sb.Tenant, Sandbox: sb.ID, Stop: true, stopReason: MovingReason(to)})
}

// Redirect points sandbox id, stopped on this node for a move to a node
// that is gone or full, at node to instead.
func (e *mover) Redirect(ctx context.Context, id, to string) (meta.Sandbox, error) {
	sb, err := e.meta.Get(ctx, id)
	if err != nil {
		return sb, err
	}
	if err := e.ownedHere(sb); err != nil {
		return sb, err
	}
	if _, ok := MovingTo(sb); !ok {
		return sb, errdefs.FailedPreconditionf("sandbox %s is %s (%s), not stopped for a move", id, sb.State, sb.Reason)
	}
	return e.meta.SetState(ctx, id, meta.StateStopped, MovingReason(to), meta.StateStopped)
}

// MoveIn restores sandbox id, moved to this node (its row is this node's
// and the caller took its stream leases over: keys "sandbox" and
// "effects", as for Adopt), from its latest committed checkpoint. A
// sandbox that is no longer stopped for a move (another call restored it)
// is returned as it is.
func (e *mover) MoveIn(ctx context.Context, id string, leases map[string]eventlog.Lease) (meta.Sandbox, error) {
	if l, ok := leases["sandbox"]; ok && (l.Stream != Stream(id) || l.Holder != e.lease.holder) {
		return meta.Sandbox{}, errdefs.InvalidArgumentf("move %s in: lease %s held by %s is not this node's lease on its stream", id, l.Stream, l.Holder)
	}
	e.lease.mu.Lock()
	if l, ok := leases["sandbox"]; ok {
		e.lease.held[id] = l
	}
	if l, ok := leases["effects"]; ok && l.Stream == gateway.Stream(id) {
		e.lease.held["effects:"+id] = l
	}
	e.lease.mu.Unlock()
	sb, err := e.meta.Get(ctx, id)
	if err != nil {
		return sb, err
	}
	if err := e.ownedHere(sb); err != nil {
		return sb, err
	}
	if _, ok := MovingTo(sb); !ok {
		return sb, nil
	}
	ck, err := e.latestCheckpoint(ctx, id)
	if err != nil {
		return sb, err
	}
	e.idle.touch(id)
	return e.ckr.restore(ctx, ck, id, nil)
}
