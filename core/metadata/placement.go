package metadata

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// Placement: where a new sandbox (a create, or a sandbox moved off a
// draining node) goes in a deployment of many nodes. Only a live node
// (lease running, state live — not draining) with room is a candidate;
// among them the one that already holds the requested template wins, then
// the one running the fewest sandboxes, then the one with the most free
// memory, then the smallest id (so that the choice is deterministic).

// Place picks the node for a new sandbox of template among nodes, leaving
// out node exclude (the node that asks: it is draining or full). Without a
// candidate it fails naming every node and why it was left out:
// ErrResourceExhausted (429) when live nodes exist but all are full,
// ErrUnavailable (503) when no node is live and accepting.
func Place(nodes []Node, exclude, template string, now time.Time) (Node, error) {
	var cands []Node
	var why []string
	full := false
	for _, n := range nodes {
		switch {
		case n.ID == exclude:
		case !n.Alive(now):
			if n.State == NodeLive || n.State == NodeDraining {
				why = append(why, n.ID+" is down (lease expired)")
			} else {
				why = append(why, fmt.Sprintf("%s is %s", n.ID, n.State))
			}
		case n.State == NodeDraining:
			why = append(why, n.ID+" is draining")
		case !n.Capacity.HasRoom():
			why = append(why, n.ID+" is "+n.Capacity.Full())
			full = true
		default:
			cands = append(cands, n)
		}
	}
	if len(cands) == 0 {
		msg := "no node can take a new sandbox"
		if len(why) > 0 {
			msg += ": " + strings.Join(why, "; ")
		}
		if full {
			return Node{}, errdefs.ResourceExhaustedf("%s; add a node or free room (destroy sandboxes, raise amber up --node-max-sandboxes)", msg)
		}
		return Node{}, errdefs.Unavailablef("%s; start another node (amber up --store … --node-id …) or undrain one", msg)
	}
	free := func(c NodeCapacity) int64 {
		if c.MemoryBytes <= 0 {
			return 1 << 62
		}
		return c.MemoryBytes - c.UsedMemoryBytes
	}
	slices.SortFunc(cands, func(a, b Node) int {
		if ha, hb := a.Capacity.HasTemplate(template), b.Capacity.HasTemplate(template); ha != hb {
			if ha {
				return -1
			}
			return 1
		}
		if a.Capacity.Sandboxes != b.Capacity.Sandboxes {
			return a.Capacity.Sandboxes - b.Capacity.Sandboxes
		}
		if fa, fb := free(a.Capacity), free(b.Capacity); fa != fb {
			if fa > fb {
				return -1
			}
			return 1
		}
		return strings.Compare(a.ID, b.ID)
	})
	return cands[0], nil
}
