package cluster

// # Draining a node (POST /v1/nodes/{id}/drain, amber node drain)
//
// The operator marks node D draining (meta.SetNodeState; D's heartbeats
// keep it alive, placement sends no new sandbox to it). Then, with no call
// between nodes (every step is a write to the shared stores that the other
// side's loop reads):
//
//  1. D, in its drain loop, for each running sandbox of its own: picks a
//     target T (meta.Place: live, not draining, room; counting the moves it
//     already started), then engine.MoveOut: a fresh checkpoint committed
//     (chunks, manifest, pointer, sandbox.checkpointed) and only then the
//     sandbox stops, its row stopped with reason "moving to node T…"
//     (engine.MovingReason) and a sandbox.killed event.
//  2. T, in its drain loop, finds rows of draining nodes stopped for a move
//     to T, and for each (MoveIn):
//     a. moves the row to itself: meta.MoveSandbox(D → T), a compare-and-
//     set on its node (one winner, whoever races it);
//     b. takes the leases of its streams (sandbox/ID, effects/ID) over
//     from D with the next epoch: D's writes for it are refused from
//     here on (the same fencing as a failover);
//     c. engine.MoveIn restores it in place from its latest checkpoint
//     (the one of step 1): running, one generation on, sandbox.restored.
//  3. D's scan finds its driver's copy of a sandbox whose row is on T now
//     and destroys it (engine.DiscardStale).
//
// Stopped and crashed rows hold no memory: D moves them itself (leases
// over to T's holder, then the row), and they stay as they are, on T.
//
// An interrupted move ends in a state the normal paths finish:
//   - D dies before 1 commits: the row is running on D; failover restores
//     it from its previous checkpoint, as for any dead node.
//   - D dies after 1 (before or during 2): failover of D (engine.Adopt)
//     restores a row stopped for a move from its checkpoint, not crashed;
//     if T moved the row first, the failover of D no longer sees it and T
//     finishes.
//   - T dies before 2a: D sees its target is down and points the row at
//     another target (engine.Redirect).
//   - T dies after 2a: failover of T adopts the row; the stream leases may
//     still be D's (T died before 2b): a sandbox stopped for a move has its
//     leases taken over from whoever holds them (takeStreams), since its
//     row, moved by compare-and-set, says who owns it.
//   - T dies after 2b: a plain failover of T (the row is stopped for a
//     move, or restoring: crashed, then restored).
//   - T restarts or its restore fails (2c): its loop retries the restore of
//     its own rows stopped for a move.
//   - D stops cleanly (left) mid-drain: T still pulls the rows stopped for
//     a move to it. D restarted: it registers draining again (its cordon,
//     meta.SetNodeState) and T still pulls them. D undrained before T
//     pulled a row: D restores it itself.

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/egress/gateway"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/state/meta"
)

func (n *Node) drainLoop(ctx context.Context) {
	every(ctx, n.o.Scan, func() {
		if err := n.drainStep(ctx); err != nil && ctx.Err() == nil {
			n.lg.Warn("drain this node", "err", err)
		}
		if err := n.pullMoves(ctx); err != nil && ctx.Err() == nil {
			n.lg.Warn("take sandboxes moving here", "err", err)
		}
	})
}

