// Package sqlmeta is the daemon's metadata store (the contract
// core/metadata): one row per sandbox it ever made (who owns it, which
// template, which driver, its limits and its lifecycle state), the tenants,
// and the hashes of the API keys it accepts. Its callers reach it through
// internal/state/meta, the domain layer.
//
// It is a SQLite database (modernc.org/sqlite, WAL, synchronous=FULL) in
// DATA_DIR/meta.db, so every acknowledged change survives power loss, or a
// PostgreSQL schema many nodes share (postgres.go): one set of statements,
// rewritten for PostgreSQL by dialect.go. The
// engine writes a sandbox's row before it asks the driver to create anything,
// which is what lets it find every sandbox again after a daemon crash: a
// driver sandbox without a row cannot exist, a row without a driver sandbox is
// a sandbox that was lost (and is marked crashed, never dropped).
//
// Destroyed sandboxes keep their row (state destroyed) so that their history
// stays inspectable; List hides them unless asked.
package sqlmeta

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/lib/failpoint"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// Options configure Open.
type Options struct {
	Clock clock.Clock // default clock.Real
	// Failpoints, when set (tests and `amber chaos` only), are evaluated
	// as the point "meta.write" before every statement run outside a
	// transaction and before every transaction begins: an error there
	// fails the call before the database is touched, as a database that
	// refuses writes for a while would. Reads through QueryRow are not
	// affected. Nil in production: one nil check per call.
	Failpoints *failpoint.Set
}

// Store is the metadata database. It is safe for concurrent use.
type Store struct {
	db    *db
	clock clock.Clock
}

// schemaVersion is stored in PRAGMA user_version.
const schemaVersion = 7

const schema = `
CREATE TABLE IF NOT EXISTS sandboxes (
	id               TEXT PRIMARY KEY,
	tenant           TEXT NOT NULL,
	template         TEXT NOT NULL,
	template_version TEXT NOT NULL,
	driver           TEXT NOT NULL,
	limits           TEXT NOT NULL,
	env              TEXT NOT NULL,
	state            TEXT NOT NULL,
	reason           TEXT NOT NULL,
	pooled           INTEGER NOT NULL,
	from_pool        INTEGER NOT NULL,
	created_ns       INTEGER NOT NULL,
	updated_ns       INTEGER NOT NULL,
	generation       INTEGER NOT NULL DEFAULT 0,
	origin           TEXT NOT NULL DEFAULT '',
	policy           TEXT NOT NULL DEFAULT '',
	node             TEXT NOT NULL DEFAULT '',
	metadata         TEXT NOT NULL DEFAULT '{}',
	expires_ns       INTEGER NOT NULL DEFAULT 0,
	on_expire        TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX IF NOT EXISTS sandboxes_tenant ON sandboxes(tenant, state);
CREATE INDEX IF NOT EXISTS sandboxes_node ON sandboxes(node, state);
` + apiKeysSchema + `
CREATE TABLE IF NOT EXISTS exposures (
	sandbox_id TEXT NOT NULL,
	port       INTEGER NOT NULL,
	tenant     TEXT NOT NULL,
	token_hash TEXT NOT NULL,
	created_ns INTEGER NOT NULL,
	PRIMARY KEY (sandbox_id, port)
) STRICT;
` + checkpointSchema + tenantsSchema + tenantPolicySchema + idempotencySchema + quotaSchema + sandboxEgressSchema + secretsSchema + sessionsSchema + nodesSchema + failoverSchema

// apiKeysSchema is the api_keys table since schema version 3. Times are
// Unix nanoseconds; 0 in expires_ns or revoked_ns means never. scopes is
// a comma-separated list in canonical order ("read,write,admin").
const apiKeysSchema = `
CREATE TABLE IF NOT EXISTS api_keys (
	hash       TEXT PRIMARY KEY,
	tenant     TEXT NOT NULL,
	name       TEXT NOT NULL,
	prefix     TEXT NOT NULL,
	scopes     TEXT NOT NULL,
	created_ns INTEGER NOT NULL,
	expires_ns INTEGER NOT NULL DEFAULT 0,
	revoked_ns INTEGER NOT NULL DEFAULT 0,
	UNIQUE (tenant, name)
) STRICT;`

