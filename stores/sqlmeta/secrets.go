package sqlmeta

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// secretsSchema holds tenants' secrets and egress CAs, sealed by the
// caller (package secretstore): this table never sees a plaintext value or
// private key. Created with the schema at every start (no migration).
const secretsSchema = `
CREATE TABLE IF NOT EXISTS secrets (
	tenant     TEXT NOT NULL,
	name       TEXT NOT NULL,
	sealed     BLOB NOT NULL,
	hosts      TEXT NOT NULL,
	updated_ns INTEGER NOT NULL,
	PRIMARY KEY (tenant, name)
) STRICT;
CREATE TABLE IF NOT EXISTS tenant_cas (
	tenant     TEXT PRIMARY KEY,
	cert_pem   BLOB NOT NULL,
	sealed_key BLOB NOT NULL,
	created_ns INTEGER NOT NULL
) STRICT;`

// PutSecret stores (or replaces) a sealed secret.
func (s *Store) PutSecret(ctx context.Context, x SealedSecret) error {
	hosts, _ := json.Marshal(x.Hosts)
	_, err := s.db.ExecContext(ctx, `INSERT INTO secrets (tenant, name, sealed, hosts, updated_ns) VALUES (?,?,?,?,?)
		ON CONFLICT(tenant, name) DO UPDATE SET sealed = excluded.sealed, hosts = excluded.hosts, updated_ns = excluded.updated_ns`,
		x.Tenant, x.Name, x.Sealed, string(hosts), s.clock.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("put secret %s/%s: %w", x.Tenant, x.Name, err)
	}
	return nil
}

// GetSecret returns tenant's sealed secret name (ErrNotFound if none).
func (s *Store) GetSecret(ctx context.Context, tenant, name string) (SealedSecret, error) {
	x := SealedSecret{Tenant: tenant, Name: name}
	var hosts string
	var ns int64
	err := s.db.QueryRowContext(ctx, `SELECT sealed, hosts, updated_ns FROM secrets WHERE tenant = ? AND name = ?`, tenant, name).Scan(&x.Sealed, &hosts, &ns)
	if errors.Is(err, sql.ErrNoRows) {
		return x, errdefs.NotFoundf("secret %q", name)
	}
	if err != nil {
		return x, fmt.Errorf("secret %s/%s: %w", tenant, name, err)
	}
	if err := json.Unmarshal([]byte(hosts), &x.Hosts); err != nil {
		return x, errdefs.DataLossf("secret %s/%s hosts: %v", tenant, name, err)
	}
	x.Updated = time.Unix(0, ns).UTC()
	return x, nil
}

// ListSecrets lists tenant's secrets, sealed values left out.
func (s *Store) ListSecrets(ctx context.Context, tenant string) ([]SealedSecret, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, hosts, updated_ns FROM secrets WHERE tenant = ? ORDER BY name`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list secrets of %s: %w", tenant, err)
	}
	defer rows.Close()
	var out []SealedSecret
	for rows.Next() {
		x := SealedSecret{Tenant: tenant}
		var hosts string
		var ns int64
		if err := rows.Scan(&x.Name, &hosts, &ns); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(hosts), &x.Hosts); err != nil {
			return nil, errdefs.DataLossf("secret %s/%s hosts: %v", tenant, x.Name, err)
		}
		x.Updated = time.Unix(0, ns).UTC()
		out = append(out, x)
	}
	return out, rows.Err()
}

// DeleteSecret removes tenant's secret name (ErrNotFound if none).
func (s *Store) DeleteSecret(ctx context.Context, tenant, name string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM secrets WHERE tenant = ? AND name = ?`, tenant, name)
	if err != nil {
		return fmt.Errorf("delete secret %s/%s: %w", tenant, name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFoundf("secret %q", name)
	}
	return nil
}

// TenantCA returns tenant's egress CA: its certificate and sealed key
// (ErrNotFound if none yet).
func (s *Store) TenantCA(ctx context.Context, tenant string) (certPEM, sealedKey []byte, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT cert_pem, sealed_key FROM tenant_cas WHERE tenant = ?`, tenant).Scan(&certPEM, &sealedKey)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, errdefs.NotFoundf("egress CA of tenant %s", tenant)
	}
	return certPEM, sealedKey, err
}

// InsertTenantCA records tenant's CA unless it has one; it returns the one
// recorded (the first writer wins a race).
func (s *Store) InsertTenantCA(ctx context.Context, tenant string, certPEM, sealedKey []byte) ([]byte, []byte, error) {
	_, err := s.db.ExecContext(ctx, `INSERT INTO tenant_cas (tenant, cert_pem, sealed_key, created_ns) VALUES (?,?,?,?)
		ON CONFLICT(tenant) DO NOTHING`, tenant, certPEM, sealedKey, s.clock.Now().UnixNano())
	if err != nil {
		return nil, nil, fmt.Errorf("egress CA of %s: %w", tenant, err)
	}
	return s.TenantCA(ctx, tenant)
}
