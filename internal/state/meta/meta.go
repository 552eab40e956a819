// Package meta is the daemon's metadata: the domain's names for the rows of
// core/metadata (meta.Sandbox, meta.StateRunning, …), the helpers of the
// domain that need no database (Place, HashKey, ParseScopes, …), and Open,
// which opens the store the rows live in: stores/sqlmeta, on SQLite
// (DATA_DIR/meta.db) or PostgreSQL. Its callers (engine, server, session,
// cluster, cmd/amber) use *Store, which implements metadata.Store; the
// durability and the lifecycle of the rows are written down there and in
// core/metadata.
package meta

import (
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/stores/sqlmeta"
)

// Store is the metadata database (stores/sqlmeta). It is safe for
// concurrent use.
type Store = sqlmeta.Store

// Options configure Open (see sqlmeta.Options).
type Options = sqlmeta.Options

// NodeLock is a node's liveness lock on PostgreSQL (see sqlmeta.NodeLock).
type NodeLock = sqlmeta.NodeLock

var _ metadata.Store = (*Store)(nil)

// Open opens (creating if needed) the store at path: a SQLite file, or,
// when path is a postgres:// (or postgresql://) URL, a PostgreSQL database
// that several nodes share.
func Open(path string, opts Options) (*Store, error) { return sqlmeta.Open(path, opts) }

// IsPostgres reports whether spec names a PostgreSQL database rather than a
// SQLite file.
func IsPostgres(spec string) bool { return sqlmeta.IsPostgres(spec) }

// DefaultTenant is the operator's tenant (metadata.DefaultTenant).
const DefaultTenant = metadata.DefaultTenant

// OperatorKeyName is the name of the operator's key, the one in
// DATA_DIR/admin.key (sqlmeta.OperatorKeyName).
const OperatorKeyName = sqlmeta.OperatorKeyName

// TenantActive is the state of a tenant whose keys work (metadata.TenantActive).
const TenantActive = metadata.TenantActive

// AllScopes lists every scope in canonical order.
var AllScopes = sqlmeta.AllScopes

// ParseScopes validates names ("read", "write", "admin"), drops repeats
// and returns them in canonical order. At least one is required.
func ParseScopes(names []string) ([]Scope, error) { return sqlmeta.ParseScopes(names) }

// NewKeySecret returns a new random API key: "amber_" and 43 characters
// of base64url (256 bits).
func NewKeySecret() (string, error) { return sqlmeta.NewKeySecret() }

// KeyPrefix is the part of a secret that lists show: "amber_" and six
// characters.
func KeyPrefix(secret string) string { return sqlmeta.KeyPrefix(secret) }

// HashKey returns the stored form of a secret API key.
func HashKey(secret string) string { return sqlmeta.HashKey(secret) }

// ValidKeyName checks a key's name: 1 to 64 letters, digits, '.', '_' or '-'.
func ValidKeyName(name string) error { return sqlmeta.ValidKeyName(name) }

// ValidTenantID checks a tenant id: 1 to 40 lower-case letters, digits or
// '-', starting with a letter or digit.
func ValidTenantID(id string) error { return sqlmeta.ValidTenantID(id) }

// ValidIdempotencyKey checks an Idempotency-Key header value.
func ValidIdempotencyKey(k string) error { return sqlmeta.ValidIdempotencyKey(k) }
