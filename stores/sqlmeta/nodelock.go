package sqlmeta

import (
	"context"
	"database/sql"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
)

// # A node's liveness lock (PostgreSQL only)
//
// A node's lease says it renewed recently; it cannot say that its process
// died a moment ago, so a node killed outright is noticed only when its
// lease runs out (cluster.DefaultTTL). On PostgreSQL a node also holds a
// session-level advisory lock keyed by its id, on a connection of its own,
// for as long as its process lives: when the process dies, its kernel
// closes that connection, the server ends the session and releases the
// lock. The other nodes read pg_locks (no lock taken, nothing to undo): a
// node whose lock nobody holds *and* that missed a heartbeat is gone, and
// may be claimed before its lease expires (ClaimLostNode).
//
// Either sign alone is not enough. A lock without heartbeats is a paused
// or partitioned process (its connection still open): the lease decides,
// as before. Heartbeats without a lock are a node whose lock connection
// broke (a database restart, a pooler that does not keep sessions): it
// re-takes the lock at its next heartbeat and is never claimed while it
// renews. Keys are 32-bit hashes of the schema and node id, so two ids may
// share one: a node then sees the other's lock as held and falls back to
// the lease — a collision can only delay a takeover, never cause one.

// nodeLockClass is the first key of every node lock ("ambr"); the second
// is nodeLockKey(s.db.scope, id).
const nodeLockClass = 0x616d6272

// nodeLockKey hashes node id within scope (the store's schema: two
// deployments in one database do not share keys).
func nodeLockKey(scope, id string) int32 {
	h := fnv.New32a()
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(id))
	return int32(h.Sum32())
}

// NodeLock is node id's liveness lock, held on a connection of its own
// (Store.NodeLock).
type NodeLock struct {
	s  *Store
	id string

	mu   sync.Mutex
	conn *sql.Conn // nil when not held
}

// NodeLock returns node id's liveness lock, not yet taken: Ensure takes it.
func (s *Store) NodeLock(id string) metadata.NodeLock { return &NodeLock{s: s, id: id} }

// Ensure takes the lock if this process does not hold it, and checks the
// connection that holds it otherwise (a broken one is dropped and the lock
// taken again). It reports whether the lock is held now; false with a nil
// error means the store cannot hold one (SQLite) or another session holds
// it (a previous run of this node whose connection the server has not
// closed yet, or a node whose id hashes to the same key): the caller
// retries at its next heartbeat and is meanwhile judged by its lease only.
func (l *NodeLock) Ensure(ctx context.Context) (bool, error) {
	if !l.s.db.pg {
		return false, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		if err := l.conn.PingContext(ctx); err == nil {
			return true, nil
		}
		l.conn.Close() // its session ended, and the lock with it
		l.conn = nil
	}
	conn, err := l.s.db.Conn(ctx)
	if err != nil {
		return false, fmt.Errorf("node %s liveness lock: %w", l.id, err)
	}
	var ok bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1, $2)`, int32(nodeLockClass), nodeLockKey(l.s.db.scope, l.id)).Scan(&ok); err != nil {
		conn.Close()
		return false, fmt.Errorf("node %s liveness lock: %w", l.id, err)
	}
	if !ok {
		conn.Close()
		return false, nil
	}
	l.conn = conn
	return true, nil
}

// Release gives the lock up (a clean stop) by closing its connection.
func (l *NodeLock) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		// Unlock first: a connection closed into a pool could be kept
		// with its session (and its lock) alive.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = l.conn.ExecContext(ctx, `SELECT pg_advisory_unlock($1, $2)`, int32(nodeLockClass), nodeLockKey(l.s.db.scope, l.id))
		l.conn.Close()
		l.conn = nil
	}
}

// NodeLockHeld reports whether some session holds node id's liveness
// lock. supported is false on SQLite (no such lock: the lease decides).
func (s *Store) NodeLockHeld(ctx context.Context, id string) (held, supported bool, err error) {
	if !s.db.pg {
		return false, false, nil
	}
	err = s.db.DB.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2 AND granted)`,
		uint32(nodeLockClass), uint32(nodeLockKey(s.db.scope, id))).Scan(&held)
	if err != nil {
		return false, true, fmt.Errorf("node %s liveness lock: %w", id, err)
	}
	return held, true, nil
}

// ClaimLostNode marks node id (at epoch) dead and claimed by by before its
// lease expired, provided its row still shows the heartbeat the caller saw
// (heartbeat): the caller found its liveness lock free after that
// heartbeat was due again (see above). A node that renewed meanwhile is
// not claimed. plan is recorded with the claim (ClaimDeadNode). Of several
// nodes claiming it, one wins (true).
func (s *Store) ClaimLostNode(ctx context.Context, id string, epoch uint64, heartbeat time.Time, by string, plan ...FailoverAssignment) (bool, error) {
	if !s.db.pg {
		return false, errdefs.FailedPreconditionf("claim node %s: a liveness lock needs PostgreSQL", id)
	}
	return s.claimNode(ctx, id, plan, `UPDATE nodes SET state = ?, taken_by = ?
		WHERE id = ? AND epoch = ? AND state IN ('live', 'draining') AND heartbeat_ns = ?`,
		string(NodeDead), by, id, int64(epoch), heartbeat.UnixNano())
}
