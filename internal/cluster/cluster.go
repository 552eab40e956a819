// Package cluster runs a node of a deployment of many nodes on shared
// stores (PostgreSQL for the log, metadata and leases; S3 for checkpoints):
// it registers the node with a lease, renews it by heartbeats, notices
// nodes that died, claims one (exactly one live node wins each dead node)
// and spreads its sandboxes over the live nodes, each of which fences the
// streams of its share and restores them,
// tells the API where a sandbox runs (server.Router) and where a new one
// goes (server.Placer), and moves a draining node's sandboxes to the
// others (drain.go).
//
// # Order of a failover (node D died, this node is N)
//
//  1. D's lease expires (no heartbeat for TTL), or, on PostgreSQL, D's
//     process is gone: its liveness lock is free (its database session
//     ended with the process) and it missed a heartbeat (metadata.NodeLock).
//  2. N claims D: meta.ClaimDeadNode(D, D's epoch), or ClaimLostNode(D,
//     D's epoch, the heartbeat N saw) — a compare-and-set on D's row; of
//     every node scanning, one wins.
//  3. N spreads D's sandbox rows over the live nodes, itself included
//     (the placement of a drain: template held, fewest sandboxes, most
//     free memory, each assignment counted): the plan, made before the
//     claim and recorded in the claim's transaction. Each target T — N
//     for its own share — finds its assignments in its scan and, for
//     each, at most Parallel at once:
//  4. the leases of the sandbox's streams move from D to T with the next
//     epoch (TakeOver): from here on every write D could still make for
//     it (log appends, the append that commits a checkpoint, gateway
//     journal records) is refused as fenced;
//  5. engine.Adopt: the row moves to T (compare-and-set on its node), the
//     sandbox is recorded crashed and restored in place from its latest
//     committed checkpoint; T wakes its agent sessions.
//
// The plan says who tries first, not who wins: steps 4 and 5 have one
// winner whoever runs them. An assignment whose target is down is taken by
// the node that notices (meta.ReassignFailover), which also covers N dying
// right after its claim. A node that cannot make the plan (the metadata
// store failed) does not claim: it tries again at its next scan.
//
// A node that was declared dead but still runs (a partition, a paused
// process) finds its heartbeat refused (ErrFenced): it destroys its copies
// of sandboxes that run elsewhere now (engine.DiscardStale) and registers
// again with a new epoch. It also checks for stale copies at every
// heartbeat, which covers a restart that raced a takeover.
//
// May import: core, lib, internal/engine, internal/session, internal/state, internal/egress/gateway.
package cluster

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/session"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/lib/failpoint"
)

// LeaseTaker moves a stream's lease from a dead holder (stores/postgres).
type LeaseTaker interface {
	TakeOver(ctx context.Context, stream, from, to string, ttl time.Duration) (eventlog.Lease, error)
	// CurrentLease returns stream's lease (a move's leases are taken from
	// whoever holds them: drain.go).
	CurrentLease(ctx context.Context, stream string) (eventlog.Lease, error)
}

// Options configure Start.
type Options struct {
	Meta   metadata.Store
	Engine *engine.Engine
	Leases LeaseTaker
	// Addr is this node's API address as the other nodes reach it.
	Addr string
	// TTL is the node lease (default DefaultTTL): a node silent for this
	// long is dead to the others. Heartbeat is how often it is renewed
	// (default TTL/8: seven renewals may be late or lost before the
	// others act, and a node whose process died is noticed one overdue
	// heartbeat after its last, see lost); Scan how often the other nodes
	// are checked (default TTL/8, so that a dead node is noticed within
	// an eighth of the lease after it was judged dead; a scan every TTL/16
	// made TestE2ENodesDrainInterrupted fail every run, docs/reliability.md
	// defect 20).
	TTL, Heartbeat, Scan time.Duration
	// StreamLeaseTTL is the lease taken over on a dead node's sandbox
	// streams (default: the engine's, 30s; renewed at each checkpoint).
	StreamLeaseTTL time.Duration
	// Parallel is how many dead nodes' sandboxes this node restores at
	// once (default 4).
	Parallel int
	// Capacity reports the node's capacity at each heartbeat.
	Capacity func(ctx context.Context) meta.NodeCapacity
	Clock    clock.Clock
	Logger   *slog.Logger
	// Failpoints, for tests, names points of a move (drain.go):
	// cluster.move-out (a draining node committed a move's checkpoint),
	// cluster.move-in.row (a target moved the row to itself, before the
	// stream leases). Nil in production.
	Failpoints *failpoint.Set
}

