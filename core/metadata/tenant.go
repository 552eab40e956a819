package metadata

import (
	"math"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// TenantQuota bounds what a tenant may use. Zero fields mean no limit.
// Only the operator sets it (a tenant's own keys may read it).
type TenantQuota struct {
	// Sandboxes not destroyed (running, stopped, crashed), forks included.
	MaxSandboxes int `json:"max_sandboxes,omitempty"`
	// The sum of those sandboxes' memory and CPU limits.
	MaxMemoryBytes int64 `json:"max_memory_bytes,omitempty"`
	MaxMilliCPUs   int64 `json:"max_millicpus,omitempty"`
	// Bytes the tenant's committed checkpoints added to the store.
	MaxCheckpointBytes int64 `json:"max_checkpoint_bytes,omitempty"`
	// API requests per second (a burst of twice as many is allowed).
	RequestsPerSecond float64 `json:"requests_per_second,omitempty"`
	// Budgets bound what the tenant may consume per calendar month (UTC),
	// by usage meter name (engine.Meters). Enforced from the usage records
	// (engine/budget.go).
	Budgets map[string]float64 `json:"budgets,omitempty"`
}

// Check validates q.
func (q TenantQuota) Check() error {
	if q.MaxSandboxes < 0 || q.MaxMemoryBytes < 0 || q.MaxMilliCPUs < 0 || q.MaxCheckpointBytes < 0 || q.RequestsPerSecond < 0 {
		return errdefs.InvalidArgumentf("quota values must not be negative (0 means no limit)")
	}
	if len(q.Budgets) > 64 {
		return errdefs.InvalidArgumentf("at most 64 budgets")
	}
	for m, v := range q.Budgets {
		if !(v > 0) || math.IsInf(v, 0) {
			return errdefs.InvalidArgumentf("budget %q: %v is not a positive number (remove a budget to lift it)", m, v)
		}
	}
	return nil
}

// TenantPolicy is a tenant's recovery policy: how its sandboxes are
// checkpointed, kept and stopped ("finance wants 99.99 %, education wants
// low latency"). Zero fields mean the daemon's defaults.
type TenantPolicy struct {
	// Recovery is the policy of sandboxes created without one: "" (none),
	// "fast" or "strict".
	Recovery string `json:"recovery,omitempty"`
	// FastEvery and FastInterval tune the fast policy.
	FastEvery    int           `json:"fast_every,omitempty"`
	FastInterval time.Duration `json:"fast_interval_ns,omitempty"`
	// FastReplayBudget: a fast checkpoint is due once the execs since the
	// last one ran this long in all (the adaptive cut, policy.go).
	FastReplayBudget time.Duration `json:"fast_replay_budget_ns,omitempty"`
	// KeepCheckpoints keeps each sandbox's newest N (plus tagged ones).
	KeepCheckpoints int `json:"keep_checkpoints,omitempty"`
	// IdleTimeout checkpoints and stops a sandbox idle this long.
	IdleTimeout time.Duration `json:"idle_timeout_ns,omitempty"`
	// Egress is the egress policy of the tenant's sandboxes that have none
	// of their own (nil: the daemon's default).
	Egress *EgressPolicy `json:"egress,omitempty"`
}

// Check validates p's ranges (the recovery name is the engine's to check).
func (p TenantPolicy) Check() error {
	switch {
	case p.FastEvery < 0 || p.FastEvery > 1_000_000:
		return errdefs.InvalidArgumentf("fast_every %d: want 0 (the default) to 1000000", p.FastEvery)
	case p.FastInterval < 0 || (p.FastInterval > 0 && p.FastInterval < 100*time.Millisecond):
		return errdefs.InvalidArgumentf("fast interval %v: want 0 (the default) or at least 100ms", p.FastInterval)
	case p.FastReplayBudget < 0 || (p.FastReplayBudget > 0 && p.FastReplayBudget < 100*time.Millisecond):
		return errdefs.InvalidArgumentf("fast replay budget %v: want 0 (the default) or at least 100ms", p.FastReplayBudget)
	case p.KeepCheckpoints < 0 || p.KeepCheckpoints > 10_000:
		return errdefs.InvalidArgumentf("keep_checkpoints %d: want 0 (keep all) to 10000", p.KeepCheckpoints)
	case p.IdleTimeout < 0 || (p.IdleTimeout > 0 && p.IdleTimeout < time.Second):
		return errdefs.InvalidArgumentf("idle timeout %v: want 0 (the default) or at least 1s", p.IdleTimeout)
	}
	if p.Egress != nil {
		return p.Egress.Check()
	}
	return nil
}

// DefaultTenant is the operator's tenant. It always exists; the key
// `amber up` writes to DATA_DIR/admin.key belongs to it, and an admin-scoped
// key of it may manage every tenant.
const DefaultTenant = "default"

// TenantActive is the state of a tenant whose keys work. (It is the only
// state so far; the column is there for suspension.)
const TenantActive = "active"

// Tenant is one row of the tenants table: a team that shares the daemon.
// Its sandboxes, checkpoints and keys carry its ID.
type Tenant struct {
	ID      string
	Name    string // for people; defaults to ID
	State   string
	Created time.Time
}

// ValidTenantID checks a tenant id: 1 to 40 lower-case letters, digits or
// '-', starting with a letter or digit (it appears in blob paths and URLs).
func ValidTenantID(id string) error {
	if id == "" || len(id) > 40 || id[0] == '-' || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
		return errdefs.InvalidArgumentf("tenant id %.50q: use 1 to 40 lower-case letters, digits or '-', not starting with '-'", id)
	}
	return nil
}
