package meta

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// TenantPolicy is a tenant's recovery policy: how its sandboxes are
// checkpointed, kept and stopped ("finance wants 99.99 %, education wants
// low latency"). Zero fields mean the daemon's defaults.
type TenantPolicy struct {
	// Recovery is the policy of sandboxes created without one: "" (none),
	// "fast" or "strict".
	Recovery string `json:"recovery,omitempty"`
	// FastEvery and FastInterval tune the fast policy.
	FastEvery    int           `json:"fast_every,omitempty"`
	FastInterval time.Duration `json:"fast_interval_ns,omitempty"`
	// KeepCheckpoints keeps each sandbox's newest N (plus tagged ones).
	KeepCheckpoints int `json:"keep_checkpoints,omitempty"`
	// IdleTimeout checkpoints and stops a sandbox idle this long.
	IdleTimeout time.Duration `json:"idle_timeout_ns,omitempty"`
	// Egress is the egress policy of the tenant's sandboxes that have none
	// of their own (nil: the daemon's default).
	Egress *EgressPolicy `json:"egress,omitempty"`
}

// Check validates p's ranges (the recovery name is the engine's to check).
func (p TenantPolicy) Check() error {
	switch {
	case p.FastEvery < 0 || p.FastEvery > 1_000_000:
		return errdefs.InvalidArgumentf("fast_every %d: want 0 (the default) to 1000000", p.FastEvery)
	case p.FastInterval < 0 || (p.FastInterval > 0 && p.FastInterval < 100*time.Millisecond):
		return errdefs.InvalidArgumentf("fast interval %v: want 0 (the default) or at least 100ms", p.FastInterval)
	case p.KeepCheckpoints < 0 || p.KeepCheckpoints > 10_000:
		return errdefs.InvalidArgumentf("keep_checkpoints %d: want 0 (keep all) to 10000", p.KeepCheckpoints)
	case p.IdleTimeout < 0 || (p.IdleTimeout > 0 && p.IdleTimeout < time.Second):
		return errdefs.InvalidArgumentf("idle timeout %v: want 0 (the default) or at least 1s", p.IdleTimeout)
	}
	if p.Egress != nil {
		return p.Egress.Check()
	}
	return nil
}

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
