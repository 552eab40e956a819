package sqlmeta

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/amber-run/amber/core/errdefs"
)

// sandboxEgressSchema is created with the schema at every start (no
// migration: a database without it gets it empty). policy is JSON, ""
// when the sandbox follows its tenant's; run is the gateway run the
// sandbox's traffic is numbered in (its latest cut).
const sandboxEgressSchema = `
CREATE TABLE IF NOT EXISTS sandbox_egress (
	sandbox    TEXT PRIMARY KEY,
	policy     TEXT NOT NULL DEFAULT '',
	run        TEXT NOT NULL DEFAULT '',
	updated_ns INTEGER NOT NULL
) STRICT;`

// SetSandboxEgress records sandbox's own egress policy (nil: follow the
// tenant's).
func (s *Store) SetSandboxEgress(ctx context.Context, sandbox string, p *EgressPolicy) error {
	raw := ""
	if p != nil {
		if err := p.Check(); err != nil {
			return err
		}
		b, _ := json.Marshal(p)
		raw = string(b)
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO sandbox_egress (sandbox, policy, updated_ns) VALUES (?,?,?)
		ON CONFLICT(sandbox) DO UPDATE SET policy = excluded.policy, updated_ns = excluded.updated_ns`,
		sandbox, raw, s.clock.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("set egress policy of %s: %w", sandbox, err)
	}
	return nil
}

// SandboxEgress returns sandbox's own egress policy (nil if it follows
// its tenant's) and its current gateway run ("" if none yet).
func (s *Store) SandboxEgress(ctx context.Context, sandbox string) (*EgressPolicy, string, error) {
	var raw, run string
	err := s.db.QueryRowContext(ctx, `SELECT policy, run FROM sandbox_egress WHERE sandbox = ?`, sandbox).Scan(&raw, &run)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("egress policy of %s: %w", sandbox, err)
	}
	if raw == "" {
		return nil, run, nil
	}
	var p EgressPolicy
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		return nil, run, errdefs.DataLossf("egress policy of %s: %v", sandbox, err)
	}
	return &p, run, nil
}

// SetEgressRun records the gateway run sandbox's traffic is numbered in.
// The engine writes it before it starts the run, so a daemon that restarts
// continues the run the sandbox is in.
func (s *Store) SetEgressRun(ctx context.Context, sandbox, run string) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO sandbox_egress (sandbox, run, updated_ns) VALUES (?,?,?)
		ON CONFLICT(sandbox) DO UPDATE SET run = excluded.run, updated_ns = excluded.updated_ns`,
		sandbox, run, s.clock.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("set egress run of %s: %w", sandbox, err)
	}
	return nil
}
