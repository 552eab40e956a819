package metadata

import (
	"time"

	"github.com/amber-run/amber/core/sandbox"
)

// State is where a sandbox is in its lifecycle, as the daemon records it.
//
//	creating ──▶ running ──Kill──▶ stopped
//	   │            │ (lost, or its init died)
//	   │            └──────────▶ crashed
//	   │        restoring ──▶ running   (from running, stopped or crashed:
//	   │                                 a restore in place; or a new row: a fork)
//	   └─(any)──Destroy──▶ destroyed
type State string

// The lifecycle states.
const (
	StateCreating  State = "creating"
	StateRestoring State = "restoring" // being restored from a checkpoint
	StateRunning   State = "running"
	StateStopped   State = "stopped"   // killed on request; writable layer kept
	StateCrashed   State = "crashed"   // stopped without being asked to
	StateDestroyed State = "destroyed" // gone; the row stays as history
)

// Sandbox is one row of the store.
type Sandbox struct {
	ID              string         `json:"id"`
	Tenant          string         `json:"tenant"` // "" while in the warm pool
	Template        string         `json:"template"`
	TemplateVersion string         `json:"template_version"`
	Driver          string         `json:"driver"`
	Limits          sandbox.Limits `json:"limits"`
	// Env is added to every process the sandbox runs.
	Env   []string `json:"env,omitempty"`
	State State    `json:"state"`
	// Reason says why the sandbox is stopped, crashed or destroyed.
	Reason string `json:"reason,omitempty"`
	// Pooled is true while the sandbox waits in the warm pool, owned by no
	// tenant. FromPool stays true once a pooled sandbox was claimed.
	Pooled   bool `json:"pooled"`
	FromPool bool `json:"from_pool"`
	// Generation counts the restores of this sandbox in place: events that
	// may happen once per incarnation (killed, crashed, exited) carry it in
	// their ids.
	Generation int `json:"generation"`
	// Origin is the checkpoint this sandbox was last restored from ("" if
	// never): its own, or another sandbox's for a fork.
	Origin string `json:"origin,omitempty"`
	// Policy is the recovery policy: "" (checkpoints on request only),
	// "fast" or "strict" (see engine/policy.go).
	Policy string `json:"policy,omitempty"`
	// Node is the node that runs the sandbox (its engine's Options.Cluster.Node):
	// on shared stores, each node manages only its own rows, and a
	// sandbox moves to another node only by a fenced takeover
	// (SetNode; see docs/deploy.md).
	Node string `json:"node,omitempty"`
	// Metadata are the owner's labels (string to string), set at create;
	// List can select by them (Filter.Metadata).
	Metadata map[string]string `json:"metadata,omitempty"`
	// Expires is the sandbox's deadline (zero: none): past it the engine
	// kills the sandbox, or pauses it (checkpoint and stop) when OnExpire
	// is ExpirePause. Set at create and by SetExpiry.
	Expires  time.Time `json:"expires,omitempty"`
	OnExpire string    `json:"on_expire,omitempty"`
	Created  time.Time `json:"created"`
	Updated  time.Time `json:"updated"`
}

// Filter selects rows for List. Zero values select everything except
// destroyed sandboxes.
type Filter struct {
	Tenant *string // nil: any tenant
	Pooled *bool   // nil: pooled or not
	Node   *string // nil: on any node
	// States, when set, lists the states to return; otherwise every state
	// except destroyed.
	States []State
	// Metadata, when set, selects the sandboxes whose Metadata hold every
	// one of its pairs.
	Metadata map[string]string
	// ExpiredBy, when not zero, selects the sandboxes with a deadline at
	// or before it.
	ExpiredBy time.Time
}

// What the engine does with a sandbox at its deadline (Sandbox.OnExpire).
const (
	ExpireKill  = ""      // kill it (the default)
	ExpirePause = "pause" // checkpoint and stop it; the next call resumes it
	// ExpireDestroy destroys it (E2B's kill: nothing is left).
	ExpireDestroy = "destroy"
)

// Matches reports whether md holds every pair of want.
func Matches(md, want map[string]string) bool {
	for k, v := range want {
		if got, ok := md[k]; !ok || got != v {
			return false
		}
	}
	return true
}
