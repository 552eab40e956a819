package main

import (
	"errors"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/internal/chaos"
)

// amber chaos: the crash-anywhere exactness harness (internal/chaos) behind
// its flags.

func newChaosCmd(g *globalFlags) *cobra.Command {
	o := &chaos.Options{}
	c := &cobra.Command{
		Use:   "chaos [--faults N] [--seed S] [--driver gvisor|criu] [--report FILE]",
		Short: "Inject faults at random moments into a reference agent session and check recovery is exact",
		Long: `Run the reference workload (a scripted agent session with a server holding
memory, a process tree, files, tmpfs, a SQLite database, HTTP orders to a
local ledger and a client following its events) once without faults — the
golden outcome — then in runs with faults at random moments drawn from the
seed: ` + strings.Join(chaos.Classes, ", ") + `.
Each run's seed is the base seed plus its number; --seed RUNSEED --faults K
--faults-per-run K replays run RUNSEED alone. Recovery is automatic (a dead
daemon is restarted, which wakes the session). The report (text on stdout,
JSON in --report) counts identical runs, runs with a lost acknowledged event,
a duplicated effect or that needed reconciliation, recovery times, and
confirmed hits per fault class. Exit status 1 on any lost event or
duplicated effect, or a class hit fewer than --min-hits times. Runs as root
(it runs sandboxes), on this machine only.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("seed") {
				o.Seed = time.Now().UnixNano() % 1_000_000_000
			}
			err := chaos.Run(cmd.Context(), cmd.OutOrStdout(), o)
			if ue := (chaos.UsageError{}); errors.As(err, &ue) {
				return usageError{ue.Unwrap()}
			}
			return err
		},
	}
	f := c.Flags()
	f.Int64Var(&o.Seed, "seed", 0, "base seed (default: from the clock; printed)")
	f.IntVar(&o.Faults, "faults", 20, "faults to inject in all")
	f.IntVar(&o.PerRun, "faults-per-run", 4, "faults per run of the workload")
	f.StringSliceVar(&o.Classes, "classes", nil, "fault classes (default all): "+strings.Join(chaos.Classes, ","))
	f.StringVar(&o.Driver, "driver", "gvisor", "sandbox driver: gvisor or criu")
	f.StringVar(&o.Report, "report", "", "also write the report as JSON to this file")
	f.StringVar(&o.Format, "format", "text", "report on stdout: text or json")
	f.IntVar(&o.MinHits, "min-hits", 1, "fail unless each class's fault was observed at least this many times")
	f.BoolVar(&o.Keep, "keep", false, "keep the data directories of failing runs")
	f.DurationVar(&o.KeepSlow, "keep-slow", 0, "also keep the data directory of a run in which a fault took longer than this to recover from (0: off)")
	f.DurationVar(&o.RunTimeout, "run-timeout", 6*time.Minute, "give up on a run that has not finished after this long")
	f.DurationVar(&o.Budget, "time-budget", 0, "start no new run after this long (0: none); the report says how many faults ran")
	_ = g
	return c
}