// migrations[v] brings a database at version v to v+1 before the schema's
// CREATE … IF NOT EXISTS statements run.
var migrations = map[int]string{
	1: `ALTER TABLE sandboxes ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
	    ALTER TABLE sandboxes ADD COLUMN origin TEXT NOT NULL DEFAULT '';
	    ALTER TABLE sandboxes ADD COLUMN policy TEXT NOT NULL DEFAULT '';`,
	// 2 → 3: tenants, and keys with scopes, a prefix, expiry and
	// revocation, unique per tenant. Keys made before scopes existed could
	// do everything, so they keep every scope; every tenant that owns a
	// sandbox or a key gets a row.
	2: strings.ReplaceAll(apiKeysSchema, "api_keys", "api_keys_v3") + `
	    INSERT INTO api_keys_v3 (hash, tenant, name, prefix, scopes, created_ns)
	      SELECT hash, tenant, name, '', 'read,write,admin', created_ns FROM api_keys;
	    DROP TABLE api_keys;
	    ALTER TABLE api_keys_v3 RENAME TO api_keys;` + tenantsSchema + `
	    INSERT OR IGNORE INTO tenants (id, name, state, created_ns)
	      SELECT tenant, tenant, 'active', MIN(created_ns) FROM
	        (SELECT tenant, created_ns FROM api_keys UNION ALL SELECT tenant, created_ns FROM sandboxes WHERE tenant != '')
	      GROUP BY tenant;`,
	// 3 → 4: agent sessions (sessions.go).
	3: sessionsSchema,
	// 4 → 5: the node that runs each sandbox (nodes.go).
	4: `ALTER TABLE sandboxes ADD COLUMN node TEXT NOT NULL DEFAULT '';`,
	// 5 → 6: checkpoints committed on the node before their upload
	// (checkpoints.go; PostgreSQL's own: pgMigrations).
	5: checkpointColumnsV6,
	// 6 → 7: sandboxes' metadata and deadlines.
	6: `ALTER TABLE sandboxes ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';
	    ALTER TABLE sandboxes ADD COLUMN expires_ns INTEGER NOT NULL DEFAULT 0;
	    ALTER TABLE sandboxes ADD COLUMN on_expire TEXT NOT NULL DEFAULT '';`,
}

// Open opens (creating if needed) the store at path: a SQLite file, or,
// when path is a postgres:// (or postgresql://) URL, a PostgreSQL database
// that several nodes share (see OpenPostgres).
func Open(path string, opts Options) (*Store, error) {
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if IsPostgres(path) {
		return openPostgres(path, opts)
	}
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(FULL)", "busy_timeout(10000)", "foreign_keys(1)"} {
		q.Add("_pragma", p)
	}
	q.Set("_txlock", "immediate")
	sqldb, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open meta %s: %w", path, err)
	}
	// One connection: metadata traffic is small, and a single writer never
	// waits on SQLite's busy handler.
	sqldb.SetMaxOpenConns(1)
	s := &Store{db: &db{DB: sqldb}, clock: opts.Clock}
	if err := s.migrate(); err != nil {
		sqldb.Close()
		return nil, fmt.Errorf("open meta %s: %w", path, err)
	}
	s.db.fps = opts.Failpoints // after the migration: a failed Open is not the fault
	return s, nil
}

func (s *Store) migrate() error {
	var v int
	if err := s.db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil {
		return err
	}
	if v > schemaVersion {
		return errdefs.FailedPreconditionf("meta schema version %d is newer than this binary's %d; upgrade amber", v, schemaVersion)
	}
	for ; v > 0 && v < schemaVersion; v++ {
		if err := s.migrateOne(v); err != nil {
			return fmt.Errorf("migrate schema %d to %d: %w", v, v+1, err)
		}
	}
	if _, err := s.db.Exec(schema); err != nil {
		return err
	}
	// The operator's tenant always exists.
	if _, err := s.db.Exec(`INSERT INTO tenants (id, name, state, created_ns) VALUES (?, ?, ?, ?) ON CONFLICT(id) DO NOTHING`,
		DefaultTenant, DefaultTenant, TenantActive, s.clock.Now().UnixNano()); err != nil {
		return err
	}
	_, err := s.db.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, schemaVersion))
	return err
}

// migrationAlters names the table migrations[v] alters: a database
// without it (older than the table) skips the migration, and the schema
// creates the table whole.
var migrationAlters = map[int]string{5: "checkpoints"}

// migrateOne applies migrations[v] and records version v+1 in one
// transaction, so a crash leaves the database at v or at v+1, never between.
func (s *Store) migrateOne(v int) error {
	tx, err := s.db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	run := true
	if table, ok := migrationAlters[v]; ok {
		var n int
		if err := tx.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, table).Scan(&n); err != nil {
			return err
		}
		run = n > 0
	}
	if run {
		if _, err := tx.Exec(migrations[v]); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, v+1)); err != nil {
		return err
	}
	return tx.Commit()
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

