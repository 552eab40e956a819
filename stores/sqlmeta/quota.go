package sqlmeta

import (
	"context"
	"database/sql"
	"fmt"
)

const quotaSchema = `
CREATE TABLE IF NOT EXISTS tenant_quotas (
	tenant     TEXT PRIMARY KEY,
	quota      TEXT NOT NULL,
	updated_ns INTEGER NOT NULL
) STRICT;`

// TenantQuota returns tenant's quota (no limits if none was set).
func (s *Store) TenantQuota(ctx context.Context, tenant string) (TenantQuota, error) {
	return getTenantDoc[TenantQuota](ctx, s, quotaDoc, tenant)
}

// SetTenantQuota replaces tenant's quota; the tenant must exist.
func (s *Store) SetTenantQuota(ctx context.Context, tenant string, q TenantQuota) error {
	if err := q.Check(); err != nil {
		return err
	}
	return s.setTenantDoc(ctx, quotaDoc, tenant, q)
}

// CheckpointBytes is what tenant's committed checkpoints added to the store.
func (s *Store) CheckpointBytes(ctx context.Context, tenant string) (int64, error) {
	var n sql.NullInt64
	q := `SELECT SUM(json_extract(stats, '$.stored_bytes')) FROM checkpoints WHERE tenant = ? AND state = ?`
	if s.db.pg {
		q = `SELECT SUM((stats::jsonb->>'stored_bytes')::bigint)::bigint FROM checkpoints WHERE tenant = ? AND state = ?`
	}
	err := s.db.QueryRowContext(ctx, q, tenant, string(CheckpointCommitted)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("checkpoint bytes of %s: %w", tenant, err)
	}
	return n.Int64, nil
}
