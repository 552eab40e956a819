package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/api"
)

func newEffectsCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "effects SBX",
		Short: "List the sandbox's effect journal: each outbound request, answered or replayable, in flight, or needing reconciliation",
		Args:  exactArgs(1, "a sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			fx, err := cl.Effects(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, fx)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SEQ\tSTATE\tSTATUS\tATTEMPTS\tMODE\tREQUEST\tRUN")
			for _, f := range fx.Effects {
				fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%s\t%s %s\t%s\n", f.Seq, f.State, f.Status, f.Attempts, f.Mode, f.Method, f.URL, f.Run)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if fx.NeedsReconciliation > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "%d effect(s) need reconciliation: they may or may not have happened; check with the destination\n", fx.NeedsReconciliation)
			}
			return nil
		},
	}
}

func newEgressCmd(g *globalFlags) *cobra.Command {
	var allow, modes []string
	var inherit bool
	c := &cobra.Command{
		Use:   "egress SBX [--allow HOST:PORT …] [--mode HOST:PORT=MODE …] [--inherit]",
		Short: "Show the sandbox's egress policy, or set it (--allow) or return it to its tenant's (--inherit)",
		Args:  exactArgs(1, "a sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			var eg api.SandboxEgress
			switch {
			case inherit && len(allow) > 0:
				return usageError{fmt.Errorf("--allow and --inherit exclude each other")}
			case inherit:
				eg, err = cl.SetEgress(cmd.Context(), args[0], nil)
			case cmd.Flags().Changed("allow") || len(modes) > 0:
				p := &api.EgressPolicy{Allow: allow}
				for _, m := range modes {
					dest, mode, ok := strings.Cut(m, "=")
					if !ok || dest == "" || mode == "" {
						return usageError{fmt.Errorf("--mode %q: want HOST:PORT=MODE (idempotent-key, at-most-once or replay-safe)", m)}
					}
					p.Modes = append(p.Modes, api.EgressMode{Dest: dest, Mode: mode})
				}
				eg, err = cl.SetEgress(cmd.Context(), args[0], p)
			default:
				eg, err = cl.Egress(cmd.Context(), args[0])
			}
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, eg)
			}
			own := "its own"
			if eg.Policy == nil {
				own = "its tenant's (or the daemon's default)"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "policy: %s\nallow: %v\nrun: %s\n", own, eg.Effective.Allow, eg.Run)
			return nil
		},
	}
	c.Flags().StringSliceVar(&allow, "allow", nil, "set the sandbox's allowlist (HOST:PORT patterns); an empty value allows nothing")
	c.Flags().StringSliceVar(&modes, "mode", nil, "what a crash-interrupted request to HOST:PORT becomes: idempotent-key, at-most-once or replay-safe (with --allow)")
	c.Flags().BoolVar(&inherit, "inherit", false, "drop the sandbox's own policy: follow its tenant's")
	return c
}
