package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/internal/state/meta"
)

// mover is failover and moves (failover.go, move.go): adopting the
// sandboxes of a dead node, sweeping stale local copies, and moving a
// sandbox between nodes through a checkpoint. It restores and checkpoints
// through ckr and notes a moved-in sandbox's activity through idle.
type mover struct {
	*core
	ckr  *checkpointer
	idle *policyRunner
}

// Many nodes on shared stores (Options.Cluster.Shared; docs/deploy.md).
//
// Each sandbox row names the node that runs it (meta.Sandbox.Node) and an
// engine manages only its own rows. A sandbox changes node only by a
// takeover after its node died (internal/cluster decides when; Adopt does
// it), in this order, each step fenced:
//
//  1. the dead node's row is claimed (meta.ClaimDeadNode: one winner);
//  2. the leases of the sandbox's streams (sandbox/ID and effects/ID) are
//     taken over from the dead node with the next epoch: from then on the
//     dead node's appends, checkpoint commits (whose commit point is a
//     log append) and gateway journal writes are refused as fenced;
//  3. the row moves to this node (meta.MoveSandbox: compare-and-set on the
//     node column, so two adopters cannot both move it);
//  4. the sandbox, which ran, is recorded crashed (sandbox.crashed, under
//     the new epoch) and restored in place from its latest committed
//     checkpoint (Recover): the same id, one generation on.
//
// A sandbox stopped to move off a draining node (move.go) is restored the
// same way, without being recorded crashed (it stopped at its checkpoint).
//
// A dead node that comes back finds its rows gone: its driver's copies of
// sandboxes that now run elsewhere are stale and destroyed (DiscardStale,
// and reconcile at start).

// LeaseHolder returns the holder name of the leases this engine takes on
// sandbox streams for node id.
func LeaseHolder(node string) string { return "node/" + node }

// unknownSandbox handles a driver sandbox none of this node's rows names:
// on shared stores, a sandbox whose row is on another node is a stale copy
// (this node was declared dead and the sandbox restored elsewhere) and is
// destroyed; anything else is left alone.
func (e *mover) unknownSandbox(ctx context.Context, id string) {
	if e.lease.shared {
		sb, err := e.meta.Get(ctx, id)
		if err == nil && sb.Node != e.lease.nodeID {
			e.lg.Warn("destroying a stale copy: the sandbox now runs on another node", "sandbox_id", id, "node", sb.Node)
			e.dropLocal(ctx, id)
			return
		}
	}
	e.lg.Warn("driver has a sandbox the metadata store does not know; left alone", "sandbox_id", id)
}

// dropLocal destroys this node's driver state of sandbox id and forgets
// its leases, without touching its row or its streams (they belong to
// another node now).
func (e *mover) dropLocal(ctx context.Context, id string) {
	defer e.lock(id)()
	e.dropLocked(ctx, id)
}

// dropLocked is dropLocal under sandbox id's lock, which the caller holds.
// The row is read again under the lock: the caller saw it on another
// node, but this node may have adopted the sandbox since (a failover or a
// move back, which hold the lock while they move the row here) — then the
// copy is this node's own and stays.
func (e *mover) dropLocked(ctx context.Context, id string) {
	if sb, err := e.meta.Get(ctx, id); err == nil && sb.Node == e.lease.nodeID {
		e.lg.Info("not a stale copy any more: the sandbox was moved back to this node", "sandbox_id", id)
		return
	}
	e.resetEgress(id, "the sandbox moved to another node")
	if err := e.drv.Destroy(ctx, id); err != nil && !errdefs.IsNotFound(err) {
		e.lg.Error("destroy stale copy", "sandbox_id", id, "err", err)
	}
	e.lease.mu.Lock()
	delete(e.lease.held, id)
	delete(e.lease.held, "effects:"+id)
	e.lease.mu.Unlock()
}

