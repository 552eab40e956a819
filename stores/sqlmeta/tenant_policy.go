package sqlmeta

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/amber-run/amber/core/errdefs"
)

// tenantPolicySchema is created with the schema at every start (no
// migration: a database without it gets it empty, every tenant on the
// defaults).
const tenantPolicySchema = `
CREATE TABLE IF NOT EXISTS tenant_policies (
	tenant     TEXT PRIMARY KEY,
	policy     TEXT NOT NULL,
	updated_ns INTEGER NOT NULL
) STRICT;`

// TenantPolicy returns tenant's policy (the zero policy if none was set).
func (s *Store) TenantPolicy(ctx context.Context, tenant string) (TenantPolicy, error) {
	var p TenantPolicy
	var raw string
	err := s.db.QueryRowContext(ctx, `SELECT policy FROM tenant_policies WHERE tenant = ?`, tenant).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("tenant policy %s: %w", tenant, err)
	}
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		return p, errdefs.DataLossf("tenant policy %s does not decode: %v", tenant, err)
	}
	return p, nil
}

// SetTenantPolicy replaces tenant's policy; the tenant must exist.
func (s *Store) SetTenantPolicy(ctx context.Context, tenant string, p TenantPolicy) error {
	if err := p.Check(); err != nil {
		return err
	}
	if _, err := s.GetTenant(ctx, tenant); err != nil {
		return err
	}
	b, _ := json.Marshal(p)
	_, err := s.db.ExecContext(ctx, `INSERT INTO tenant_policies (tenant, policy, updated_ns) VALUES (?,?,?)
		ON CONFLICT(tenant) DO UPDATE SET policy = excluded.policy, updated_ns = excluded.updated_ns`,
		tenant, string(b), s.clock.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("set tenant policy %s: %w", tenant, err)
	}
	return nil
}
