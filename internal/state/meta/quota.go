package meta

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/amber-run/amber/core/errdefs"
)

// TenantQuota bounds what a tenant may use. Zero fields mean no limit.
// Only the operator sets it (a tenant's own keys may read it).
type TenantQuota struct {
	// Sandboxes not destroyed (running, stopped, crashed), forks included.
	MaxSandboxes int `json:"max_sandboxes,omitempty"`
	// The sum of those sandboxes' memory and CPU limits.
	MaxMemoryBytes int64 `json:"max_memory_bytes,omitempty"`
	MaxMilliCPUs   int64 `json:"max_millicpus,omitempty"`
	// Bytes the tenant's committed checkpoints added to the store.
	MaxCheckpointBytes int64 `json:"max_checkpoint_bytes,omitempty"`
	// API requests per second (a burst of twice as many is allowed).
	RequestsPerSecond float64 `json:"requests_per_second,omitempty"`
	// Budgets bound what the tenant may consume per calendar month (UTC),
	// by usage meter name (engine.Meters). Enforced from the usage records
	// (engine/budget.go).
	Budgets map[string]float64 `json:"budgets,omitempty"`
}

// Check validates q.
func (q TenantQuota) Check() error {
	if q.MaxSandboxes < 0 || q.MaxMemoryBytes < 0 || q.MaxMilliCPUs < 0 || q.MaxCheckpointBytes < 0 || q.RequestsPerSecond < 0 {
		return errdefs.InvalidArgumentf("quota values must not be negative (0 means no limit)")
	}
	if len(q.Budgets) > 64 {
		return errdefs.InvalidArgumentf("at most 64 budgets")
	}
	for m, v := range q.Budgets {
		if !(v > 0) || math.IsInf(v, 0) {
			return errdefs.InvalidArgumentf("budget %q: %v is not a positive number (remove a budget to lift it)", m, v)
		}
	}
	return nil
}

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