// DefaultTTL is the node lease: with heartbeats every 500 ms, a node is
// declared dead 4 s after its last renewal, and noticed within 500 ms more
// (the scan); a node whose process died, 1–1.5 s after its last renewal
// (lost). A 2 s lease (what the ≤ 5 s failover target would need, the
// rest being restore time) declared a live node dead on this 2-core
// machine while it made four sandboxes at once (its heartbeats stalled past
// 2 s): a stall longer than the lease is a failover, so the default keeps
// a margin (docs/deploy.md, docs/benchmarks.md).
const DefaultTTL = 4 * time.Second

// Sessions wakes the agent sessions a takeover brought here
// (session.Manager).
type Sessions interface{ Adopt(id string) }

// Node is this daemon's membership. It is a server.Router.
type Node struct {
	o        Options
	id       string
	epoch    atomic.Uint64
	lg       *slog.Logger
	sessions atomic.Pointer[Sessions]
	lock     metadata.NodeLock
	locked   atomic.Bool // lock held at the last check
	// lockedSince is when this node last took its lock (Unix ns): it
	// judges others by theirs only once it has held its own for a while.
	lockedSince atomic.Int64
	restores    chan struct{} // a slot per failover restore running (Parallel)
	adopting    sync.Map      // sandbox id → time its takeover here started or may be retried
	// hadPending: the last scan found assignments not done (once none
	// are left, the plan's rows are dropped).
	hadPending atomic.Bool

	cancel context.CancelFunc
	wg     sync.WaitGroup
	warned sync.Map // sandbox id → when a move of it was last warned about (drain.go)
}

