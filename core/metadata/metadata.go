// Package metadata is the contract of Amber's metadata store: the rows the
// daemon keeps of its sandboxes, checkpoints, tenants and their keys,
// quotas, policies and secrets, nodes and failover plans, agent sessions,
// exposed ports and idempotent answers. The event log (core/eventlog) is the
// truth of what happened; this store is the index the daemon consults to
// find, own and list things, and the place of the compare-and-set moves
// (a sandbox's state, a node's claim, a pooled sandbox's claim) that must
// have exactly one winner.
//
// # Resources
//
// The store is grouped per resource, containerd-style: Sandboxes,
// Checkpoints, Egress (a sandbox's own egress policy and gateway run),
// Tenants (with quotas and policies), Keys, Secrets, Nodes (with failover
// plans), Sessions, Ports and Idempotency. Store is all of them; a caller
// that needs one resource takes that one interface.
//
// # Errors
//
// Methods fail with the kinds of core/errdefs: ErrNotFound for a missing
// row, ErrAlreadyExists for a taken id or name, ErrFailedPrecondition when a
// compare-and-set finds the row elsewhere (naming where), ErrFenced when a
// node's epoch or a sandbox's node no longer matches, ErrInvalidArgument for
// malformed input, checked before anything is written.
//
// # Durability
//
// A method that returns nil has made its change durable: it survives a
// crash of the daemon and a power loss of the database's host. Every
// acknowledged write is visible to every later read, from any node sharing
// the store. Times are the store's clock, never the database server's.
//
// # Backends
//
// stores/sqlmeta implements Store over SQLite (DATA_DIR/meta.db) and
// PostgreSQL (a shared deployment); the conformance suite
// core/metadata/metatest runs against both, and a data dir or schema made by
// an earlier version opens and serves unchanged (the schemas migrate
// forward, never back). internal/state/meta is the domain layer over it.
package metadata

