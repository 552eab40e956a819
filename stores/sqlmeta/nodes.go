package sqlmeta

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// Nodes: every daemon of a deployment on shared stores registers a row with
// a lease (expires_ns) that its heartbeat renews, and an epoch that counts
// its registrations. A node whose lease expired is dead to the others: one
// of them claims it (ClaimDeadNode: exactly one claim succeeds), takes over
// its sandboxes' streams (the event log's lease epochs fence the dead
// node's writes) and moves their rows to itself (MoveSandbox). A dead node
// that comes back finds its heartbeat refused (ErrFenced) and registers
// again with a new epoch, after discarding the sandboxes that are no longer
// its own.
//
// Times are Unix nanoseconds from the Store's clock (never the server's).
const nodesSchema = `
CREATE TABLE IF NOT EXISTS nodes (
	id           TEXT PRIMARY KEY,
	addr         TEXT NOT NULL,
	epoch        INTEGER NOT NULL,
	state        TEXT NOT NULL,
	capacity     TEXT NOT NULL,
	started_ns   INTEGER NOT NULL,
	heartbeat_ns INTEGER NOT NULL,
	expires_ns   INTEGER NOT NULL,
	taken_by     TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE TABLE IF NOT EXISTS node_cordons (
	id       TEXT PRIMARY KEY,
	since_ns INTEGER NOT NULL
) STRICT;`

// A drained node stays drained: a node marked draining is also cordoned
// (node_cordons), and a cordoned node registers draining when it starts
// again — after a clean stop (left), a crash or a takeover — until it is
// undrained (SetNodeState live). An operator drains a node to take it out
// of service; a restart must not put it back.

const nodeCols = `id, addr, epoch, state, capacity, started_ns, heartbeat_ns, expires_ns, taken_by`

// RegisterNode records that node n runs from now with a lease of ttl, one
// epoch above its previous registration (1 for a new node). A node that
// is still live cannot register twice: while its lease runs the call fails
// with ErrConflict (two daemons with the same --node-id).
func (s *Store) RegisterNode(ctx context.Context, n Node, ttl time.Duration) (Node, error) {
	if n.ID == "" || ttl <= 0 {
		return n, errdefs.InvalidArgumentf("register node: id and a positive ttl are required")
	}
	now := s.clock.Now()
	capb, _ := json.Marshal(n.Capacity)
	// Live, or draining when the node is cordoned (above).
	res, err := s.db.ExecContext(ctx, `INSERT INTO nodes (`+nodeCols+`) VALUES (?,?,1,
		  CASE WHEN EXISTS (SELECT 1 FROM node_cordons WHERE id = ?) THEN ? ELSE ? END, ?,?,?,?,'')
		ON CONFLICT(id) DO UPDATE SET addr = excluded.addr, epoch = nodes.epoch + 1, state = excluded.state,
		  capacity = excluded.capacity, started_ns = excluded.started_ns, heartbeat_ns = excluded.heartbeat_ns,
		  expires_ns = excluded.expires_ns, taken_by = ''
		WHERE nodes.state NOT IN ('live', 'draining') OR nodes.expires_ns <= ?`,
		n.ID, n.Addr, n.ID, string(NodeDraining), string(NodeLive), string(capb), now.UnixNano(), now.UnixNano(), now.Add(ttl).UnixNano(), now.UnixNano())
	if err != nil {
		return n, fmt.Errorf("register node %s: %w", n.ID, err)
	}
	if k, _ := res.RowsAffected(); k == 0 {
		cur, _ := s.GetNode(ctx, n.ID)
		return cur, errdefs.Conflictf("node %s is registered and live until %s (another daemon with the same node id?)", n.ID, cur.Expires.Format(time.RFC3339))
	}
	return s.GetNode(ctx, n.ID)
}

// HeartbeatNode renews node id's lease at epoch to now+ttl and records its
// capacity. It fails with ErrFenced when the row is no longer at epoch or
// no longer live (another node claimed it as dead): the caller must stop
// acting for its sandboxes.
func (s *Store) HeartbeatNode(ctx context.Context, id string, epoch uint64, ttl time.Duration, c NodeCapacity) error {
	now := s.clock.Now()
	capb, _ := json.Marshal(c)
	res, err := s.db.ExecContext(ctx, `UPDATE nodes SET heartbeat_ns = ?, expires_ns = ?, capacity = ?
		WHERE id = ? AND epoch = ? AND state IN ('live', 'draining')`,
		now.UnixNano(), now.Add(ttl).UnixNano(), string(capb), id, int64(epoch))
	if err != nil {
		return fmt.Errorf("heartbeat of node %s: %w", id, err)
	}
	if k, _ := res.RowsAffected(); k == 0 {
		cur, _ := s.GetNode(ctx, id)
		return errdefs.Fencedf("node %s epoch %d: the row is now epoch %d, %s (taken by %q)", id, epoch, cur.Epoch, cur.State, cur.TakenBy)
	}
	return nil
}

