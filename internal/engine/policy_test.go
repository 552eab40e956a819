package engine_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/enginetest"
)

// TestRecoveryPolicies: strict checkpoints after every exec before it
// returns; fast checkpoints in the background every FastEvery execs; none
// never. It logs each policy's exec round trip (median of 9), measured in
// the same run, for docs/benchmarks.md.
func TestRecoveryPolicies(t *testing.T) {
	env := enginetest.NewFor(t, "gvisor", engine.Options{FastEvery: 3, FastInterval: time.Hour})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Policy: "sometimes"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad policy: %v", err)
	}
	count := func(id string) int {
		cks, err := e.ListCheckpoints(ctx, "default", id, false)
		if err != nil {
			t.Fatal(err)
		}
		return len(cks)
	}
	medians := map[string]time.Duration{}
	for _, policy := range []string{"none", "fast", "strict"} {
		sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Policy: policy, Cold: true})
		if err != nil {
			t.Fatal(err)
		}
		var took []time.Duration
		for i := 1; i <= 9; i++ {
			start := time.Now()
			if _, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"sh", "-c", "echo $$ >> /root/log"}}); err != nil {
				t.Fatal(err)
			}
			took = append(took, time.Since(start))
			if policy == "strict" && count(sb.ID) != i {
				t.Fatalf("strict: %d checkpoints after %d execs", count(sb.ID), i)
			}
		}
		sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
		medians[policy] = took[len(took)/2]
		switch policy {
		case "none":
			if n := count(sb.ID); n != 0 {
				t.Errorf("none: %d checkpoints", n)
			}
		case "fast":
			// 9 execs, every 3rd due: up to 3 (fewer when one was still
			// running at a due exec), at least 1.
			deadline := time.Now().Add(time.Minute)
			for count(sb.ID) < 1 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if n := count(sb.ID); n < 1 || n > 3 {
				t.Errorf("fast: %d checkpoints after 9 execs", n)
			}
		}
		if err := e.Destroy(ctx, "default", sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("exec round trip p50: none %v, fast %v (%.2fx), strict %v (%.2fx)",
		medians["none"].Round(time.Millisecond), medians["fast"].Round(time.Millisecond),
		float64(medians["fast"])/float64(medians["none"]),
		medians["strict"].Round(time.Millisecond), float64(medians["strict"])/float64(medians["none"]))
}
