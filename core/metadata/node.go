package metadata

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// FailoverAssignment is one sandbox of a dead node assigned to a target.
type FailoverAssignment struct {
	SandboxID, DeadNode, Target string
}

// NodeState is a node row's state.
type NodeState string

// The node states.
const (
	NodeLive     NodeState = "live"
	NodeDraining NodeState = "draining" // live, takes no new sandboxes
	NodeDead     NodeState = "dead"     // claimed by taken_by after its lease expired
	NodeLeft     NodeState = "left"     // stopped cleanly
)

// NodeCapacity is what a node offers and uses, reported at every heartbeat.
type NodeCapacity struct {
	MemoryBytes     int64    `json:"memory_bytes"`      // memory for sandboxes
	MaxSandboxes    int      `json:"max_sandboxes"`     // 0: no limit
	Sandboxes       int      `json:"sandboxes"`         // running now
	UsedMemoryBytes int64    `json:"used_memory_bytes"` // sum of their limits
	Templates       []string `json:"templates"`         // template versions cached on the node
	Driver          string   `json:"driver"`
}

// Node is one row of the nodes table.
type Node struct {
	ID        string       `json:"id"`
	Addr      string       `json:"addr"` // its API, host:port, reachable by the other nodes
	Epoch     uint64       `json:"epoch"`
	State     NodeState    `json:"state"`
	Capacity  NodeCapacity `json:"capacity"`
	Started   time.Time    `json:"started"`
	Heartbeat time.Time    `json:"heartbeat"`
	Expires   time.Time    `json:"expires"`
	TakenBy   string       `json:"taken_by,omitempty"`
}

// Alive reports whether n's lease runs at now.
func (n Node) Alive(now time.Time) bool {
	return (n.State == NodeLive || n.State == NodeDraining) && now.Before(n.Expires)
}

// HasRoom reports whether a node with capacity c can take one more
// sandbox: fewer than MaxSandboxes run (0: no limit) and the memory its
// sandboxes may use is below its memory (0: unknown, no limit).
func (c NodeCapacity) HasRoom() bool {
	if c.MaxSandboxes > 0 && c.Sandboxes >= c.MaxSandboxes {
		return false
	}
	if c.MemoryBytes > 0 && c.UsedMemoryBytes >= c.MemoryBytes {
		return false
	}
	return true
}

// Full names why c has no room ("" when it has).
func (c NodeCapacity) Full() string {
	switch {
	case c.MaxSandboxes > 0 && c.Sandboxes >= c.MaxSandboxes:
		return fmt.Sprintf("full (%d of %d sandboxes)", c.Sandboxes, c.MaxSandboxes)
	case c.MemoryBytes > 0 && c.UsedMemoryBytes >= c.MemoryBytes:
		return fmt.Sprintf("full (%d of %d bytes of memory given to sandboxes)", c.UsedMemoryBytes, c.MemoryBytes)
	}
	return ""
}

// HasTemplate reports whether the node reported template name (a name,
// or name:version / name@version) among the templates it holds.
func (c NodeCapacity) HasTemplate(name string) bool {
	if name == "" {
		return false
	}
	base := func(s string) string {
		if i := strings.IndexAny(s, ":@"); i >= 0 {
			return s[:i]
		}
		return s
	}
	for _, t := range c.Templates {
		if t == name || base(t) == base(name) {
			return true
		}
	}
	return false
}

// NodeLock is a node's liveness lock (Nodes.NodeLock): held by its node's
// process, released by the database when that process dies.
type NodeLock interface {
	// Ensure takes the lock if this process does not hold it, and checks the
	// hold otherwise (a broken one is dropped and the lock taken again). It
	// reports whether the lock is held now; false with a nil error means the
	// store cannot hold one or another holder has it (a previous run of the
	// node whose session has not ended yet): the caller retries at its next
	// heartbeat and is meanwhile judged by its lease only.
	Ensure(ctx context.Context) (bool, error)
	// Release gives the lock up (a clean stop).
	Release()
}