// Join registers this node (the engine's node id) and returns; Run starts
// the heartbeats and the failover scans. A node registered under the same
// id before (this node's previous run) is replaced with the next epoch
// once its lease has expired (Join waits up to twice the lease for that;
// a second daemon with a live node's id is refused).
func Join(ctx context.Context, o Options) (*Node, error) {
	if o.Meta == nil || o.Engine == nil || o.Leases == nil {
		return nil, errdefs.InvalidArgumentf("cluster: meta, engine and leases are required")
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = o.TTL / 8
	}
	if o.Heartbeat >= o.TTL {
		return nil, errdefs.InvalidArgumentf("cluster: heartbeat %s must be shorter than the node lease %s", o.Heartbeat, o.TTL)
	}
	if o.Scan <= 0 {
		o.Scan = o.TTL / 8
	}
	if o.StreamLeaseTTL <= 0 {
		o.StreamLeaseTTL = 30 * time.Second
	}
	if o.Parallel <= 0 {
		o.Parallel = 4
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Capacity == nil {
		o.Capacity = func(context.Context) meta.NodeCapacity { return meta.NodeCapacity{} }
	}
	n := &Node{o: o, id: o.Engine.NodeID(), lg: o.Logger, restores: make(chan struct{}, o.Parallel)}
	// The liveness lock before the row: from the moment the row is live,
	// the others can tell a dead process from a slow one.
	n.lock = o.Meta.NodeLock(n.id)
	n.ensureLock(ctx)
	// A node restarted within its lease finds its previous run's lease
	// still live: it waits for it to expire (the other nodes may take its
	// sandboxes over meanwhile, as for any dead node) rather than share
	// the id with a daemon that may still run.
	deadline := time.Now().Add(2 * o.TTL)
	for {
		err := n.register(ctx)
		if err == nil {
			return n, nil
		}
		if !errdefs.IsConflict(err) || time.Now().After(deadline) {
			return nil, err
		}
		n.lg.Warn("waiting for this node's previous lease to expire", "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(o.Heartbeat):
		}
	}
}

// ensureLock takes or checks this node's liveness lock and logs when that
// changes (without it the others judge this node by its lease only).
func (n *Node) ensureLock(ctx context.Context) {
	held, err := n.lock.Ensure(ctx)
	was := n.locked.Swap(held)
	if held && !was {
		n.lockedSince.Store(n.o.Clock.Now().UnixNano())
	}
	if was != held || err != nil {
		switch {
		case held:
			n.lg.Info("node liveness lock held", "node", n.id)
		case err != nil:
			n.lg.Warn("node liveness lock not held; the other nodes will wait for this node's lease to expire if it dies", "node", n.id, "err", err)
		case was:
			n.lg.Warn("node liveness lock lost (its database session ended); taking it again at the next heartbeat", "node", n.id)
		}
	}
}

func (n *Node) register(ctx context.Context) error {
	row, err := n.o.Meta.RegisterNode(ctx, meta.Node{ID: n.id, Addr: n.o.Addr, Capacity: n.o.Capacity(ctx)}, n.o.TTL)
	if err != nil {
		return fmt.Errorf("register node %s: %w", n.id, err)
	}
	n.epoch.Store(row.Epoch)
	n.lg.Info("node registered", "node", n.id, "epoch", row.Epoch, "addr", n.o.Addr, "ttl", n.o.TTL)
	return nil
}

// SetSessions makes takeovers wake the dead node's agent sessions here
// (set once the session manager exists; a takeover before that leaves them
// to the manager's Start, which wakes the sessions whose sandbox is here).
func (n *Node) SetSessions(s Sessions) { n.sessions.Store(&s) }

// Self implements server.Router.
func (n *Node) Self() string { return n.id }

// Epoch is this node's current registration epoch.
func (n *Node) Epoch() uint64 { return n.epoch.Load() }

// Owner implements server.Router. A session (ses-…) runs on the node of
// its sandbox (one without a sandbox yet is answered here); a checkpoint
// (ckpt-…) is restored on the node of the sandbox it was cut from (a
// destroyed one's, or an unknown one's: here).
func (n *Node) Owner(ctx context.Context, id string) (string, error) {
	switch {
	case strings.HasPrefix(id, "ses-"):
		se, err := n.o.Meta.GetSession(ctx, id)
		if err != nil || se.SandboxID == "" {
			return "", nil
		}
		id = se.SandboxID
	case strings.HasPrefix(id, "ckpt-"):
		ck, err := n.o.Meta.Checkpoint(ctx, id)
		if err != nil {
			return "", nil
		}
		id = ck.SandboxID
	}
	sb, err := n.o.Meta.Get(ctx, id)
	if err != nil || sb.Node == "" || sb.Node == n.id || sb.State == meta.StateDestroyed {
		return "", nil // answered here (a missing sandbox is this node's 404)
	}
	node, err := n.o.Meta.GetNode(ctx, sb.Node)
	if err != nil {
		return "", nil
	}
	if !node.Alive(n.o.Clock.Now()) {
		return "", errdefs.Unavailablef("sandbox %s: its node %s is down; it is being restored on another node, retry", id, sb.Node)
	}
	return node.Addr, nil
}

// Run starts the heartbeat, scan and drain loops (drain.go); Close stops
// them.
func (n *Node) Run(ctx context.Context) {
	ctx, n.cancel = context.WithCancel(context.WithoutCancel(ctx))
	n.wg.Add(3)
	go func() {
		defer n.wg.Done()
		n.heartbeatLoop(ctx)
	}()
	go func() {
		defer n.wg.Done()
		n.drainLoop(ctx)
	}()
	go func() {
		defer n.wg.Done()
		n.scanLoop(ctx)
	}()
}

// Close stops the loops and, when leave is true (a clean stop), marks the
// node left: its sandboxes keep running and are not taken over; the next
// start of this node reattaches them.
func (n *Node) Close(ctx context.Context, leave bool) {
	if n.cancel != nil {
		n.cancel()
	}
	n.wg.Wait()
	if leave {
		if err := n.o.Meta.SetNodeState(ctx, n.id, n.epoch.Load(), meta.NodeLeft); err != nil {
			n.lg.Warn("mark node left", "err", err)
		}
	}
	// After the row: a node that stops cleanly is left first, so that its
	// free lock never reads as a dead process.
	n.lock.Release()
}

// every calls fn every d until ctx ends.
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}

func (n *Node) heartbeatLoop(ctx context.Context) { every(ctx, n.o.Heartbeat, func() { n.beat(ctx) }) }

