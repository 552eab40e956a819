package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// migrations[i] takes the schema from version i to i+1. Append only: a
// released migration never changes.
var migrations = [][]string{
	{
		`CREATE TABLE streams (
			stream    text   PRIMARY KEY,
			tenant    text   NOT NULL,
			first_seq bigint NOT NULL CHECK (first_seq >= 1),
			head_seq  bigint NOT NULL CHECK (head_seq >= first_seq - 1)
		)`,
		`CREATE TABLE events (
			stream         text   NOT NULL,
			seq            bigint NOT NULL,
			envelope       bytea  NOT NULL,
			checkpoint_ref text,
			PRIMARY KEY (stream, seq)
		)`,
		`CREATE TABLE event_ids (
			id     text   PRIMARY KEY,
			stream text   NOT NULL,
			seq    bigint NOT NULL,
			digest text   NOT NULL
		)`,
		`CREATE TABLE leases (
			stream  text   PRIMARY KEY,
			holder  text   NOT NULL,
			epoch   bigint NOT NULL CHECK (epoch >= 0),
			expires bigint          -- Unix nanoseconds from the Store's clock; NULL: never granted
		)`,
	},
}

// schemaLockKey namespaces the advisory lock that serializes migrations
// ("amber" in ASCII).
const schemaLockKey = 0x616d626572

// migrate brings the schema to the newest version. It is idempotent and safe
// to run from several processes at once: a transaction-scoped advisory lock
// per schema serializes them, and each migration commits with its version row.
func (s *Store) migrate(ctx context.Context) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return s.wrap("migrate", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))

	schema := s.schema
	if schema == "" {
		schema = "(default)"
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(schemaLockKey&0x7fffffff), schema); err != nil {
		return s.wrap("migrate: lock", err)
	}
	if s.schema != "" {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{s.schema}.Sanitize()); err != nil {
			return s.wrap("migrate: create schema", err)
		}
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
		version    int    PRIMARY KEY,
		applied_ns bigint NOT NULL
	)`); err != nil {
		return s.wrap("migrate: schema_version", err)
	}
	var have int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_version`).Scan(&have); err != nil {
		return s.wrap("migrate: read version", err)
	}
	if have > len(migrations) {
		return fmt.Errorf("migrate: schema is at version %d, newer than this binary's %d; upgrade amber", have, len(migrations))
	}
	for v := have; v < len(migrations); v++ {
		for _, stmt := range migrations[v] {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return s.wrap(fmt.Sprintf("migrate to version %d", v+1), err)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO schema_version (version, applied_ns) VALUES ($1, $2)`, v+1, s.clk.Now().UnixNano()); err != nil {
			return s.wrap("migrate: record version", err)
		}
		s.log.Info("applied event log migration", "version", v+1)
	}
	return s.wrap("migrate: commit", tx.Commit(ctx))
}
