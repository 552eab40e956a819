package sqlmeta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
)

const keyCols = `tenant, name, hash, prefix, scopes, created_ns, expires_ns, revoked_ns`

func checkKey(k APIKey) error {
	if k.Tenant == "" || len(k.Hash) != 64 {
		return errdefs.InvalidArgumentf("api key: a tenant and a sha-256 hash are required")
	}
	if err := metadata.ValidKeyName(k.Name); err != nil {
		return err
	}
	if _, err := metadata.ParseScopes(scopeNames(k.Scopes)); err != nil {
		return err
	}
	return nil
}

func scopeNames(ss []Scope) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}

// PutKey stores k, replacing the key of the same tenant and name if there
// is one (which stops being accepted at once); the stored key is neither
// revoked nor expired unless k says so. It is how `amber up` (re)registers
// the operator's key; API-made keys use CreateKey.
func (s *Store) PutKey(ctx context.Context, k APIKey) error {
	if err := checkKey(k); err != nil {
		return fmt.Errorf("put key: %w", err)
	}
	scopes, _ := metadata.ParseScopes(scopeNames(k.Scopes))
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO api_keys (`+keyCols+`) VALUES (?,?,?,?,?,?,?,?)
		 ON CONFLICT(tenant, name) DO UPDATE SET hash = excluded.hash, prefix = excluded.prefix, scopes = excluded.scopes,
		   created_ns = excluded.created_ns, expires_ns = excluded.expires_ns, revoked_ns = excluded.revoked_ns`,
		k.Tenant, k.Name, k.Hash, k.Prefix, strings.Join(scopeNames(scopes), ","), s.clock.Now().UnixNano(), nanos(k.Expires), nanos(k.Revoked))
	if err != nil {
		return fmt.Errorf("put key %s/%s: %w", k.Tenant, k.Name, err)
	}
	return nil
}

// CreateKey adds k to its tenant, which must exist (ErrNotFound). A name
// already used in the tenant, by a live or a revoked key, is
// ErrAlreadyExists: names stay attached to their history. It returns the
// key as stored.
func (s *Store) CreateKey(ctx context.Context, k APIKey) (APIKey, error) {
	if err := checkKey(k); err != nil {
		return k, fmt.Errorf("create key: %w", err)
	}
	k.Scopes, _ = metadata.ParseScopes(scopeNames(k.Scopes))
	k.Created = s.clock.Now().UTC()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return k, err
	}
	defer tx.Rollback()
	if _, err := getTenant(ctx, tx, k.Tenant); err != nil {
		return k, err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO api_keys (`+keyCols+`) VALUES (?,?,?,?,?,?,?,?)`,
		k.Tenant, k.Name, k.Hash, k.Prefix, strings.Join(scopeNames(k.Scopes), ","), k.Created.UnixNano(), nanos(k.Expires), 0)
	if err != nil {
		if isUnique(err) {
			return k, errdefs.AlreadyExistsf("tenant %s already has a key named %q (revoked keys keep their names); pick another name", k.Tenant, k.Name)
		}
		return k, fmt.Errorf("create key %s/%s: %w", k.Tenant, k.Name, err)
	}
	return k, tx.Commit()
}

// RevokeKey revokes tenant's key name; it is refused from then on. Revoking
// a revoked key changes nothing (it keeps its first revocation time).
func (s *Store) RevokeKey(ctx context.Context, tenant, name string) (APIKey, error) {
	_, err := s.db.ExecContext(ctx, `UPDATE api_keys SET revoked_ns = ? WHERE tenant = ? AND name = ? AND revoked_ns = 0`,
		s.clock.Now().UnixNano(), tenant, name)
	if err != nil {
		return APIKey{}, fmt.Errorf("revoke key %s/%s: %w", tenant, name, err)
	}
	return s.KeyByName(ctx, tenant, name)
}

// ListKeys returns tenant's keys, revoked and expired ones included,
// oldest first.
func (s *Store) ListKeys(ctx context.Context, tenant string) ([]APIKey, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+keyCols+` FROM api_keys WHERE tenant = ? ORDER BY created_ns, name`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list keys of %s: %w", tenant, err)
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// KeyByName returns tenant's key called name (ErrNotFound if none).
func (s *Store) KeyByName(ctx context.Context, tenant, name string) (APIKey, error) {
	k, err := scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyCols+` FROM api_keys WHERE tenant = ? AND name = ?`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return k, errdefs.NotFoundf("tenant %s has no key named %q", tenant, name)
	}
	return k, err
}

// KeyByHash returns the key whose hash is hash (ErrNotFound if none),
// revoked and expired keys included: the caller decides (APIKey.Usable).
func (s *Store) KeyByHash(ctx context.Context, hash string) (APIKey, error) {
	k, err := scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyCols+` FROM api_keys WHERE hash = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return k, errdefs.NotFoundf("api key")
	}
	return k, err
}

func scanKey(r scanner) (APIKey, error) {
	var k APIKey
	var scopes string
	var created, expires, revoked int64
	if err := r.Scan(&k.Tenant, &k.Name, &k.Hash, &k.Prefix, &scopes, &created, &expires, &revoked); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return k, err
		}
		return k, fmt.Errorf("look up api key: %w", err)
	}
	ss, err := metadata.ParseScopes(strings.Split(scopes, ","))
	if err != nil {
		return k, errdefs.DataLossf("meta: api key %s/%s has undecodable scopes %q", k.Tenant, k.Name, scopes)
	}
	k.Scopes = ss
	k.Created = time.Unix(0, created).UTC()
	k.Expires = fromNanos(expires)
	k.Revoked = fromNanos(revoked)
	return k, nil
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}
