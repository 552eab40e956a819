// Package meta is the domain's vocabulary over the metadata store: the
// domain's names for the rows of core/metadata (meta.Sandbox,
// meta.StateRunning, …) and the helpers of the domain that need no database
// (Place, HashKey, ParseScopes, …: core/metadata's). The store itself is the contract
// metadata.Store (core/metadata), whose durability and row lifecycles are
// written down there; its backend (stores/sqlmeta, on SQLite or PostgreSQL)
// is chosen and opened by cmd/amber alone, so nothing here knows SQL.
package meta

import (
	"time"

	"github.com/amber-run/amber/core/metadata"
)

// DefaultTenant is the operator's tenant (metadata.DefaultTenant).
const DefaultTenant = metadata.DefaultTenant

// OperatorKeyName is the name of the operator's key, the one in
// DATA_DIR/admin.key (metadata.OperatorKeyName).
const OperatorKeyName = metadata.OperatorKeyName

// TenantActive is the state of a tenant whose keys work (metadata.TenantActive).
const TenantActive = metadata.TenantActive

// AllScopes lists every scope in canonical order.
var AllScopes = metadata.AllScopes

// ParseScopes validates names ("read", "write", "admin"), drops repeats
// and returns them in canonical order. At least one is required.
func ParseScopes(names []string) ([]Scope, error) { return metadata.ParseScopes(names) }

// NewKeySecret returns a new random API key: "amber_" and 43 characters
// of base64url (256 bits).
func NewKeySecret() (string, error) { return metadata.NewKeySecret() }

// KeyPrefix is the part of a secret that lists show: "amber_" and six
// characters.
func KeyPrefix(secret string) string { return metadata.KeyPrefix(secret) }

// HashKey returns the stored form of a secret API key.
func HashKey(secret string) string { return metadata.HashKey(secret) }

// ValidKeyName checks a key's name: 1 to 64 letters, digits, '.', '_' or '-'.
func ValidKeyName(name string) error { return metadata.ValidKeyName(name) }

// ValidTenantID checks a tenant id: 1 to 40 lower-case letters, digits or
// '-', starting with a letter or digit.
func ValidTenantID(id string) error { return metadata.ValidTenantID(id) }

// ValidIdempotencyKey checks an Idempotency-Key header value.
func ValidIdempotencyKey(k string) error { return metadata.ValidIdempotencyKey(k) }

// Place picks the node for a new sandbox of template among nodes, leaving
// out node exclude (metadata.Place: the rule of placement, and the errors
// without a candidate).
func Place(nodes []Node, exclude, template string, now time.Time) (Node, error) {
	return metadata.Place(nodes, exclude, template, now)
}
