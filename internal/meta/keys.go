package meta

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/amber-run/amber/core/errdefs"
)

// APIKey is an accepted credential. Only the SHA-256 of the secret is kept.
type APIKey struct {
	Name   string
	Tenant string
	Hash   string
}

// HashKey returns the stored form of a secret API key.
func HashKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// PutKey stores (or replaces, by name) the key called name for tenant. A
// replaced key stops being accepted at once.
func (s *Store) PutKey(ctx context.Context, name, tenant, hash string) error {
	if name == "" || tenant == "" || len(hash) != 64 {
		return errdefs.InvalidArgumentf("put key: name, tenant and a sha-256 hash are required")
	}
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO api_keys (hash, name, tenant, created_ns) VALUES (?,?,?,?)
		 ON CONFLICT(name) DO UPDATE SET hash = excluded.hash, tenant = excluded.tenant, created_ns = excluded.created_ns`,
		hash, name, tenant, s.clock.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("put key %s: %w", name, err)
	}
	return nil
}

// KeyByName returns the key called name (ErrNotFound if none).
func (s *Store) KeyByName(ctx context.Context, name string) (APIKey, error) {
	return s.key(ctx, `SELECT name, tenant, hash FROM api_keys WHERE name = ?`, name)
}

// KeyByHash returns the key whose hash is hash (ErrNotFound if none).
func (s *Store) KeyByHash(ctx context.Context, hash string) (APIKey, error) {
	return s.key(ctx, `SELECT name, tenant, hash FROM api_keys WHERE hash = ?`, hash)
}

func (s *Store) key(ctx context.Context, q, arg string) (APIKey, error) {
	var k APIKey
	err := s.db.QueryRowContext(ctx, q, arg).Scan(&k.Name, &k.Tenant, &k.Hash)
	if errors.Is(err, sql.ErrNoRows) {
		return k, errdefs.NotFoundf("api key")
	}
	if err != nil {
		return k, fmt.Errorf("look up api key: %w", err)
	}
	return k, nil
}