// SetNodeState moves node id at epoch to state (draining, live, or left
// when it stops cleanly). Draining cordons the node and live uncordons it
// (above), in the same transaction.
func (s *Store) SetNodeState(ctx context.Context, id string, epoch uint64, state NodeState) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("node %s: %w", id, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `UPDATE nodes SET state = ? WHERE id = ? AND epoch = ? AND state IN ('live', 'draining')`,
		string(state), id, int64(epoch))
	if err != nil {
		return fmt.Errorf("node %s: %w", id, err)
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return errdefs.Fencedf("node %s epoch %d is no longer live", id, epoch)
	}
	switch state {
	case NodeDraining:
		_, err = tx.ExecContext(ctx, `INSERT INTO node_cordons (id, since_ns) VALUES (?, ?) ON CONFLICT(id) DO NOTHING`, id, s.clock.Now().UnixNano())
	case NodeLive:
		_, err = tx.ExecContext(ctx, `DELETE FROM node_cordons WHERE id = ?`, id)
	}
	if err != nil {
		return fmt.Errorf("node %s: cordon: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("node %s: %w", id, err)
	}
	return nil
}

// ClaimDeadNode marks node id (at epoch) dead and claimed by by, provided
// its lease expired before now, and records plan (the spread of its
// sandboxes: failover.go) in the same transaction, so that a claimer that
// dies right after its claim leaves a plan the others can finish. Of
// several nodes claiming the same dead node, exactly one gets true.
func (s *Store) ClaimDeadNode(ctx context.Context, id string, epoch uint64, by string, plan ...FailoverAssignment) (bool, error) {
	return s.claimNode(ctx, id, plan, `UPDATE nodes SET state = ?, taken_by = ?
		WHERE id = ? AND epoch = ? AND state IN ('live', 'draining') AND expires_ns <= ?`,
		string(NodeDead), by, id, int64(epoch), s.clock.Now().UnixNano())
}

// claimNode runs claim (an UPDATE of node id's row) and, when it claimed
// the row, records plan, in one transaction.
func (s *Store) claimNode(ctx context.Context, id string, plan []FailoverAssignment, claim string, args ...any) (bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("claim node %s: %w", id, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, claim, args...)
	if err != nil {
		return false, fmt.Errorf("claim node %s: %w", id, err)
	}
	if k, _ := res.RowsAffected(); k != 1 {
		return false, nil
	}
	if err := planFailover(ctx, tx, s.clock.Now().UnixNano(), plan); err != nil {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("claim node %s: %w", id, err)
	}
	return true, nil
}

// GetNode returns node id's row.
func (s *Store) GetNode(ctx context.Context, id string) (Node, error) {
	n, err := scanNode(s.db.QueryRowContext(ctx, `SELECT `+nodeCols+` FROM nodes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return n, errdefs.NotFoundf("node %s", id)
	}
	return n, err
}

// ListNodes returns every node row, by id.
func (s *Store) ListNodes(ctx context.Context) ([]Node, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+nodeCols+` FROM nodes ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	defer rows.Close()
	var out []Node
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

func scanNode(r scanner) (Node, error) {
	var n Node
	var capb, state string
	var epoch, started, hb, exp int64
	if err := r.Scan(&n.ID, &n.Addr, &epoch, &state, &capb, &started, &hb, &exp, &n.TakenBy); err != nil {
		return n, err
	}
	if err := json.Unmarshal([]byte(capb), &n.Capacity); err != nil {
		return n, errdefs.DataLossf("node %s has undecodable capacity: %v", n.ID, err)
	}
	n.Epoch, n.State = uint64(epoch), NodeState(state)
	n.Started, n.Heartbeat, n.Expires = time.Unix(0, started).UTC(), time.Unix(0, hb).UTC(), time.Unix(0, exp).UTC()
	return n, nil
}

// MoveSandbox moves sandbox id from node from to node to; it fails with
// ErrFenced when the row is no longer on from (another node moved it
// first).
func (s *Store) MoveSandbox(ctx context.Context, id, from, to string) (Sandbox, error) {
	sb, err := s.update(ctx, id, "move to node "+to, `UPDATE sandboxes SET node = ?, updated_ns = ? WHERE id = ? AND node = ?`,
		to, s.clock.Now().UnixNano(), id, from)
	if errors.Is(err, errdefs.ErrFailedPrecondition) {
		return sb, errdefs.Fencedf("move sandbox %s from node %s: it is on node %q now", id, from, sb.Node)
	}
	return sb, err
}