const cols = `id, tenant, template, template_version, driver, limits, env, state, reason, pooled, from_pool, created_ns, updated_ns, generation, origin, policy, node, metadata, expires_ns, on_expire`

// Insert adds a new sandbox row. Created and Updated are set from the clock.
func (s *Store) Insert(ctx context.Context, sb Sandbox) (Sandbox, error) {
	if sb.ID == "" || sb.Template == "" || sb.Driver == "" || sb.State == "" {
		return sb, errdefs.InvalidArgumentf("meta insert: id, template, driver and state are required")
	}
	now := s.clock.Now()
	sb.Created, sb.Updated = now, now
	limits, _ := json.Marshal(sb.Limits)
	env, _ := json.Marshal(nonNil(sb.Env))
	md, _ := json.Marshal(nonNilMap(sb.Metadata))
	_, err := s.db.ExecContext(ctx, `INSERT INTO sandboxes (`+cols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		sb.ID, sb.Tenant, sb.Template, sb.TemplateVersion, sb.Driver, string(limits), string(env),
		string(sb.State), sb.Reason, sb.Pooled, sb.FromPool, now.UnixNano(), now.UnixNano(), sb.Generation, sb.Origin, sb.Policy, sb.Node,
		string(md), unixNano(sb.Expires), sb.OnExpire)
	if err != nil {
		if isUnique(err) {
			return sb, errdefs.AlreadyExistsf("sandbox %s", sb.ID)
		}
		return sb, fmt.Errorf("meta insert %s: %w", sb.ID, err)
	}
	return sb, nil
}

// Get returns the sandbox with id (ErrNotFound if there is none).
func (s *Store) Get(ctx context.Context, id string) (Sandbox, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+cols+` FROM sandboxes WHERE id = ?`, id)
	sb, err := scan(row)
	if errors.Is(err, sql.ErrNoRows) {
		return sb, errdefs.NotFoundf("sandbox %s", id)
	}
	return sb, err
}

// List returns the sandboxes matching f, oldest first.
func (s *Store) List(ctx context.Context, f Filter) ([]Sandbox, error) {
	var where []string
	var args []any
	if f.Tenant != nil {
		where = append(where, "tenant = ?")
		args = append(args, *f.Tenant)
	}
	if f.Pooled != nil {
		where = append(where, "pooled = ?")
		args = append(args, *f.Pooled)
	}
	if f.Node != nil {
		where = append(where, "node = ?")
		args = append(args, *f.Node)
	}
	if len(f.States) > 0 {
		where = append(where, "state IN ("+strings.TrimSuffix(strings.Repeat("?,", len(f.States)), ",")+")")
		for _, st := range f.States {
			args = append(args, string(st))
		}
	} else {
		where = append(where, "state != ?")
		args = append(args, string(StateDestroyed))
	}
	if !f.ExpiredBy.IsZero() {
		where = append(where, "expires_ns > 0 AND expires_ns <= ?")
		args = append(args, f.ExpiredBy.UnixNano())
	}
	q := `SELECT ` + cols + ` FROM sandboxes WHERE ` + strings.Join(where, " AND ") + ` ORDER BY created_ns, id`
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("meta list: %w", err)
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scan(rows)
		if err != nil {
			return nil, err
		}
		if metadata.Matches(sb.Metadata, f.Metadata) {
			out = append(out, sb)
		}
	}
	return out, rows.Err()
}

// SetState moves sandbox id to state to, with reason, provided it is in one
// of the states from (any state when from is empty). It returns the updated
// row, or ErrFailedPrecondition naming the current state when the sandbox is
// elsewhere (another call moved it first).
func (s *Store) SetState(ctx context.Context, id string, to State, reason string, from ...State) (Sandbox, error) {
	q := `UPDATE sandboxes SET state = ?, reason = ?, updated_ns = ? WHERE id = ?`
	args := []any{string(to), reason, s.clock.Now().UnixNano(), id}
	if len(from) > 0 {
		q += ` AND state IN (` + strings.TrimSuffix(strings.Repeat("?,", len(from)), ",") + `)`
		for _, st := range from {
			args = append(args, string(st))
		}
	}
	if to == StateDestroyed {
		q = strings.Replace(q, "SET state", "SET pooled = 0, state", 1)
	}
	return s.update(ctx, id, fmt.Sprintf("set state %s", to), q, args...)
}

// Restored records that sandbox id runs again, restored in place from
// checkpoint origin: running, one generation on. It must be restoring.
func (s *Store) Restored(ctx context.Context, id, origin string) (Sandbox, error) {
	return s.update(ctx, id, "restored",
		`UPDATE sandboxes SET state = ?, reason = '', generation = generation + 1, origin = ?, updated_ns = ?
		 WHERE id = ? AND state = ?`,
		string(StateRunning), origin, s.clock.Now().UnixNano(), id, string(StateRestoring))
}