import (
	"context"
	"io"
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// Store is the whole metadata store.
type Store interface {
	Sandboxes
	Checkpoints
	Egress
	Tenants
	Keys
	Secrets
	Nodes
	Sessions
	Ports
	Idempotency
	io.Closer
}

// Sandboxes are the sandbox rows. Destroyed sandboxes keep their row (state
// destroyed) as history; List hides them unless asked.
type Sandboxes interface {
	// Insert adds a new sandbox row. Created and Updated are set from the clock.
	Insert(ctx context.Context, sb Sandbox) (Sandbox, error)
	// Get returns the sandbox with id (ErrNotFound if there is none).
	Get(ctx context.Context, id string) (Sandbox, error)
	// List returns the sandboxes matching f, oldest first.
	List(ctx context.Context, f Filter) ([]Sandbox, error)
	// SetState moves sandbox id to state to, with reason, provided it is in one
	// of the states from (any state when from is empty). It returns the updated
	// row, or ErrFailedPrecondition naming the current state when the sandbox is
	// elsewhere (another call moved it first).
	SetState(ctx context.Context, id string, to State, reason string, from ...State) (Sandbox, error)
	// Restored records that sandbox id runs again, restored in place from
	// checkpoint origin: running, one generation on. It must be restoring.
	Restored(ctx context.Context, id, origin string) (Sandbox, error)
	// SetPolicy sets sandbox id's recovery policy.
	SetPolicy(ctx context.Context, id, policy string) (Sandbox, error)
	// SetMetadata replaces sandbox id's metadata (nil: none).
	SetMetadata(ctx context.Context, id string, md map[string]string) (Sandbox, error)
	// SetExpiry sets sandbox id's deadline (zero: none) and what happens
	// at it (ExpireKill or ExpirePause).
	SetExpiry(ctx context.Context, id string, expires time.Time, onExpire string) (Sandbox, error)
	// Claim gives the pooled, running sandbox id to tenant with the limits and
	// env it is claimed with; its Created becomes the claim time (when the
	// tenant got it). It fails with ErrFailedPrecondition when id is not
	// (any more) a ready pooled sandbox, so two claims never get the same one.
	Claim(ctx context.Context, id, tenant string, limits sandbox.Limits, env []string) (Sandbox, error)
	// MoveSandbox moves sandbox id from node from to node to; it fails with
	// ErrFenced when the row is no longer on from (another node moved it
	// first).
	MoveSandbox(ctx context.Context, id, from, to string) (Sandbox, error)
}

// Checkpoints are the checkpoint rows (see CheckpointState for their life).
type Checkpoints interface {
	// InsertCheckpoint records a new checkpoint (normally pending).
	InsertCheckpoint(ctx context.Context, c Checkpoint) (Checkpoint, error)
	// Checkpoint returns the checkpoint with id (ErrNotFound if there is none).
	Checkpoint(ctx context.Context, id string) (Checkpoint, error)
	// Checkpoints returns the matching checkpoints, oldest first.
	Checkpoints(ctx context.Context, f CheckpointFilter) ([]Checkpoint, error)
	// CommitCheckpoint marks pending checkpoint c.ID committed with c's digests,
	// event position and stats, and its UploadPending and HotDigest.
	CommitCheckpoint(ctx context.Context, c Checkpoint) (Checkpoint, error)
	// SetCheckpointState moves checkpoint id to state to with reason, provided
	// it is in one of from (any when empty).
	SetCheckpointState(ctx context.Context, id string, to CheckpointState, reason string, from ...CheckpointState) (Checkpoint, error)
	// FinishUpload records that committed checkpoint c.ID, committed with
	// its upload pending (Checkpoint.UploadPending), is in the blob store:
	// c's manifest and image digests and stats, and the mark cleared.
	// ErrFailedPrecondition unless the row is committed with the mark set.
	FinishUpload(ctx context.Context, c Checkpoint) (Checkpoint, error)
}

// Egress is a sandbox's own egress policy and the gateway run its traffic
// is numbered in.
type Egress interface {
	// SetSandboxEgress records sandbox's own egress policy (nil: follow the
	// tenant's).
	SetSandboxEgress(ctx context.Context, sandbox string, p *EgressPolicy) error
	// SandboxEgress returns sandbox's own egress policy (nil if it follows
	// its tenant's) and its current gateway run ("" if none yet).
	SandboxEgress(ctx context.Context, sandbox string) (*EgressPolicy, string, error)
	// SetEgressRun records the gateway run sandbox's traffic is numbered in.
	// The engine writes it before it starts the run, so a daemon that restarts
	// continues the run the sandbox is in.
	SetEgressRun(ctx context.Context, sandbox, run string) error
}

// Tenants are the tenant rows, with each tenant's quota and policy.
type Tenants interface {
	// CreateTenant adds tenant t (ErrAlreadyExists if its id is taken). Name
	// defaults to the id; the state is active.
	CreateTenant(ctx context.Context, t Tenant) (Tenant, error)
	// GetTenant returns tenant id (ErrNotFound if there is none).
	GetTenant(ctx context.Context, id string) (Tenant, error)
	// ListTenants returns every tenant, oldest first.
	ListTenants(ctx context.Context) ([]Tenant, error)
	// TenantQuota returns tenant's quota (no limits if none was set).
	TenantQuota(ctx context.Context, tenant string) (TenantQuota, error)
	// SetTenantQuota replaces tenant's quota; the tenant must exist.
	SetTenantQuota(ctx context.Context, tenant string, q TenantQuota) error
	// CheckpointBytes is what tenant's committed checkpoints added to the store.
	CheckpointBytes(ctx context.Context, tenant string) (int64, error)
	// TenantPolicy returns tenant's policy (the zero policy if none was set).
	TenantPolicy(ctx context.Context, tenant string) (TenantPolicy, error)
	// SetTenantPolicy replaces tenant's policy; the tenant must exist.
	SetTenantPolicy(ctx context.Context, tenant string, p TenantPolicy) error
}

// Keys are the tenants' API keys: only their hashes (APIKey).
type Keys interface {
	// PutKey stores k, replacing the key of the same tenant and name if there
	// is one (which stops being accepted at once); the stored key is neither
	// revoked nor expired unless k says so. It is how `amber up` (re)registers
	// the operator's key; API-made keys use CreateKey.
	PutKey(ctx context.Context, k APIKey) error
	// CreateKey adds k to its tenant, which must exist (ErrNotFound). A name
	// already used in the tenant, by a live or a revoked key, is
	// ErrAlreadyExists: names stay attached to their history. It returns the
	// key as stored.
	CreateKey(ctx context.Context, k APIKey) (APIKey, error)
	// RevokeKey revokes tenant's key name; it is refused from then on. Revoking
	// a revoked key changes nothing (it keeps its first revocation time).
	RevokeKey(ctx context.Context, tenant, name string) (APIKey, error)
	// ListKeys returns tenant's keys, revoked and expired ones included,
	// oldest first.
	ListKeys(ctx context.Context, tenant string) ([]APIKey, error)
	// KeyByName returns tenant's key called name (ErrNotFound if none).
	KeyByName(ctx context.Context, tenant, name string) (APIKey, error)
	// KeyByHash returns the key whose hash is hash (ErrNotFound if none),
	// revoked and expired keys included: the caller decides (APIKey.Usable).
	KeyByHash(ctx context.Context, hash string) (APIKey, error)
}

// Secrets are tenants' secrets and egress CAs, sealed by the caller: the
// store never sees a plaintext value or private key.
type Secrets interface {
	// PutSecret stores (or replaces) a sealed secret.
	PutSecret(ctx context.Context, x SealedSecret) error
	// GetSecret returns tenant's sealed secret name (ErrNotFound if none).
	GetSecret(ctx context.Context, tenant, name string) (SealedSecret, error)
	// ListSecrets lists tenant's secrets, sealed values left out.
	ListSecrets(ctx context.Context, tenant string) ([]SealedSecret, error)
	// DeleteSecret removes tenant's secret name (ErrNotFound if none).
	DeleteSecret(ctx context.Context, tenant, name string) error
	// TenantCA returns tenant's egress CA: its certificate and sealed key
	// (ErrNotFound if none yet).
	TenantCA(ctx context.Context, tenant string) (certPEM, sealedKey []byte, err error)
	// InsertTenantCA records tenant's CA unless it has one; it returns the one
	// recorded (the first writer wins a race).
	InsertTenantCA(ctx context.Context, tenant string, certPEM, sealedKey []byte) ([]byte, []byte, error)
}

// Nodes are the node rows of a deployment on shared stores: each node
// registers with a lease its heartbeat renews and an epoch that counts its
// registrations; a node whose lease expired is claimed by exactly one other
// node, which records in the same transaction the plan that spreads the dead
// node's sandboxes (FailoverAssignment). The plan only says who should try
// first: the takeover stays one winner by the event log's leases and the
// sandbox row's compare-and-set (MoveSandbox).
type Nodes interface {
	// RegisterNode records that node n runs from now with a lease of ttl, one
	// epoch above its previous registration (1 for a new node). A node that
	// is still live cannot register twice: while its lease runs the call fails
	// with ErrConflict (two daemons with the same --node-id).
	RegisterNode(ctx context.Context, n Node, ttl time.Duration) (Node, error)
	// HeartbeatNode renews node id's lease at epoch to now+ttl and records its
	// capacity. It fails with ErrFenced when the row is no longer at epoch or
	// no longer live (another node claimed it as dead): the caller must stop
	// acting for its sandboxes.
	HeartbeatNode(ctx context.Context, id string, epoch uint64, ttl time.Duration, c NodeCapacity) error
	// SetNodeState moves node id at epoch to state (draining, live, or left
	// when it stops cleanly). Draining cordons the node and live uncordons it,
	// in the same transaction: a drained node registers draining again when it
	// restarts, until it is undrained.
	SetNodeState(ctx context.Context, id string, epoch uint64, state NodeState) error
	// ClaimDeadNode marks node id (at epoch) dead and claimed by by, provided
	// its lease expired before now, and records plan in the same transaction,
	// so that a claimer that dies right after its claim leaves a plan the
	// others can finish. Of several nodes claiming the same dead node, exactly
	// one gets true.
	ClaimDeadNode(ctx context.Context, id string, epoch uint64, by string, plan ...FailoverAssignment) (bool, error)
	// ClaimLostNode marks node id (at epoch) dead and claimed by by before its
	// lease expired, provided its row still shows the heartbeat the caller saw
	// (heartbeat): the caller found its liveness lock free after that
	// heartbeat was due again. A node that renewed meanwhile is not claimed.
	// plan is recorded with the claim (ClaimDeadNode). Of several nodes
	// claiming it, one wins (true).
	ClaimLostNode(ctx context.Context, id string, epoch uint64, heartbeat time.Time, by string, plan ...FailoverAssignment) (bool, error)
	// NodeLockHeld reports whether some session holds node id's liveness
	// lock. supported is false where there is no such lock (SQLite: the
	// lease decides).
	NodeLockHeld(ctx context.Context, id string) (held, supported bool, err error)
	// NodeLock returns node id's liveness lock, not yet taken (NodeLock.Ensure
	// takes it). Its node holds it for as long as its process lives, so the
	// others may claim a node that lost it and missed a heartbeat before its
	// lease expires (ClaimLostNode); where there is no such lock (SQLite)
	// Ensure reports false and the lease decides.
	NodeLock(id string) NodeLock
	// GetNode returns node id's row.
	GetNode(ctx context.Context, id string) (Node, error)
	// ListNodes returns every node row, by id.
	ListNodes(ctx context.Context) ([]Node, error)
	// PendingFailovers returns the assignments whose sandbox is still on its
	// dead node (not taken over yet, not destroyed), by sandbox id.
	PendingFailovers(ctx context.Context) ([]FailoverAssignment, error)
	// ReassignFailover moves assignment a to target to, provided it is still
	// a's (compare-and-set on its target): of several nodes that found a's
	// target down, one wins (true).
	ReassignFailover(ctx context.Context, a FailoverAssignment, to string) (bool, error)
	// DropDoneFailovers deletes the assignments whose sandbox is no longer on
	// its dead node (taken over, by its target or anyone) or is gone.
	DropDoneFailovers(ctx context.Context) error
}

// Sessions are the index rows of agent sessions. A session's log stream is
// the truth; its row's Status and SandboxID are copies written after the
// log.
type Sessions interface {
	// InsertSession adds a session row; Created and Updated come from the clock.
	InsertSession(ctx context.Context, se Session) (Session, error)
	// GetSession returns session id (ErrNotFound if there is none).
	GetSession(ctx context.Context, id string) (Session, error)
	// ListSessions returns tenant's sessions oldest first (every tenant's when
	// tenant is ""), optionally only those in one of statuses.
	ListSessions(ctx context.Context, tenant string, statuses ...string) ([]Session, error)
	// SandboxSessions returns the sessions whose sandbox is sandboxID, those
	// with one of statuses when any is given.
	SandboxSessions(ctx context.Context, sandboxID string, statuses ...string) ([]Session, error)
	// SetSessionStatus records the status the session's log reached.
	SetSessionStatus(ctx context.Context, id, status, reason string) error
	// SetSessionSandbox records the sandbox the session's log names.
	SetSessionSandbox(ctx context.Context, id, sandboxID string) error
}

// Ports are the sandbox ports exposed through the daemon's proxy, each with
// the hash of its token.
type Ports interface {
	// PutExposure records (or replaces, with a new token) the exposure of
	// e.SandboxID's port e.Port. Created is set from the clock.
	PutExposure(ctx context.Context, e Exposure) (Exposure, error)
	// Exposure returns the exposure of sandbox id's port (ErrNotFound if none).
	Exposure(ctx context.Context, id string, port int) (Exposure, error)
	// ExposureByToken returns the exposure of sandbox id's port if tokenHash is
	// its token's hash, else ErrNotFound (the same error as for no exposure).
	ExposureByToken(ctx context.Context, id string, port int, tokenHash string) (Exposure, error)
	// Exposures lists sandbox id's exposures by port.
	Exposures(ctx context.Context, id string) ([]Exposure, error)
	// DeleteExposure removes the exposure of sandbox id's port; ErrNotFound if
	// there was none.
	DeleteExposure(ctx context.Context, id string, port int) error
	// DeleteExposures removes every exposure of sandbox id.
	DeleteExposures(ctx context.Context, id string) error
}

// Idempotency records the answers to create calls made with an
// Idempotency-Key, so that a retry gets the first answer again.
type Idempotency interface {
	// BeginIdempotent claims (tenant, key) for a call with requestHash. It
	// returns claimed true when this call is the first (or the first one's claim
	// is older than stale: it died before answering) and must run; otherwise the
	// recorded entry (Done, or still running).
	BeginIdempotent(ctx context.Context, tenant, key, requestHash string, stale time.Duration) (Idempotent, bool, error)
	// FinishIdempotent records the answer of the call that claimed (tenant, key).
	FinishIdempotent(ctx context.Context, tenant, key string, status int, contentType string, body []byte) error
	// AbandonIdempotent forgets the claim of a call that failed, so that a
	// retry runs again.
	AbandonIdempotent(ctx context.Context, tenant, key string) error
}
