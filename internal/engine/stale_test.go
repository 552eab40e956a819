package engine_test

import (
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// TestStaleSweepSparesAdoptedCopy: the stale-copy sweep reads a row, then
// takes the sandbox's lock to destroy the copy; a failover or a move back
// may have made the row this node's in between (CI: a drain's failover
// restored a sandbox on the draining node and the sweep destroyed it as
// "stale"). Under the lock the row is read again: this node's copy stays;
// once the row is really another node's, the copy goes.
func TestStaleSweepSparesAdoptedCopy(t *testing.T) {
	env := enginetest.New(t, engine.Options{Cluster: engine.ClusterOptions{Node: "n1", Shared: true}})
	e, ctx := env.Engine, ctxT(t)
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Node != "n1" {
		t.Fatalf("created on %q, want n1", sb.Node)
	}
	e.DropLocal(ctx, sb.ID)
	if in, err := env.Driver.Inspect(ctx, sb.ID); err != nil || in.State != sandbox.StateRunning {
		t.Fatalf("this node's own copy after the sweep: %+v %v (want running)", in, err)
	}
	if _, err := env.Meta.MoveSandbox(ctx, sb.ID, "n1", "n2"); err != nil {
		t.Fatal(err)
	}
	e.DropLocal(ctx, sb.ID)
	if in, err := env.Driver.Inspect(ctx, sb.ID); err == nil && in.State == sandbox.StateRunning {
		t.Fatalf("a copy whose row is on n2 survived the sweep: %+v", in)
	} else if err != nil && !errdefs.IsNotFound(err) {
		t.Fatal(err)
	}
	// The row is n2's: put it back so that the test's cleanup destroys it.
	if _, err := env.Meta.MoveSandbox(ctx, sb.ID, "n2", "n1"); err != nil {
		t.Fatal(err)
	}
}