// SetPolicy sets sandbox id's recovery policy.
func (s *Store) SetPolicy(ctx context.Context, id, policy string) (Sandbox, error) {
	return s.update(ctx, id, "set policy", `UPDATE sandboxes SET policy = ?, updated_ns = ? WHERE id = ?`,
		policy, s.clock.Now().UnixNano(), id)
}

// SetMetadata replaces sandbox id's metadata (nil: none).
func (s *Store) SetMetadata(ctx context.Context, id string, md map[string]string) (Sandbox, error) {
	b, _ := json.Marshal(nonNilMap(md))
	return s.update(ctx, id, "set metadata", `UPDATE sandboxes SET metadata = ?, updated_ns = ? WHERE id = ?`,
		string(b), s.clock.Now().UnixNano(), id)
}

// SetExpiry sets sandbox id's deadline (zero: none) and what happens at it.
func (s *Store) SetExpiry(ctx context.Context, id string, expires time.Time, onExpire string) (Sandbox, error) {
	return s.update(ctx, id, "set expiry", `UPDATE sandboxes SET expires_ns = ?, on_expire = ?, updated_ns = ? WHERE id = ?`,
		unixNano(expires), onExpire, s.clock.Now().UnixNano(), id)
}

// Claim gives the pooled, running sandbox id to tenant with the limits and
// env it is claimed with; its Created becomes the claim time (when the
// tenant got it). It fails with ErrFailedPrecondition when id is not
// (any more) a ready pooled sandbox, so two claims never get the same one.
func (s *Store) Claim(ctx context.Context, id, tenant string, limits sandbox.Limits, env []string) (Sandbox, error) {
	if tenant == "" {
		return Sandbox{}, errdefs.InvalidArgumentf("claim %s: tenant is empty", id)
	}
	l, _ := json.Marshal(limits)
	e, _ := json.Marshal(nonNil(env))
	now := s.clock.Now().UnixNano()
	return s.update(ctx, id, "claim",
		`UPDATE sandboxes SET tenant = ?, limits = ?, env = ?, pooled = 0, from_pool = 1, created_ns = ?, updated_ns = ?
		 WHERE id = ? AND pooled = 1 AND state = ?`,
		tenant, string(l), string(e), now, now, id, string(StateRunning))
}

func (s *Store) update(ctx context.Context, id, what, q string, args ...any) (Sandbox, error) {
	res, err := s.db.ExecContext(ctx, q, args...)
	if err != nil {
		return Sandbox{}, fmt.Errorf("meta %s %s: %w", what, id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return Sandbox{}, fmt.Errorf("meta %s %s: %w", what, id, err)
	}
	cur, gerr := s.Get(ctx, id)
	if gerr != nil {
		return cur, gerr
	}
	if n == 0 {
		return cur, errdefs.FailedPreconditionf("%s sandbox %s: it is %s (pooled=%t)", what, id, cur.State, cur.Pooled)
	}
	return cur, nil
}

type scanner interface{ Scan(dest ...any) error }

func scan(r scanner) (Sandbox, error) {
	var sb Sandbox
	var limits, env, state, md string
	var created, updated, expires int64
	err := r.Scan(&sb.ID, &sb.Tenant, &sb.Template, &sb.TemplateVersion, &sb.Driver, &limits, &env,
		&state, &sb.Reason, &sb.Pooled, &sb.FromPool, &created, &updated, &sb.Generation, &sb.Origin, &sb.Policy, &sb.Node,
		&md, &expires, &sb.OnExpire)
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return sb, err
		}
		return sb, fmt.Errorf("meta scan: %w", err)
	}
	if err := json.Unmarshal([]byte(limits), &sb.Limits); err != nil {
		return sb, errdefs.DataLossf("meta: sandbox %s has undecodable limits: %v", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(env), &sb.Env); err != nil {
		return sb, errdefs.DataLossf("meta: sandbox %s has undecodable env: %v", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(md), &sb.Metadata); err != nil {
		return sb, errdefs.DataLossf("meta: sandbox %s has undecodable metadata: %v", sb.ID, err)
	}
	if len(sb.Metadata) == 0 {
		sb.Metadata = nil
	}
	if expires > 0 {
		sb.Expires = time.Unix(0, expires).UTC()
	}
	sb.State = State(state)
	sb.Created = time.Unix(0, created).UTC()
	sb.Updated = time.Unix(0, updated).UTC()
	return sb, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func nonNilMap(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// unixNano is t in Unix nanoseconds, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
