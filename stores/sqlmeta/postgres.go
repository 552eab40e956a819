package sqlmeta

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
)

// IsPostgres reports whether spec names a PostgreSQL database rather than a
// SQLite file.
func IsPostgres(spec string) bool {
	return strings.HasPrefix(spec, "postgres://") || strings.HasPrefix(spec, "postgresql://")
}

// openPostgres opens the store on the PostgreSQL database dsn (pgx's
// database/sql driver). Every node of a deployment opens the same database:
// the tables are those of the SQLite store (the same statements, rewritten
// by db), in the DSN's search_path — the event log's tables
// (stores/postgres) may share it; no name collides. Commits are durable
// when the server's synchronous_commit is on (its default).
func openPostgres(dsn string, opts Options) (*Store, error) {
	sqldb, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("open meta on postgres: %w", err)
	}
	sqldb.SetMaxOpenConns(9) // 8 for queries, 1 held by a node's liveness lock (NodeLock)
	s := &Store{db: &db{DB: sqldb, pg: true}, clock: opts.Clock}
	if err := s.migratePostgres(context.Background()); err != nil {
		sqldb.Close()
		return nil, fmt.Errorf("open meta on postgres %s: %w", redactDSN(dsn), err)
	}
	if err := sqldb.QueryRow(`SELECT current_schema()`).Scan(&s.db.scope); err != nil {
		sqldb.Close()
		return nil, fmt.Errorf("open meta on postgres %s: current schema: %w", redactDSN(dsn), err)
	}
	s.db.fps = opts.Failpoints
	return s, nil
}

// metaLockKey is the advisory lock that serialises the nodes' migrations
// ("meta" in ASCII).
const metaLockKey = 0x6d657461

// pgMigrations[v] brings a PostgreSQL database at version v to v+1 before
// the schema's CREATE … IF NOT EXISTS statements run (in the transaction
// that records the new version). PostgreSQL deployments began at version 5.
var pgMigrations = map[int]string{
	// 5 → 6: checkpoints committed on the node before their upload.
	5: `ALTER TABLE checkpoints ADD COLUMN IF NOT EXISTS upload_pending BIGINT NOT NULL DEFAULT 0;
	    ALTER TABLE checkpoints ADD COLUMN IF NOT EXISTS hot_digest TEXT NOT NULL DEFAULT '';`,
	// 6 → 7: sandboxes' metadata and deadlines.
	6: `ALTER TABLE sandboxes ADD COLUMN IF NOT EXISTS metadata TEXT NOT NULL DEFAULT '{}';
	    ALTER TABLE sandboxes ADD COLUMN IF NOT EXISTS expires_ns BIGINT NOT NULL DEFAULT 0;
	    ALTER TABLE sandboxes ADD COLUMN IF NOT EXISTS on_expire TEXT NOT NULL DEFAULT '';`,
}

// migratePostgres creates the schema at schemaVersion, migrating an older
// one (pgMigrations): a newer version (another node runs a newer binary)
// is refused. Several nodes starting together serialise on an advisory
// lock inside one transaction, so the migration and its version commit
// together or not at all.
func (s *Store) migratePostgres(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, int64(metaLockKey)); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	if _, err := tx.Exec(`CREATE TABLE IF NOT EXISTS meta_schema_version (version INTEGER NOT NULL)`); err != nil {
		return err
	}
	var v sql.NullInt64
	if err := tx.QueryRowContext(ctx, `SELECT MAX(version) FROM meta_schema_version`).Scan(&v); err != nil {
		return err
	}
	if v.Int64 > schemaVersion {
		return errdefs.FailedPreconditionf("meta schema version %d is newer than this binary's %d; upgrade amber", v.Int64, schemaVersion)
	}
	for ver := v.Int64; v.Valid && ver < schemaVersion; ver++ {
		if _, err := tx.ExecContext(ctx, pgMigrations[int(ver)]); err != nil {
			return fmt.Errorf("migrate schema %d to %d: %w", ver, ver+1, err)
		}
	}
	if _, err := tx.Exec(schema); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO tenants (id, name, state, created_ns) VALUES (?, ?, ?, ?) ON CONFLICT(id) DO NOTHING`,
		DefaultTenant, DefaultTenant, TenantActive, s.clock.Now().UnixNano()); err != nil {
		return err
	}
	if v.Int64 < schemaVersion {
		if _, err := tx.ExecContext(ctx, `INSERT INTO meta_schema_version (version) VALUES (?)`, schemaVersion); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// redactDSN drops the password from a PostgreSQL URL for messages.
func redactDSN(dsn string) string {
	if at := strings.LastIndex(dsn, "@"); at > 0 {
		if i := strings.Index(dsn, "://"); i > 0 && i < at {
			return dsn[:i+3] + "…" + dsn[at:]
		}
	}
	return dsn
}