// beat renews the node's lease: the capacity (a read of the metadata) and
// one UPDATE, never a driver call, so that a slow driver never delays it. Refused (ErrFenced): the node was declared dead
// while it could not renew; its stale copies go, then it registers anew.
func (n *Node) beat(ctx context.Context) {
	hctx, cancel := context.WithTimeout(ctx, n.o.TTL)
	defer cancel()
	n.ensureLock(hctx)
	err := n.o.Meta.HeartbeatNode(hctx, n.id, n.epoch.Load(), n.o.TTL, n.o.Capacity(hctx))
	switch {
	case err == nil:
	case errdefs.IsFenced(err):
		n.lg.Warn("this node was declared dead while it could not renew its lease; discarding the sandboxes that run elsewhere now", "err", err)
		if k, err := n.o.Engine.DiscardStale(ctx); err != nil {
			n.lg.Error("discard stale copies", "err", err)
			return // registering again would let them run on
		} else if k > 0 {
			n.lg.Warn("stale copies discarded", "count", k)
		}
		if err := n.register(ctx); err != nil {
			n.lg.Error("register again", "err", err)
		}
		return
	default:
		if ctx.Err() == nil {
			n.lg.Warn("node heartbeat failed", "err", err)
		}
	}
}

func (n *Node) scanLoop(ctx context.Context) {
	var lastStale time.Time
	every(ctx, n.o.Scan, func() {
		if err := n.scan(ctx); err != nil && ctx.Err() == nil {
			n.lg.Warn("scan nodes", "err", err)
		}
		if err := n.takeAssigned(ctx); err != nil && ctx.Err() == nil {
			n.lg.Warn("take over the sandboxes assigned here", "err", err)
		}
		// A restart that raced a takeover may have reattached a
		// sandbox that runs elsewhere now (a rare race: checked at most
		// once a second, not at every scan, since it reads every row
		// the driver runs).
		if now := time.Now(); now.Sub(lastStale) >= staleCheckEvery {
			lastStale = now
			if _, err := n.o.Engine.DiscardStale(ctx); err != nil && ctx.Err() == nil {
				n.lg.Warn("check for stale copies", "err", err)
			}
		}
	})
}

// scan claims every node whose lease expired, or whose process is gone
// (lost), and takes its sandboxes over.
func (n *Node) scan(ctx context.Context) error {
	nodes, err := n.o.Meta.ListNodes(ctx)
	if err != nil {
		return err
	}
	now := n.o.Clock.Now()
	for _, d := range nodes {
		if d.ID == n.id || (d.State != meta.NodeLive && d.State != meta.NodeDraining) {
			continue
		}
		lost := d.Alive(now) && n.lost(ctx, d, now)
		if d.Alive(now) && !lost {
			continue
		}
		// The plan is made before the claim and recorded with it (one
		// transaction): a claimer that dies right after leaves a plan
		// whose assignments the others take over (takeAssigned).
		plan, per, err := n.planFailover(ctx, d.ID)
		if err != nil {
			return fmt.Errorf("plan the failover of node %s: %w", d.ID, err)
		}
		var won bool
		why := "node lease expired"
		if lost {
			why = "node process gone (its liveness lock is free and it missed a heartbeat)"
			won, err = n.o.Meta.ClaimLostNode(ctx, d.ID, d.Epoch, d.Heartbeat, n.id, plan...)
		} else {
			won, err = n.o.Meta.ClaimDeadNode(ctx, d.ID, d.Epoch, n.id, plan...)
		}
		if err != nil {
			return err
		}
		if !won {
			continue
		}
		n.lg.Warn(why+"; taking its sandboxes over", "dead_node", d.ID, "epoch", d.Epoch,
			"silent_for", now.Sub(d.Heartbeat).Round(time.Millisecond))
		n.lg.Info("the dead node's sandboxes spread over the live nodes", "dead_node", d.ID, "sandboxes", len(plan), "per_node", fmt.Sprint(per))
	}
	return nil
}