// DiscardStale destroys every sandbox this node's driver runs whose row
// is no longer this node's. The cluster calls it when the node learns it
// was declared dead (its heartbeat was fenced), before it registers again.
//
// A copy busy with an operation of this node (a checkpoint whose commit
// hangs on a store that was out of reach holds the sandbox's lock until
// its fenced append fails) is destroyed last, once the operation lets go:
// the free copies are destroyed first, so one stuck operation does not
// keep every other stale copy running.
func (e *mover) DiscardStale(ctx context.Context) (int, error) {
	infos, err := e.drv.List(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	var busy []meta.Sandbox
	for _, in := range infos {
		sb, err := e.meta.Get(ctx, in.ID)
		if err != nil || sb.Node == e.lease.nodeID {
			continue
		}
		unlock, ok := e.tryLock(in.ID)
		if !ok {
			busy = append(busy, sb)
			continue
		}
		e.lg.Warn("destroying a stale copy: the sandbox now runs on another node", "sandbox_id", in.ID, "node", sb.Node)
		e.dropLocked(ctx, in.ID)
		unlock()
		n++
	}
	for _, sb := range busy {
		e.lg.Warn("destroying a stale copy once the operation in flight on it ends: the sandbox now runs on another node", "sandbox_id", sb.ID, "node", sb.Node)
		e.dropLocal(ctx, sb.ID)
		n++
	}
	return n, nil
}

// Adopted is what Adopt did with one sandbox.
type Adopted struct {
	Sandbox  meta.Sandbox
	Restored bool   // running again here from its latest checkpoint
	Reason   string // why not, when not
}

// Adopt makes this node the owner of sandbox id, which ran on the dead
// node from, with the leases the caller took over on its streams (keys
// "sandbox" and, when it has egress, "effects"; see the steps above). A
// sandbox that was running is restored here from its latest committed
// checkpoint; one without a checkpoint stays crashed (its memory died with
// its node). It fails with ErrFenced when another node moved the row first.
func (e *mover) Adopt(ctx context.Context, id, from string, leases map[string]eventlog.Lease) (Adopted, error) {
	if l, ok := leases["sandbox"]; ok {
		if l.Stream != Stream(id) || l.Holder != e.lease.holder {
			return Adopted{}, errdefs.InvalidArgumentf("adopt %s: lease %s held by %s is not this node's lease on its stream", id, l.Stream, l.Holder)
		}
	}
	start := time.Now()
	ad, restore, err := e.adoptRow(ctx, id, from, leases)
	if err != nil || !restore {
		return ad, err
	}
	sb := ad.Sandbox
	lg := e.lg.With("sandbox_id", id, "tenant_id", sb.Tenant, "from_node", from)
	tRecover := time.Now()
	restored, err := e.ckr.Recover(ctx, sb.Tenant, id, nil)
	if err != nil {
		lg.Warn("adopted sandbox not restored", "err", err)
		if errdefs.IsFenced(err) {
			return Adopted{Sandbox: restored}, err
		}
		cur, _ := e.meta.Get(ctx, id)
		return Adopted{Sandbox: cur, Reason: err.Error()}, nil
	}
	lg.Info("adopted sandbox restored from its latest checkpoint", "generation", restored.Generation, "origin", restored.Origin,
		"took", time.Since(start).Round(time.Millisecond), "recover", time.Since(tRecover).Round(time.Millisecond))
	return Adopted{Sandbox: restored, Restored: true}, nil
}

// adoptRow is Adopt's part under sandbox id's lock, from the leases to the
// crash record: this node's stale-copy sweep (DiscardStale) may have seen
// the row on the dead node a moment ago, and reads it again under the lock
// before it destroys anything (CI saw a sandbox a drain's failover had
// just restored destroyed as a "stale copy"). It installs the leases,
// moves the row here and records what the death did to it; restore says
// whether the sandbox is to be restored from its checkpoint.
func (e *mover) adoptRow(ctx context.Context, id, from string, leases map[string]eventlog.Lease) (ad Adopted, restore bool, err error) {
	defer e.lock(id)()
	e.lease.mu.Lock()
	if l, ok := leases["sandbox"]; ok {
		e.lease.held[id] = l
	}
	if l, ok := leases["effects"]; ok && l.Stream == gateway.Stream(id) {
		e.lease.held["effects:"+id] = l
	}
	e.lease.mu.Unlock()
	sb, err := e.meta.MoveSandbox(ctx, id, from, e.lease.nodeID)
	if err != nil {
		return Adopted{Sandbox: sb}, false, err
	}
	switch {
	case sb.Pooled:
		_, err := e.meta.SetState(ctx, id, meta.StateDestroyed, "pooled on node "+from+", which died")
		return Adopted{Sandbox: sb, Reason: "pooled"}, false, err
	case isMoving(sb), sb.State == meta.StateCrashed:
		// Stopped cleanly at a fresh checkpoint to move off a draining
		// node (move.go): restored from it, not crashed. Or crashed
		// already: restored.
	case sb.State == meta.StateRunning || sb.State == meta.StateCreating || sb.State == meta.StateRestoring:
		if err := e.markCrashed(ctx, sb, EventCrashed, fmt.Sprintf("its node %s died", from)); err != nil {
			return Adopted{Sandbox: sb}, false, fmt.Errorf("adopt %s: %w", id, err)
		}
	default:
		// Stopped or destroyed: nothing ran; it stays as it is, here.
		return Adopted{Sandbox: sb, Reason: "not running"}, false, nil
	}
	return Adopted{Sandbox: sb}, true, nil
}
