package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/chaos"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// TestE2EChaosShort is the default suite's chaos run: `amber chaos` with
// every fault class once per driver (one fault per class in one run of the reference
// workload, after its golden run), with HTTP effects through the egress
// gateway, under each driver. It
// requires zero lost acknowledged events, zero duplicated effects and every
// class observed; a run that differs from the golden one otherwise is
// logged (docs/reliability.md lists the known causes). `make chaos N=…` is
// the long version.
func TestE2EChaosShort(t *testing.T) {
	if !hasTemplate("python") {
		t.Skip("no python template")
	}
	bin, _ := e2eSetup(t) // also skips without a runtime
	for _, drv := range []string{"gvisor", "criu"} {
		t.Run(drv, func(t *testing.T) {
			if drv != enginetest.DriverName() {
				rt := map[string]string{"gvisor": "runsc", "criu": "criu"}[drv]
				if _, err := os.Stat(filepath.Join(enginetest.Cache(), "bin", rt)); err != nil {
					t.Skipf("no %s runtime in %s/bin", rt, enginetest.Cache())
				}
			}
			report := filepath.Join(t.TempDir(), "chaos.json")
			ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
			defer cancel()
			var out bytes.Buffer
			k := strconv.Itoa(len(chaos.Classes))
			cmd := exec.CommandContext(ctx, bin, "chaos", "--driver", drv, "--faults", k, "--faults-per-run", k,
				"--seed", "8", "--min-hits", "1", "--report", report)
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			t.Logf("amber chaos --driver %s:\n%s", drv, out.String())
			if err != nil {
				t.Fatalf("amber chaos: %v", err)
			}
			var rep chaos.Report
			b, err := os.ReadFile(report)
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &rep); err != nil {
				t.Fatal(err)
			}
			if rep.Runs != 1 || rep.FaultsPlanned != len(chaos.Classes) || rep.LostEventRuns != 0 || rep.DuplicateEffectRuns != 0 {
				t.Fatalf("report: %d runs, %d faults, %d lost, %d duplicated", rep.Runs, rep.FaultsPlanned, rep.LostEventRuns, rep.DuplicateEffectRuns)
			}
			for _, cl := range chaos.Classes {
				if rep.HitsByClass[cl] < 1 {
					t.Errorf("class %s was never observed (planned %d)", cl, rep.PlannedByClass[cl])
				}
			}
			// A run that differs without losing or duplicating anything
			// (open defects in docs/reliability.md: a transient journal
			// error answered 503 to the agent) is reported, not failed.
			if rep.Identical != rep.Runs {
				t.Logf("NOTE: %d of %d runs differ from the golden run (see the report above)", rep.Runs-rep.Identical, rep.Runs)
			}
			wantLedger := "book,lamp,tea"
			if got := strings.Join(rep.Golden.Ledger, ","); got != wantLedger {
				t.Errorf("golden ledger %q, want %q", got, wantLedger)
			}
		})
	}
}
