package metadata

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
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

// AllScopes lists every scope in canonical order.
var AllScopes = []Scope{ScopeRead, ScopeWrite, ScopeAdmin}

// ParseScopes validates names ("read", "write", "admin"), drops repeats
// and returns them in canonical order. At least one is required.
func ParseScopes(names []string) ([]Scope, error) {
	seen := map[Scope]bool{}
	for _, n := range names {
		s := Scope(strings.TrimSpace(n))
		if !validScope(s) {
			return nil, errdefs.InvalidArgumentf("scope %.20q is not one of read, write, admin", n)
		}
		seen[s] = true
	}
	var out []Scope
	for _, s := range AllScopes {
		if seen[s] {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, errdefs.InvalidArgumentf("a key needs at least one scope (read, write, admin)")
	}
	return out, nil
}

func validScope(s Scope) bool { return s == ScopeRead || s == ScopeWrite || s == ScopeAdmin }

// NewKeySecret returns a new random API key: "amber_" and 43 characters
// of base64url (256 bits).
func NewKeySecret() (string, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	return "amber_" + base64.RawURLEncoding.EncodeToString(raw), nil
}

// KeyPrefix is the part of a secret that lists show: "amber_" and six
// characters (36 of its 256 bits), enough to tell keys apart.
func KeyPrefix(secret string) string {
	if len(secret) > 12 {
		return secret[:12]
	}
	return ""
}

// HashKey returns the stored form of a secret API key.
func HashKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// OperatorKeyName is the name of the operator's key, the one in
// DATA_DIR/admin.key. It is rotated by deleting that file and restarting
// `amber up`, not through the API.
const OperatorKeyName = "admin"

// ValidKeyName checks a key's name: 1 to 64 letters, digits, '.', '_' or '-'.
func ValidKeyName(name string) error {
	if name == "" || len(name) > 64 || strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" {
		return errdefs.InvalidArgumentf("key name %.70q: use 1 to 64 letters, digits, '.', '_' or '-'", name)
	}
	return nil
}
