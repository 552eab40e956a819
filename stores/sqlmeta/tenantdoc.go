package sqlmeta

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/amber-run/amber/core/errdefs"
)

// tenantDoc is a per-tenant JSON document kept in a table of its own
// (tenant TEXT PRIMARY KEY, <column> TEXT, updated_ns INTEGER): the
// quotas and the policies. what names it in errors.
type tenantDoc struct{ table, column, what string }

var (
	quotaDoc  = tenantDoc{table: "tenant_quotas", column: "quota", what: "tenant quota"}
	policyDoc = tenantDoc{table: "tenant_policies", column: "policy", what: "tenant policy"}
)

// getTenantDoc returns tenant's document (the zero value if none was set).
func getTenantDoc[T any](ctx context.Context, s *Store, d tenantDoc, tenant string) (T, error) {
	var v T
	var raw string
	err := s.db.QueryRowContext(ctx, fmt.Sprintf(`SELECT %s FROM %s WHERE tenant = ?`, d.column, d.table), tenant).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return v, nil
	}
	if err != nil {
		return v, fmt.Errorf("%s %s: %w", d.what, tenant, err)
	}
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return v, errdefs.DataLossf("%s %s does not decode: %v", d.what, tenant, err)
	}
	return v, nil
}

// setTenantDoc replaces tenant's document; the tenant must exist. The
// caller has checked v.
func (s *Store) setTenantDoc(ctx context.Context, d tenantDoc, tenant string, v any) error {
	if _, err := s.GetTenant(ctx, tenant); err != nil {
		return err
	}
	b, _ := json.Marshal(v)
	_, err := s.db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %[1]s (tenant, %[2]s, updated_ns) VALUES (?,?,?)
		ON CONFLICT(tenant) DO UPDATE SET %[2]s = excluded.%[2]s, updated_ns = excluded.updated_ns`, d.table, d.column),
		tenant, string(b), s.clock.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("set %s %s: %w", d.what, tenant, err)
	}
	return nil
}
