package sqlmeta

import "github.com/amber-run/amber/core/metadata"

// The row types are the contract's (core/metadata); these names let the
// store's code and tests say Sandbox, StateRunning, ….
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

// Store implements the contract, resource by resource.
var (
	_ metadata.Store       = (*Store)(nil)
	_ metadata.Sandboxes   = (*Store)(nil)
	_ metadata.Checkpoints = (*Store)(nil)
	_ metadata.Egress      = (*Store)(nil)
	_ metadata.Tenants     = (*Store)(nil)
	_ metadata.Keys        = (*Store)(nil)
	_ metadata.Secrets     = (*Store)(nil)
	_ metadata.Nodes       = (*Store)(nil)
	_ metadata.Sessions    = (*Store)(nil)
	_ metadata.Ports       = (*Store)(nil)
	_ metadata.Idempotency = (*Store)(nil)
)
