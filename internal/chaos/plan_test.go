package chaos

import (
	"strings"
	"testing"
)

// TestPlanDrawsEveryClass: k consecutive faults of one run cover k
// classes, and each class draws its faults where it says — the cut-kill
// class a kill-daemon at one of the local cut's steps.
func TestPlanDrawsEveryClass(t *testing.T) {
	calib := map[string]int{"blob.write": 2000, "blob.read": 2000, "chunkstore.chunks": 14, "chunkstore.manifest": 14,
		"chunkstore.publish": 14, "eventlog.append": 80, "eventlog.read": 300, "meta.write": 60, "meta.read": 300,
		"driver.checkpoint": 13, "checkpoint.local-kept": 13, "checkpoint.upload": 13, "layer.archive.listed": 120}
	c := &chaos{o: &Options{Classes: Classes, PerRun: len(Classes)}, calib: calib}
	cutPoints := map[string]bool{}
	for seed := int64(1); seed <= 30; seed++ {
		plan := c.plan(seed, len(Classes))
		seen := map[string]bool{}
		for _, f := range plan {
			seen[f.Class] = true
			if f.Class != fcCutKill {
				continue
			}
			if !strings.HasSuffix(f.Spec, ":kill-daemon") || calib[f.point] == 0 || !strings.HasPrefix(f.point, "driver.checkpoint") && !strings.HasPrefix(f.point, "checkpoint.") && f.point != "layer.archive.listed" {
				t.Fatalf("seed %d: cut-kill fault %q at %q: want a kill-daemon at a step of the local cut", seed, f.Spec, f.point)
			}
			cutPoints[f.point] = true
		}
		if len(seen) != len(Classes) {
			t.Fatalf("seed %d: %d faults drew classes %v, want all %d", seed, len(plan), seen, len(Classes))
		}
	}
	if len(cutPoints) != 4 {
		t.Errorf("30 seeds drew the cut-kill class at %v, want all four steps", cutPoints)
	}
}
