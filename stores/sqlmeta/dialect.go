package sqlmeta

import (
	"context"
	"database/sql"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/amber-run/amber/lib/failpoint"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
)

// The store's statements are written once, in SQLite's dialect with `?`
// placeholders; db rewrites them for PostgreSQL:
//
//   - `?` placeholders become `$1`, `$2`, … (outside quoted strings);
//   - in DDL, INTEGER becomes BIGINT (times are Unix nanoseconds), BLOB
//     becomes BYTEA and SQLite's STRICT table option is dropped;
//   - Go bool arguments are passed as 0/1: flags are INTEGER columns on both
//     (database/sql scans 0/1 back into a bool).
//
// Statements that have no common spelling (JSON extraction, the schema
// version) branch on s.db.pg at their call site.
type db struct {
	*sql.DB
	pg      bool
	rewrite sync.Map // query → rewritten query (PostgreSQL only)
	// scope is the schema the store lives in (PostgreSQL only): it keys
	// node locks, which the server keeps per database, not per schema.
	scope string
	fps   *failpoint.Set // Options.Failpoints
}

// The failpoints of Options.Failpoints: WritePoint is evaluated before a
// statement outside a transaction (Exec) and before a transaction begins,
// ReadPoint before a query outside a transaction (Query, QueryRow).
// Statements inside a transaction that began are not failed: the database
// is down at the begin or not at all.
const (
	WritePoint = "meta.write"
	ReadPoint  = "meta.read"
)

// fault evaluates point (nil without failpoints) with the call's ctx (a
// failpoint.Hang ends with it); the subject is the statement's first
// word, or "begin".
func (d *db) fault(ctx context.Context, point, query string) error {
	if d.fps == nil {
		return nil
	}
	verb, _, _ := strings.Cut(strings.TrimSpace(query), " ")
	return d.fps.EvalCtx(ctx, point, strings.ToLower(verb))
}

// faultyRow is a *sql.Row that may carry an injected error instead (ReadPoint):
// Scan and Err return it.
type faultyRow struct {
	*sql.Row
	err error
}

func (r *faultyRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	return r.Row.Scan(dest...)
}

func (r *faultyRow) Err() error {
	if r.err != nil {
		return r.err
	}
	return r.Row.Err()
}

func (d *db) q(query string) string {
	if !d.pg {
		return query
	}
	if v, ok := d.rewrite.Load(query); ok {
		return v.(string)
	}
	out := toPostgres(query)
	d.rewrite.Store(query, out)
	return out
}

func (d *db) args(args []any) []any {
	if !d.pg {
		return args
	}
	for i, a := range args {
		if b, ok := a.(bool); ok {
			if b {
				args[i] = int64(1)
			} else {
				args[i] = int64(0)
			}
		}
	}
	return args
}

func (d *db) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := d.fault(ctx, WritePoint, query); err != nil {
		return nil, err
	}
	return d.DB.ExecContext(ctx, d.q(query), d.args(args)...)
}

func (d *db) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := d.fault(ctx, ReadPoint, query); err != nil {
		return nil, err
	}
	return d.DB.QueryContext(ctx, d.q(query), d.args(args)...)
}

func (d *db) QueryRowContext(ctx context.Context, query string, args ...any) *faultyRow {
	if err := d.fault(ctx, ReadPoint, query); err != nil {
		return &faultyRow{err: err}
	}
	return &faultyRow{Row: d.DB.QueryRowContext(ctx, d.q(query), d.args(args)...)}
}

func (d *db) Exec(query string, args ...any) (sql.Result, error) {
	return d.ExecContext(context.Background(), query, args...)
}

func (d *db) QueryRow(query string, args ...any) *faultyRow {
	return d.QueryRowContext(context.Background(), query, args...)
}

// BeginTx starts a transaction whose statements are rewritten like the
// store's.
func (d *db) BeginTx(ctx context.Context, opts *sql.TxOptions) (*tx, error) {
	if err := d.fault(ctx, WritePoint, "begin"); err != nil {
		return nil, err
	}
	t, err := d.DB.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &tx{Tx: t, d: d}, nil
}

func (d *db) Begin() (*tx, error) { return d.BeginTx(context.Background(), nil) }

// tx is a transaction of db.
type tx struct {
	*sql.Tx
	d *db
}

func (t *tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return t.Tx.ExecContext(ctx, t.d.q(query), t.d.args(args)...)
}

func (t *tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return t.Tx.QueryContext(ctx, t.d.q(query), t.d.args(args)...)
}

func (t *tx) QueryRowContext(ctx context.Context, query string, args ...any) *faultyRow {
	return &faultyRow{Row: t.Tx.QueryRowContext(ctx, t.d.q(query), t.d.args(args)...)}
}

func (t *tx) Exec(query string, args ...any) (sql.Result, error) {
	return t.ExecContext(context.Background(), query, args...)
}

var (
	ddlInteger = regexp.MustCompile(`\bINTEGER\b`)
	ddlBlob    = regexp.MustCompile(`\bBLOB\b`)
	ddlStrict  = regexp.MustCompile(`\)\s*STRICT\s*;`)
)

// toPostgres rewrites one statement (or a script of DDL statements).
func toPostgres(query string) string {
	var b strings.Builder
	n := 0
	inQuote := false
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case c == '\'':
			inQuote = !inQuote
			b.WriteByte(c)
		case c == '?' && !inQuote:
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
		default:
			b.WriteByte(c)
		}
	}
	out := b.String()
	if strings.Contains(out, "CREATE TABLE") {
		out = ddlInteger.ReplaceAllString(out, "BIGINT")
		out = ddlBlob.ReplaceAllString(out, "BYTEA")
		out = ddlStrict.ReplaceAllString(out, ");")
	}
	return out
}

// isUnique reports whether err is a unique-constraint violation, in either
// dialect.
func isUnique(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "23505"
	}
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint")
}
