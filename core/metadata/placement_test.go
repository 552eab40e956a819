package metadata

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

func TestPlace(t *testing.T) {
	now := time.Unix(1000, 0)
	live := func(id string, c NodeCapacity) Node {
		return Node{ID: id, State: NodeLive, Expires: now.Add(time.Second), Capacity: c}
	}
	gi := int64(1 << 30)
	tests := []struct {
		name     string
		nodes    []Node
		exclude  string
		template string
		want     string
		kind     error  // when no node fits
		why      string // in the error
	}{
		{name: "fewest sandboxes", nodes: []Node{
			live("a", NodeCapacity{Sandboxes: 3}), live("b", NodeCapacity{Sandboxes: 1}), live("c", NodeCapacity{Sandboxes: 2}),
		}, want: "b"},
		{name: "the asking node is left out", exclude: "b", nodes: []Node{
			live("a", NodeCapacity{Sandboxes: 3}), live("b", NodeCapacity{Sandboxes: 1}), live("c", NodeCapacity{Sandboxes: 2}),
		}, want: "c"},
		{name: "most free memory breaks a tie", nodes: []Node{
			live("a", NodeCapacity{Sandboxes: 1, MemoryBytes: 8 * gi, UsedMemoryBytes: 6 * gi}),
			live("b", NodeCapacity{Sandboxes: 1, MemoryBytes: 8 * gi, UsedMemoryBytes: 1 * gi}),
		}, want: "b"},
		{name: "a node holding the template wins over a less busy one", template: "python", nodes: []Node{
			live("a", NodeCapacity{Sandboxes: 0, Templates: []string{"minimal"}}),
			live("b", NodeCapacity{Sandboxes: 5, Templates: []string{"minimal", "python"}}),
		}, want: "b"},
		{name: "template versions match their name", template: "python:3", nodes: []Node{
			live("a", NodeCapacity{Sandboxes: 0}),
			live("b", NodeCapacity{Sandboxes: 5, Templates: []string{"python@abc"}}),
		}, want: "b"},
		{name: "draining, dead, left and full nodes are skipped", nodes: []Node{
			{ID: "a", State: NodeDraining, Expires: now.Add(time.Second)},
			{ID: "b", State: NodeLive, Expires: now.Add(-time.Second)},
			{ID: "c", State: NodeLeft, Expires: now.Add(time.Second)},
			live("d", NodeCapacity{MaxSandboxes: 2, Sandboxes: 2}),
			live("e", NodeCapacity{MemoryBytes: gi, UsedMemoryBytes: gi}),
			live("f", NodeCapacity{Sandboxes: 9, MaxSandboxes: 10}),
		}, want: "f"},
		{name: "all full: resource exhausted, naming why", exclude: "a", nodes: []Node{
			{ID: "a", State: NodeDraining, Expires: now.Add(time.Second)},
			live("b", NodeCapacity{MaxSandboxes: 2, Sandboxes: 2}),
		}, kind: errdefs.ErrResourceExhausted, why: "b is full (2 of 2 sandboxes)"},
		{name: "none live: unavailable", exclude: "a", nodes: []Node{
			{ID: "a", State: NodeDraining, Expires: now.Add(time.Second)},
			{ID: "b", State: NodeDraining, Expires: now.Add(time.Second)},
			{ID: "c", State: NodeDead, Expires: now.Add(-time.Second)},
		}, kind: errdefs.ErrUnavailable, why: "b is draining; c is dead"},
		{name: "no nodes", kind: errdefs.ErrUnavailable, why: "no node can take"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Place(tc.nodes, tc.exclude, tc.template, now)
			if tc.kind != nil {
				if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.why) {
					t.Fatalf("Place = %s, %v; want a %v naming %q", got.ID, err, tc.kind, tc.why)
				}
				return
			}
			if err != nil || got.ID != tc.want {
				t.Fatalf("Place = %q, %v; want %q", got.ID, err, tc.want)
			}
		})
	}
}