// planFailover spreads the sandboxes of node dead over the live nodes
// (step 3 of the package comment): each target, this node included, takes
// its share over in its scan (takeAssigned). A sandbox no node has room
// for stays with this node. per counts the sandboxes per target.
func (n *Node) planFailover(ctx context.Context, dead string) (plan []meta.FailoverAssignment, per map[string]int, err error) {
	rows, err := n.o.Meta.List(ctx, meta.Filter{Node: &dead, States: failoverStates})
	if err != nil {
		return nil, nil, err
	}
	nodes, err := n.o.Meta.ListNodes(ctx)
	if err != nil {
		return nil, nil, err
	}
	pl := planner{nodes: nodes, now: n.o.Clock.Now()}
	per = map[string]int{}
	for _, sb := range rows {
		to := n.id
		if t, err := pl.place(sb, dead); err == nil {
			to = t.ID
		}
		plan = append(plan, meta.FailoverAssignment{SandboxID: sb.ID, DeadNode: dead, Target: to})
		per[to]++
	}
	return plan, per, nil
}

// failoverStates are the states of a dead node's rows that are taken over.
var failoverStates = []meta.State{meta.StateCreating, meta.StateRestoring, meta.StateRunning, meta.StateStopped, meta.StateCrashed}

// takeAssigned takes over the dead nodes' sandboxes assigned to this node
// (steps 4 and 5), at most Parallel at once across every dead node, each
// in the background; and takes for itself the assignments of targets that
// are down. A takeover that failed short of moving the row is retried
// after a pause. Assignments already done are dropped.
func (n *Node) takeAssigned(ctx context.Context) error {
	pending, err := n.o.Meta.PendingFailovers(ctx)
	if err != nil {
		return err
	}
	if len(pending) == 0 {
		if n.hadPending.Swap(false) {
			return n.o.Meta.DropDoneFailovers(ctx)
		}
		return nil
	}
	n.hadPending.Store(true)
	nodes, err := n.o.Meta.ListNodes(ctx)
	if err != nil {
		return err
	}
	now := n.o.Clock.Now()
	up := map[string]bool{}
	for _, nd := range nodes {
		up[nd.ID] = nd.Alive(now)
	}
	for _, a := range pending {
		if a.Target != n.id {
			if up[a.Target] {
				continue // its target's
			}
			won, err := n.o.Meta.ReassignFailover(ctx, a, n.id)
			if err != nil || !won {
				continue
			}
			n.lg.Warn("the node a dead node's sandbox was assigned to is down; taking it over here", "sandbox_id", a.SandboxID,
				"dead_node", a.DeadNode, "was", a.Target)
		}
		if v, ok := n.adopting.Load(a.SandboxID); ok && now.Before(v.(time.Time)) {
			continue // running, or failed and waiting for its retry
		}
		n.adopting.Store(a.SandboxID, now.Add(24*time.Hour))
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			select {
			case n.restores <- struct{}{}:
			case <-ctx.Done():
				n.adopting.Delete(a.SandboxID)
				return
			}
			defer func() { <-n.restores }()
			ad, err := n.TakeOverSandbox(ctx, a.SandboxID, a.DeadNode)
			if err != nil {
				n.lg.Warn("sandbox not taken over; retrying", "sandbox_id", a.SandboxID, "dead_node", a.DeadNode, "err", err)
				n.adopting.Store(a.SandboxID, n.o.Clock.Now().Add(failoverRetry))
				return
			}
			n.adopting.Delete(a.SandboxID)
			n.takeOverSessions(ctx, a.DeadNode, ad.Sandbox)
		}()
	}
	return nil
}

// lostMargin is how late a heartbeat may be before a node whose liveness
// lock is free is judged gone: the time a live node whose lock connection
// broke has to take the lock again at a late heartbeat. With the default
// heartbeat (500 ms) a dead process is judged gone 1 s after its last
// renewal and claimed at the next scan (≤ 500 ms); it was 1.5–2 s with a
// heartbeat of twice that.
const lostMargin = 500 * time.Millisecond

// staleCheckEvery is how often the scan loop looks for stale copies.
const staleCheckEvery = time.Second

// failoverRetry is the pause before a failed takeover of an assigned
// sandbox is tried again.
const failoverRetry = 5 * time.Second