// drainStep moves this node's sandboxes out while its row says draining
// (steps 1 and, for rows that do not run, the whole move; see above).
func (n *Node) drainStep(ctx context.Context) error {
	me, err := n.o.Meta.GetNode(ctx, n.id)
	if err != nil {
		return err
	}
	draining := me.State == meta.NodeDraining && me.Epoch == n.epoch.Load()
	// A draining node's warm pool would only hold memory: nothing is
	// created here while it drains.
	if err := n.o.Engine.PausePool(ctx, draining); err != nil {
		n.lg.Warn("pause the warm pool of this draining node", "err", err)
	}
	if !draining {
		return nil
	}
	rows, err := n.o.Meta.List(ctx, meta.Filter{Node: &n.id, States: []meta.State{meta.StateRunning, meta.StateStopped, meta.StateCrashed}})
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		return nil
	}
	nodes, err := n.o.Meta.ListNodes(ctx)
	if err != nil {
		return err
	}
	now := n.o.Clock.Now()
	pl := planner{nodes: nodes, now: now}
	place := func(sb meta.Sandbox) (meta.Node, error) { return pl.place(sb, n.id) }
	alive := func(id string) bool {
		for _, nd := range nodes {
			if nd.ID == id {
				return nd.Alive(now) && nd.State == meta.NodeLive
			}
		}
		return false
	}
	for _, sb := range rows {
		if ctx.Err() != nil {
			return nil
		}
		if sb.Pooled {
			continue // the pool's, not a tenant's: it goes with the node
		}
		lg := n.lg.With("sandbox_id", sb.ID)
		if to, ok := engine.MovingTo(sb); ok {
			if alive(to) {
				continue // the target's loop takes it
			}
			t, err := place(sb)
			if err != nil {
				n.warnEvery(sb.ID, lg, "sandbox stopped for a move to a node that is down; no other node has room", "to", to, "err", err)
				continue
			}
			if _, err := n.o.Engine.Redirect(ctx, sb.ID, t.ID); err != nil {
				lg.Warn("redirect a move", "err", err)
			} else {
				lg.Warn("the target of a move is down; moving to another node", "was", to, "to", t.ID)
			}
			continue
		}
		t, err := place(sb)
		if err != nil {
			n.warnEvery(sb.ID, lg, "no node can take this draining node's sandbox", "err", err)
			continue
		}
		start := time.Now()
		if sb.State != meta.StateRunning {
			if err := n.pushRow(ctx, sb.ID, t.ID); err != nil {
				n.warnEvery(sb.ID, lg, "move a sandbox that does not run", "to", t.ID, "err", err)
			}
			continue
		}
		ck, err := n.o.Engine.MoveOut(ctx, sb, t.ID)
		if err != nil {
			n.warnEvery(sb.ID, lg, "checkpoint for a move", "to", t.ID, "err", err)
			continue
		}
		if err := n.o.Failpoints.EvalFor("cluster.move-out", sb.ID); err != nil {
			return err
		}
		n.warned.Delete(sb.ID)
		lg.Info("sandbox checkpointed and stopped to move off this draining node", "to", t.ID, "checkpoint_id", ck.ID,
			"took", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// planner places sandboxes one after another over nodes (their last
// heartbeats), counting each on its target, so that one pass does not
// send everything to the node that looked emptiest.
type planner struct {
	nodes []meta.Node
	now   time.Time
}

// place picks the node for sb (meta.Place, leaving out node exclude) and
// counts sb on it.
func (p *planner) place(sb meta.Sandbox, exclude string) (meta.Node, error) {
	to, err := meta.Place(p.nodes, exclude, sb.Template, p.now)
	if err != nil {
		return to, err
	}
	for i := range p.nodes {
		if p.nodes[i].ID == to.ID {
			p.nodes[i].Capacity.Sandboxes++
			p.nodes[i].Capacity.UsedMemoryBytes += sb.Limits.MemoryBytes
		}
	}
	return to, nil
}

// pushRow moves the row of sandbox id, which does not run, to node to:
// the stream leases first (fencing this node), then the row.
func (n *Node) pushRow(ctx context.Context, id, to string) error {
	from, holder := engine.LeaseHolder(n.id), engine.LeaseHolder(to)
	for _, stream := range []string{engine.Stream(id), gateway.Stream(id)} {
		if _, err := n.o.Leases.TakeOver(ctx, stream, from, holder, n.o.StreamLeaseTTL); err != nil {
			return fmt.Errorf("move the lease of %s to node %s: %w", stream, to, err)
		}
	}
	if _, err := n.o.Meta.MoveSandbox(ctx, id, n.id, to); err != nil {
		return err
	}
	n.lg.Info("sandbox that does not run moved off this draining node", "sandbox_id", id, "to", to)
	return nil
}

// pullMoves takes the sandboxes that draining nodes (or nodes that then
// stopped cleanly: left) stopped for a move to this node, and restores its
// own rows stopped for a move: those moving here (a retry of step 2c), and,
// while this node is live, those it stopped for a move to another node
// before it was undrained or restarted (nobody pulls from a live node).
// Up to Parallel at once.
func (n *Node) pullMoves(ctx context.Context) error {
	nodes, err := n.o.Meta.ListNodes(ctx)
	if err != nil {
		return err
	}
	type move struct{ id, from string }
	var moves []move
	now := n.o.Clock.Now()
	for _, d := range nodes {
		self := d.ID == n.id
		if !(self || d.State == meta.NodeLeft || d.State == meta.NodeDraining && d.Alive(now)) {
			continue
		}
		rows, err := n.o.Meta.List(ctx, meta.Filter{Node: &d.ID, States: []meta.State{meta.StateStopped}})
		if err != nil {
			return err
		}
		for _, sb := range rows {
			to, ok := engine.MovingTo(sb)
			if ok && (to == n.id || self && d.State == meta.NodeLive && d.Epoch == n.epoch.Load()) {
				moves = append(moves, move{sb.ID, d.ID})
			}
		}
	}
	sem := make(chan struct{}, n.o.Parallel)
	var wg sync.WaitGroup
	for _, m := range moves {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			start := time.Now()
			sb, err := n.MoveIn(ctx, m.id, m.from)
			lg := n.lg.With("sandbox_id", m.id, "from_node", m.from)
			switch {
			case errdefs.IsFenced(err):
				lg.Info("sandbox moving here was taken by another node", "err", err)
			case err != nil:
				n.warnEvery(m.id, lg, "sandbox moving here not restored; retried", "err", err)
			default:
				n.warned.Delete(m.id)
				lg.Info("sandbox moved here from a draining node", "generation", sb.Generation, "took", time.Since(start).Round(time.Millisecond))
			}
		}()
	}
	wg.Wait()
	return nil
}

// MoveIn makes this node the owner of sandbox id, stopped on node from for
// a move here, and restores it (step 2: the row, then the leases, then the
// restore). from == this node restores a row of its own stopped for a move
// (see pullMoves).
func (n *Node) MoveIn(ctx context.Context, id, from string) (meta.Sandbox, error) {
	if from == n.id {
		// The row must be this node's before its leases are taken from
		// whoever holds them (a target may have pulled it meanwhile).
		if sb, err := n.o.Meta.Get(ctx, id); err != nil || sb.Node != n.id {
			if err == nil {
				err = errdefs.Fencedf("sandbox %s moved to node %s", id, sb.Node)
			}
			return sb, err
		}
	} else {
		if sb, err := n.o.Meta.MoveSandbox(ctx, id, from, n.id); err != nil {
			return sb, err
		}
		if err := n.o.Failpoints.EvalFor("cluster.move-in.row", id); err != nil {
			return meta.Sandbox{}, err
		}
	}
	leases, err := n.takeStreams(ctx, id, from, true)
	if err != nil {
		return meta.Sandbox{}, err
	}
	return n.o.Engine.MoveIn(ctx, id, leases)
}

// takeStreams takes the leases of sandbox id's streams (its log and its
// effect journal) over from node from's holder, with the next epoch. For a
// sandbox stopped for a move (moving), whose row this node owns by a
// compare-and-set, the leases are taken from whoever holds them: the
// draining node, or a target that died between moving the row and taking
// the leases.
func (n *Node) takeStreams(ctx context.Context, id, from string, moving bool) (map[string]eventlog.Lease, error) {
	to := engine.LeaseHolder(n.id)
	out := map[string]eventlog.Lease{}
	for key, stream := range map[string]string{"sandbox": engine.Stream(id), "effects": gateway.Stream(id)} {
		l, err := n.o.Leases.TakeOver(ctx, stream, engine.LeaseHolder(from), to, n.o.StreamLeaseTTL)
		if errdefs.IsConflict(err) && moving {
			var cur eventlog.Lease
			if cur, err = n.o.Leases.CurrentLease(ctx, stream); err == nil {
				l, err = n.o.Leases.TakeOver(ctx, stream, cur.Holder, to, n.o.StreamLeaseTTL)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("take over the %s stream of %s: %w", key, id, err)
		}
		out[key] = l
	}
	return out, nil
}

// warnQuiet is how often warnEvery repeats a warning about one sandbox (a
// move retried at every tick that fails for the same reason).
const warnQuiet = 30 * time.Second

// warnEvery logs a warning about sandbox id at most every warnQuiet.
func (n *Node) warnEvery(id string, lg *slog.Logger, msg string, args ...any) {
	now := time.Now()
	if last, ok := n.warned.Load(id); ok && now.Sub(last.(time.Time)) < warnQuiet {
		return
	}
	n.warned.Store(id, now)
	lg.Warn(msg, args...)
}
