package metadata

import (
	"fmt"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// Scope is one power an API key may hold. Scopes are independent: a key
// holds a set of them and a route needs exactly one (see internal/edge/server
// Route.Scope). A key that should do everything holds all three.
type Scope string

// The scopes.
const (
	// ScopeRead lets a key look: list and get sandboxes, checkpoints, files,
	// processes, events and ports, and wait for a process.
	ScopeRead Scope = "read"
	// ScopeWrite lets a key change its tenant's sandboxes and checkpoints:
	// create, exec, write files, signal, checkpoint, restore, destroy.
	ScopeWrite Scope = "write"
	// ScopeAdmin lets a key manage its tenant's API keys. An admin key of
	// the operator's tenant (DefaultTenant) manages every tenant.
	ScopeAdmin Scope = "admin"
)

// APIKey is a credential of a tenant. Only the SHA-256 of its secret is
// kept (Hash), plus the secret's first characters (Prefix) so that people
// can tell their keys apart; the secret itself is shown once, when the key
// is made, and never stored.
type APIKey struct {
	Tenant string
	// Name is unique within the tenant ("admin" is the operator's key in
	// DATA_DIR/admin.key).
	Name   string
	Hash   string
	Prefix string
	Scopes []Scope
	// Created is set by the store. Expires is when the key stops working
	// (zero: never); Revoked when it was revoked (zero: it was not).
	Created, Expires, Revoked time.Time
}

// Has reports whether k holds scope s.
func (k APIKey) Has(s Scope) bool {
	for _, x := range k.Scopes {
		if x == s {
			return true
		}
	}
	return false
}

// Usable returns nil when k may be used at now, else an ErrUnauthenticated
// that says why (revoked or expired, and when).
func (k APIKey) Usable(now time.Time) error {
	if !k.Revoked.IsZero() {
		return fmt.Errorf("API key %q of tenant %s was revoked at %s: %w", k.Name, k.Tenant, k.Revoked.UTC().Format(time.RFC3339), errdefs.ErrUnauthenticated)
	}
	if !k.Expires.IsZero() && !now.Before(k.Expires) {
		return fmt.Errorf("API key %q of tenant %s expired at %s: %w", k.Name, k.Tenant, k.Expires.UTC().Format(time.RFC3339), errdefs.ErrUnauthenticated)
	}
	return nil
}