// lost reports whether live node d's process is gone before its lease
// expired: a heartbeat is overdue (none for a heartbeat interval plus
// lostMargin) and nobody holds its liveness lock (metadata.NodeLock: only
// the process holds it, and its death ends the database session that did).
//
// Only a node that has held its own lock for two heartbeats, and at least
// half the lease, judges: after the database restarted (every
// session, hence every lock, gone at once, and heartbeats missed
// meanwhile) each node takes its lock again at its next heartbeat, and
// none is claimed for a lock it had no time to take.
func (n *Node) lost(ctx context.Context, d meta.Node, now time.Time) bool {
	if now.Sub(d.Heartbeat) <= n.o.Heartbeat+lostMargin {
		return false
	}
	if !n.locked.Load() || now.Sub(time.Unix(0, n.lockedSince.Load())) < max(2*n.o.Heartbeat, n.o.TTL/2) {
		return false
	}
	held, supported, err := n.o.Meta.NodeLockHeld(ctx, d.ID)
	if err != nil {
		n.lg.Warn("read a node's liveness lock", "node", d.ID, "err", err)
		return false
	}
	return supported && !held
}

// takeOverSessions moves the agent sessions of sandbox sb, which this node
// adopted from node dead: a session runs where its sandbox runs. For each
// session of sb not terminated, in order: the lease of its stream moves
// from the dead node to this one with the next epoch (from then on the dead
// node's harness cannot append to it), then the session is woken here and
// goes on where its log says (a step the dead node had begun is re-issued
// as after a crash).
func (n *Node) takeOverSessions(ctx context.Context, dead string, sb meta.Sandbox) {
	if sb.ID == "" || sb.Node != n.id {
		return
	}
	ss, err := n.o.Meta.SandboxSessions(ctx, sb.ID, string(session.StatusRunning), string(session.StatusRecovering),
		string(session.StatusIdle), string(session.StatusWaiting))
	if err != nil {
		n.lg.Error("list the sessions of an adopted sandbox", "sandbox_id", sb.ID, "dead_node", dead, "err", err)
		return
	}
	sp := n.sessions.Load()
	for _, se := range ss {
		// A lease the dead node had released (an idle session) or that
		// another node holds is left alone: the wake acquires or waits.
		if _, err := n.o.Leases.TakeOver(ctx, session.Stream(se.ID), engine.LeaseHolder(dead), engine.LeaseHolder(n.id), n.o.StreamLeaseTTL); err != nil && !errdefs.IsConflict(err) {
			n.lg.Warn("session lease not taken over", "session", se.ID, "dead_node", dead, "err", err)
		}
		if sp != nil {
			(*sp).Adopt(se.ID)
		}
	}
}

// TakeOverSandbox fences sandbox id's streams away from node dead and
// adopts it (see the package comment). Exactly one of several nodes
// taking over the same sandbox succeeds; the others get ErrFenced or
// ErrConflict and change nothing.
func (n *Node) TakeOverSandbox(ctx context.Context, id, dead string) (engine.Adopted, error) {
	// A sandbox stopped for a move whose row the dead node (its target)
	// had moved to itself may still have its leases on the draining node
	// (drain.go): taken from whoever holds them.
	sb, err := n.o.Meta.Get(ctx, id)
	_, moving := engine.MovingTo(sb)
	leases, err := n.takeStreams(ctx, id, dead, err == nil && moving && sb.Node == dead)
	if err != nil {
		return engine.Adopted{}, err
	}
	return n.o.Engine.Adopt(ctx, id, dead, leases)
}

// HostMemory returns the machine's memory (MemTotal), 0 if unknown.
func HostMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Place implements server.Placer: "" when this node takes a new sandbox of
// template itself (it is live, not draining, and has room by its capacity
// now), else the API address of the node that should (meta.Place over the
// others' last heartbeats). With no node that has room it fails naming
// every node and why.
func (n *Node) Place(ctx context.Context, template string) (string, error) {
	nodes, err := n.o.Meta.ListNodes(ctx)
	if err != nil {
		return "", fmt.Errorf("place a new sandbox: %w", err)
	}
	self := meta.Node{ID: n.id, State: meta.NodeLive}
	for _, nd := range nodes {
		if nd.ID == n.id {
			self = nd
		}
	}
	c := n.o.Capacity(ctx)
	if self.State == meta.NodeLive && c.HasRoom() {
		return "", nil
	}
	why := "draining"
	if self.State == meta.NodeLive {
		why = c.Full()
	}
	to, err := meta.Place(nodes, n.id, template, n.o.Clock.Now())
	if err != nil {
		return "", fmt.Errorf("this node (%s) is %s and %w", n.id, why, err)
	}
	n.lg.Info("new sandbox placed on another node", "template", template, "node", to.ID, "because", "this node is "+why)
	return to.Addr, nil
}
