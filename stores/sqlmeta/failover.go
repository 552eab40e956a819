package sqlmeta

import (
	"context"
	"fmt"
)

// Failover plans: the node that claims a dead node (ClaimDeadNode or
// ClaimLostNode) spreads the dead node's sandboxes over the live nodes
// (Place, counting each assignment) rather than restoring them all
// itself, and records the plan in the claim's transaction. An assignment
// is a row here; the target finds it in its scan and takes the sandbox
// over exactly as the claimer would (its streams' leases, then the row's
// compare-and-set from the dead node). The plan
// only says who should try first: the takeover itself stays one winner
// by the leases and the row, so a stale, lost or duplicated assignment can
// delay a restore but never run a sandbox twice. An assignment whose
// target died is taken by whoever notices (ReassignFailover); one whose
// sandbox left the dead node is done and dropped (DropDoneFailovers).
const failoverSchema = `
CREATE TABLE IF NOT EXISTS failover_plan (
	sandbox_id TEXT PRIMARY KEY,
	dead_node  TEXT NOT NULL,
	target     TEXT NOT NULL,
	planned_ns INTEGER NOT NULL
) STRICT;`

// planFailover records plan in transaction t (ClaimDeadNode,
// ClaimLostNode): one row per sandbox, a sandbox planned before re-planned.
func planFailover(ctx context.Context, t *tx, now int64, plan []FailoverAssignment) error {
	for _, a := range plan {
		if _, err := t.ExecContext(ctx, `INSERT INTO failover_plan (sandbox_id, dead_node, target, planned_ns) VALUES (?,?,?,?)
			ON CONFLICT(sandbox_id) DO UPDATE SET dead_node = excluded.dead_node, target = excluded.target, planned_ns = excluded.planned_ns`,
			a.SandboxID, a.DeadNode, a.Target, now); err != nil {
			return fmt.Errorf("plan the failover of %s to %s: %w", a.SandboxID, a.Target, err)
		}
	}
	return nil
}

// PendingFailovers returns the assignments whose sandbox is still on its
// dead node (not taken over yet, not destroyed), by sandbox id.
func (s *Store) PendingFailovers(ctx context.Context) ([]FailoverAssignment, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT f.sandbox_id, f.dead_node, f.target FROM failover_plan f
		JOIN sandboxes sb ON sb.id = f.sandbox_id AND sb.node = f.dead_node AND sb.state != 'destroyed' ORDER BY f.sandbox_id`)
	if err != nil {
		return nil, fmt.Errorf("list failover assignments: %w", err)
	}
	defer rows.Close()
	var out []FailoverAssignment
	for rows.Next() {
		var a FailoverAssignment
		if err := rows.Scan(&a.SandboxID, &a.DeadNode, &a.Target); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// ReassignFailover moves assignment a to target to, provided it is still
// a's (compare-and-set on its target): of several nodes that found a's
// target down, one wins (true).
func (s *Store) ReassignFailover(ctx context.Context, a FailoverAssignment, to string) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE failover_plan SET target = ?, planned_ns = ? WHERE sandbox_id = ? AND target = ?`,
		to, s.clock.Now().UnixNano(), a.SandboxID, a.Target)
	if err != nil {
		return false, fmt.Errorf("reassign the failover of %s: %w", a.SandboxID, err)
	}
	k, _ := res.RowsAffected()
	return k == 1, nil
}

// DropDoneFailovers deletes the assignments whose sandbox is no longer on
// its dead node (taken over, by its target or anyone) or is gone.
func (s *Store) DropDoneFailovers(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM failover_plan WHERE NOT EXISTS
		(SELECT 1 FROM sandboxes sb WHERE sb.id = failover_plan.sandbox_id AND sb.node = failover_plan.dead_node
		  AND sb.state != 'destroyed')`)
	if err != nil {
		return fmt.Errorf("drop finished failover assignments: %w", err)
	}
	return nil
}
