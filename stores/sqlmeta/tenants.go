package sqlmeta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
)

// DefaultTenant is the operator's tenant (metadata.DefaultTenant).
const DefaultTenant = metadata.DefaultTenant

// TenantActive is the state of a tenant whose keys work (metadata.TenantActive).
const TenantActive = metadata.TenantActive

// tenantsSchema is shared by the schema and migration 2 → 3.
const tenantsSchema = `
CREATE TABLE IF NOT EXISTS tenants (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL,
	state      TEXT NOT NULL,
	created_ns INTEGER NOT NULL
) STRICT;`

// CreateTenant adds tenant t (ErrAlreadyExists if its id is taken). Name
// defaults to the id; the state is active.
func (s *Store) CreateTenant(ctx context.Context, t Tenant) (Tenant, error) {
	if err := metadata.ValidTenantID(t.ID); err != nil {
		return t, err
	}
	if len(t.Name) > 200 {
		return t, errdefs.InvalidArgumentf("tenant name is longer than 200 bytes")
	}
	if t.Name == "" {
		t.Name = t.ID
	}
	t.State, t.Created = TenantActive, s.clock.Now().UTC()
	_, err := s.db.ExecContext(ctx, `INSERT INTO tenants (id, name, state, created_ns) VALUES (?,?,?,?)`,
		t.ID, t.Name, t.State, t.Created.UnixNano())
	if err != nil {
		if isUnique(err) {
			return t, errdefs.AlreadyExistsf("tenant %s", t.ID)
		}
		return t, fmt.Errorf("create tenant %s: %w", t.ID, err)
	}
	return t, nil
}

// GetTenant returns tenant id (ErrNotFound if there is none).
func (s *Store) GetTenant(ctx context.Context, id string) (Tenant, error) {
	return getTenant(ctx, s.db, id)
}

type querier interface {
	QueryRowContext(ctx context.Context, q string, args ...any) *faultyRow
}

func getTenant(ctx context.Context, q querier, id string) (Tenant, error) {
	t, err := scanTenant(q.QueryRowContext(ctx, `SELECT id, name, state, created_ns FROM tenants WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return t, errdefs.NotFoundf("tenant %s", id)
	}
	return t, err
}

// ListTenants returns every tenant, oldest first.
func (s *Store) ListTenants(ctx context.Context) ([]Tenant, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, name, state, created_ns FROM tenants ORDER BY created_ns, id`)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	defer rows.Close()
	var out []Tenant
	for rows.Next() {
		t, err := scanTenant(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

func scanTenant(r scanner) (Tenant, error) {
	var t Tenant
	var created int64
	if err := r.Scan(&t.ID, &t.Name, &t.State, &created); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return t, err
		}
		return t, fmt.Errorf("meta scan tenant: %w", err)
	}
	t.Created = time.Unix(0, created).UTC()
	return t, nil
}
