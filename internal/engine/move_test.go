package engine

import (
	"testing"

	"github.com/amber-run/amber/internal/state/meta"
)

// TestMovingTo: only a stopped row whose reason MovingReason wrote is
// stopped for a move, and it names its target.
func TestMovingTo(t *testing.T) {
	for _, tc := range []struct {
		sb   meta.Sandbox
		to   string
		want bool
	}{
		{meta.Sandbox{State: meta.StateStopped, Reason: MovingReason("node-b")}, "node-b", true},
		{meta.Sandbox{State: meta.StateRunning, Reason: MovingReason("node-b")}, "", false},
		{meta.Sandbox{State: meta.StateStopped, Reason: idleReason}, "", false},
		{meta.Sandbox{State: meta.StateStopped, Reason: stoppedAtCutReason}, "", false},
		{meta.Sandbox{State: meta.StateStopped, Reason: MovingReason("")}, "", false},
		{meta.Sandbox{State: meta.StateStopped, Reason: "moving to node node-b"}, "", false},
	} {
		to, ok := MovingTo(tc.sb)
		if to != tc.to || ok != tc.want {
			t.Errorf("MovingTo(%s %q) = %q, %t; want %q, %t", tc.sb.State, tc.sb.Reason, to, ok, tc.to, tc.want)
		}
		if isMoving(tc.sb) != tc.want {
			t.Errorf("isMoving(%s %q) = %t", tc.sb.State, tc.sb.Reason, !tc.want)
		}
	}
}
