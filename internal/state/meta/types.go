package meta

import "github.com/amber-run/amber/core/metadata"

// The row types are the contract's (core/metadata); these names keep them
// usable as meta.Sandbox, meta.StateRunning, … for the store's callers.
type (
	State              = metadata.State
	Sandbox            = metadata.Sandbox
	Filter             = metadata.Filter
	CheckpointState    = metadata.CheckpointState
	Checkpoint         = metadata.Checkpoint
	CheckpointStats    = metadata.CheckpointStats
	CheckpointFilter   = metadata.CheckpointFilter
	EgressPolicy       = metadata.EgressPolicy
	EgressMode         = metadata.EgressMode
	Idempotent         = metadata.Idempotent
	Scope              = metadata.Scope
	APIKey             = metadata.APIKey
	FailoverAssignment = metadata.FailoverAssignment
	NodeState          = metadata.NodeState
	NodeCapacity       = metadata.NodeCapacity
	Node               = metadata.Node
	Exposure           = metadata.Exposure
	SealedSecret       = metadata.SealedSecret
	Session            = metadata.Session
	Tenant             = metadata.Tenant
	TenantQuota        = metadata.TenantQuota
	TenantPolicy       = metadata.TenantPolicy
)

// The lifecycle states.
const (
	StateCreating  = metadata.StateCreating
	StateRestoring = metadata.StateRestoring
	StateRunning   = metadata.StateRunning
	StateStopped   = metadata.StateStopped
	StateCrashed   = metadata.StateCrashed
	StateDestroyed = metadata.StateDestroyed
)

// What happens to a sandbox at its deadline (metadata.ExpireKill, ExpirePause).
const (
	ExpireKill    = metadata.ExpireKill
	ExpirePause   = metadata.ExpirePause
	ExpireDestroy = metadata.ExpireDestroy
)

// The checkpoint states.
const (
	CheckpointPending   = metadata.CheckpointPending
	CheckpointCommitted = metadata.CheckpointCommitted
	CheckpointFailed    = metadata.CheckpointFailed
	CheckpointDeleted   = metadata.CheckpointDeleted
)

// The scopes.
const (
	ScopeRead  = metadata.ScopeRead
	ScopeWrite = metadata.ScopeWrite
	ScopeAdmin = metadata.ScopeAdmin
)

// The node states.
const (
	NodeLive     = metadata.NodeLive
	NodeDraining = metadata.NodeDraining
	NodeDead     = metadata.NodeDead
	NodeLeft     = metadata.NodeLeft
)

// checkDestPattern validates a "host:port" destination pattern.
func checkDestPattern(s string) error { return metadata.CheckDestPattern(s) }
