package sqlmeta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// sessionsSchema is the sessions table since schema version 4.
const sessionsSchema = `
CREATE TABLE IF NOT EXISTS sessions (
	id         TEXT PRIMARY KEY,
	tenant     TEXT NOT NULL,
	definition TEXT NOT NULL,
	status     TEXT NOT NULL,
	reason     TEXT NOT NULL DEFAULT '',
	sandbox_id TEXT NOT NULL DEFAULT '',
	created_ns INTEGER NOT NULL,
	updated_ns INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS sessions_tenant ON sessions(tenant, created_ns);
CREATE INDEX IF NOT EXISTS sessions_status ON sessions(status);
CREATE INDEX IF NOT EXISTS sessions_sandbox ON sessions(sandbox_id);`

const sessionCols = `id, tenant, definition, status, reason, sandbox_id, created_ns, updated_ns`

// InsertSession adds a session row; Created and Updated come from the clock.
func (s *Store) InsertSession(ctx context.Context, se Session) (Session, error) {
	if se.ID == "" || se.Tenant == "" || se.Status == "" {
		return se, errdefs.InvalidArgumentf("meta insert session: id, tenant and status are required")
	}
	now := s.clock.Now()
	se.Created, se.Updated = now, now
	_, err := s.db.ExecContext(ctx, `INSERT INTO sessions (`+sessionCols+`) VALUES (?,?,?,?,?,?,?,?)`,
		se.ID, se.Tenant, se.Definition, se.Status, se.Reason, se.SandboxID, now.UnixNano(), now.UnixNano())
	if err != nil {
		if isUnique(err) {
			return se, errdefs.AlreadyExistsf("session %s", se.ID)
		}
		return se, fmt.Errorf("meta insert session %s: %w", se.ID, err)
	}
	return se, nil
}

// GetSession returns session id (ErrNotFound if there is none).
func (s *Store) GetSession(ctx context.Context, id string) (Session, error) {
	se, err := scanSession(s.db.QueryRowContext(ctx, `SELECT `+sessionCols+` FROM sessions WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return se, errdefs.NotFoundf("session %s", id)
	}
	return se, err
}

// ListSessions returns tenant's sessions oldest first (every tenant's when
// tenant is ""), optionally only those in one of statuses.
func (s *Store) ListSessions(ctx context.Context, tenant string, statuses ...string) ([]Session, error) {
	if tenant == "" {
		return s.listSessions(ctx, nil, nil, statuses)
	}
	return s.listSessions(ctx, []string{"tenant = ?"}, []any{tenant}, statuses)
}

// SandboxSessions returns the sessions whose sandbox is sandboxID, those
// with one of statuses when any is given.
func (s *Store) SandboxSessions(ctx context.Context, sandboxID string, statuses ...string) ([]Session, error) {
	return s.listSessions(ctx, []string{"sandbox_id = ?"}, []any{sandboxID}, statuses)
}

func (s *Store) listSessions(ctx context.Context, where []string, args []any, statuses []string) ([]Session, error) {
	if len(statuses) > 0 {
		where = append(where, "status IN ("+strings.TrimSuffix(strings.Repeat("?,", len(statuses)), ",")+")")
		for _, st := range statuses {
			args = append(args, st)
		}
	}
	q := `SELECT ` + sessionCols + ` FROM sessions`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created_ns, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("meta list sessions: %w", err)
	}
	defer rows.Close()
	var out []Session
	for rows.Next() {
		se, err := scanSession(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, se)
	}
	return out, rows.Err()
}

// SetSessionStatus records the status the session's log reached.
func (s *Store) SetSessionStatus(ctx context.Context, id, status, reason string) error {
	return s.updateSession(ctx, id, `status = ?, reason = ?`, status, reason)
}

// SetSessionSandbox records the sandbox the session's log names.
func (s *Store) SetSessionSandbox(ctx context.Context, id, sandboxID string) error {
	return s.updateSession(ctx, id, `sandbox_id = ?`, sandboxID)
}

func (s *Store) updateSession(ctx context.Context, id, set string, args ...any) error {
	args = append(args, s.clock.Now().UnixNano(), id)
	res, err := s.db.ExecContext(ctx, `UPDATE sessions SET `+set+`, updated_ns = ? WHERE id = ?`, args...)
	if err != nil {
		return fmt.Errorf("meta update session %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFoundf("session %s", id)
	}
	return nil
}

func scanSession(r scanner) (Session, error) {
	var se Session
	var c, u int64
	err := r.Scan(&se.ID, &se.Tenant, &se.Definition, &se.Status, &se.Reason, &se.SandboxID, &c, &u)
	se.Created, se.Updated = time.Unix(0, c), time.Unix(0, u)
	return se, err
}
