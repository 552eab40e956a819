package sqlmeta

import (
	"context"
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
	return getTenantDoc[TenantPolicy](ctx, s, policyDoc, tenant)
}

// SetTenantPolicy replaces tenant's policy; the tenant must exist.
func (s *Store) SetTenantPolicy(ctx context.Context, tenant string, p TenantPolicy) error {
	if err := p.Check(); err != nil {
		return err
	}
	return s.setTenantDoc(ctx, policyDoc, tenant, p)
}
