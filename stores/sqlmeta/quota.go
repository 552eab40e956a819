package sqlmeta

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/amber-run/amber/core/errdefs"
)

const quotaSchema = `
CREATE TABLE IF NOT EXISTS tenant_quotas (
	tenant     TEXT PRIMARY KEY,
	quota      TEXT NOT NULL,
	updated_ns INTEGER NOT NULL
) STRICT;`

// TenantQuota returns tenant's quota (no limits if none was set).
func (s *Store) TenantQuota(ctx context.Context, tenant string) (TenantQuota, error) {
	var q TenantQuota
	var raw string
	err := s.db.QueryRowContext(ctx, `SELECT quota FROM tenant_quotas WHERE tenant = ?`, tenant).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return q, nil
	}
	if err != nil {
		return q, fmt.Errorf("tenant quota %s: %w", tenant, err)
	}
	if err := json.Unmarshal([]byte(raw), &q); err != nil {
		return q, errdefs.DataLossf("tenant quota %s does not decode: %v", tenant, err)
	}
	return q, nil
}

// SetTenantQuota replaces tenant's quota; the tenant must exist.
func (s *Store) SetTenantQuota(ctx context.Context, tenant string, q TenantQuota) error {
	if err := q.Check(); err != nil {
		return err
	}
	if _, err := s.GetTenant(ctx, tenant); err != nil {
		return err
	}
	b, _ := json.Marshal(q)
	_, err := s.db.ExecContext(ctx, `INSERT INTO tenant_quotas (tenant, quota, updated_ns) VALUES (?,?,?)
		ON CONFLICT(tenant) DO UPDATE SET quota = excluded.quota, updated_ns = excluded.updated_ns`,
		tenant, string(b), s.clock.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("set tenant quota %s: %w", tenant, err)
	}
	return nil
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
