package sqlmeta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

const idempotencySchema = `
CREATE TABLE IF NOT EXISTS idempotency (
	tenant       TEXT NOT NULL,
	key          TEXT NOT NULL,
	request_hash TEXT NOT NULL,
	done         INTEGER NOT NULL,
	status       INTEGER NOT NULL,
	content_type TEXT NOT NULL,
	body         BLOB NOT NULL,
	created_ns   INTEGER NOT NULL,
	PRIMARY KEY (tenant, key)
) STRICT;`

// BeginIdempotent claims (tenant, key) for a call with requestHash. It
// returns claimed true when this call is the first (or the first one's claim
// is older than stale: it died before answering) and must run; otherwise the
// recorded entry (Done, or still running).
func (s *Store) BeginIdempotent(ctx context.Context, tenant, key, requestHash string, stale time.Duration) (Idempotent, bool, error) {
	now := s.clock.Now()
	res, err := s.db.ExecContext(ctx, `INSERT INTO idempotency (tenant, key, request_hash, done, status, content_type, body, created_ns)
		VALUES (?,?,?,0,0,'',?,?)
		ON CONFLICT(tenant, key) DO UPDATE SET request_hash = excluded.request_hash, created_ns = excluded.created_ns
		WHERE idempotency.done = 0 AND idempotency.created_ns < ?`,
		tenant, key, requestHash, []byte{}, now.UnixNano(), now.Add(-stale).UnixNano())
	if err != nil {
		return Idempotent{}, false, fmt.Errorf("idempotency key: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return Idempotent{Tenant: tenant, Key: key, RequestHash: requestHash, Created: now}, true, nil
	}
	var e Idempotent
	var created int64
	err = s.db.QueryRowContext(ctx, `SELECT request_hash, done, status, content_type, body, created_ns FROM idempotency WHERE tenant = ? AND key = ?`,
		tenant, key).Scan(&e.RequestHash, &e.Done, &e.Status, &e.ContentType, &e.Body, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return e, false, errdefs.Unavailablef("idempotency key %q changed while read; retry", key)
	}
	if err != nil {
		return e, false, fmt.Errorf("idempotency key: %w", err)
	}
	e.Tenant, e.Key, e.Created = tenant, key, time.Unix(0, created).UTC()
	return e, false, nil
}

// FinishIdempotent records the answer of the call that claimed (tenant, key).
func (s *Store) FinishIdempotent(ctx context.Context, tenant, key string, status int, contentType string, body []byte) error {
	_, err := s.db.ExecContext(ctx, `UPDATE idempotency SET done = 1, status = ?, content_type = ?, body = ? WHERE tenant = ? AND key = ?`,
		status, contentType, body, tenant, key)
	if err != nil {
		return fmt.Errorf("idempotency key: %w", err)
	}
	return nil
}

// AbandonIdempotent forgets the claim of a call that failed, so that a
// retry runs again.
func (s *Store) AbandonIdempotent(ctx context.Context, tenant, key string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM idempotency WHERE tenant = ? AND key = ? AND done = 0`, tenant, key)
	return err
}
