package sqlmeta

import (
	"context"
	"crypto/subtle"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// PutExposure records (or replaces, with a new token) the exposure of
// e.SandboxID's port e.Port. Created is set from the clock.
func (s *Store) PutExposure(ctx context.Context, e Exposure) (Exposure, error) {
	if e.SandboxID == "" || e.Tenant == "" || e.Port < 1 || e.Port > 65535 || len(e.TokenHash) != 64 {
		return e, errdefs.InvalidArgumentf("put exposure: sandbox, tenant, port and a sha-256 token hash are required")
	}
	e.Created = s.clock.Now()
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO exposures (sandbox_id, port, tenant, token_hash, created_ns) VALUES (?,?,?,?,?)
		 ON CONFLICT(sandbox_id, port) DO UPDATE SET tenant = excluded.tenant, token_hash = excluded.token_hash, created_ns = excluded.created_ns`,
		e.SandboxID, e.Port, e.Tenant, e.TokenHash, e.Created.UnixNano())
	if err != nil {
		return e, fmt.Errorf("put exposure %s:%d: %w", e.SandboxID, e.Port, err)
	}
	return e, nil
}

// Exposure returns the exposure of sandbox id's port (ErrNotFound if none).
func (s *Store) Exposure(ctx context.Context, id string, port int) (Exposure, error) {
	e := Exposure{SandboxID: id, Port: port}
	var ns int64
	err := s.db.QueryRowContext(ctx, `SELECT tenant, token_hash, created_ns FROM exposures WHERE sandbox_id = ? AND port = ?`, id, port).
		Scan(&e.Tenant, &e.TokenHash, &ns)
	if errors.Is(err, sql.ErrNoRows) {
		return e, errdefs.NotFoundf("sandbox %s has no exposed port %d", id, port)
	}
	if err != nil {
		return e, fmt.Errorf("look up exposure %s:%d: %w", id, port, err)
	}
	e.Created = time.Unix(0, ns)
	return e, nil
}

// ExposureByToken returns the exposure of sandbox id's port if tokenHash is
// its token's hash, else ErrNotFound (the same error as for no exposure).
func (s *Store) ExposureByToken(ctx context.Context, id string, port int, tokenHash string) (Exposure, error) {
	e, err := s.Exposure(ctx, id, port)
	if err != nil {
		return Exposure{}, err
	}
	if subtle.ConstantTimeCompare([]byte(e.TokenHash), []byte(tokenHash)) != 1 {
		return Exposure{}, errdefs.NotFoundf("sandbox %s has no exposed port %d", id, port)
	}
	return e, nil
}

// Exposures lists sandbox id's exposures by port.
func (s *Store) Exposures(ctx context.Context, id string) ([]Exposure, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT port, tenant, token_hash, created_ns FROM exposures WHERE sandbox_id = ? ORDER BY port`, id)
	if err != nil {
		return nil, fmt.Errorf("list exposures of %s: %w", id, err)
	}
	defer rows.Close()
	out := []Exposure{}
	for rows.Next() {
		e := Exposure{SandboxID: id}
		var ns int64
		if err := rows.Scan(&e.Port, &e.Tenant, &e.TokenHash, &ns); err != nil {
			return nil, err
		}
		e.Created = time.Unix(0, ns)
		out = append(out, e)
	}
	return out, rows.Err()
}

// DeleteExposure removes the exposure of sandbox id's port; ErrNotFound if
// there was none.
func (s *Store) DeleteExposure(ctx context.Context, id string, port int) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM exposures WHERE sandbox_id = ? AND port = ?`, id, port)
	if err != nil {
		return fmt.Errorf("delete exposure %s:%d: %w", id, port, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFoundf("sandbox %s has no exposed port %d", id, port)
	}
	return nil
}

// DeleteExposures removes every exposure of sandbox id.
func (s *Store) DeleteExposures(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM exposures WHERE sandbox_id = ?`, id); err != nil {
		return fmt.Errorf("delete exposures of %s: %w", id, err)
	}
	return nil
}
