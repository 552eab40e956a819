package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func newAuditCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{Use: "audit", Short: "Read and verify the audit trail (who did what, when, how it ended)"}
	var tenant string
	var from uint64
	ls := &cobra.Command{
		Use:     "ls [--tenant T] [--from N]",
		Aliases: []string{"list"},
		Short:   "List audit records, oldest first",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			recs, err := cl.Audit(cmd.Context(), tenant, from)
			if err != nil {
				return err
			}
			if g.json {
				for _, r := range recs {
					if err := printJSON(cmd, r); err != nil {
						return err
					}
				}
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SEQ\tTIME\tACTOR\tACTION\tRESOURCE\tOUTCOME")
			for _, r := range recs {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s %d\n", r.Seq, r.Time.Local().Format(time.DateTime), r.Actor, r.Action, r.Resource, r.Outcome, r.Status)
			}
			return tw.Flush()
		},
	}
	ls.Flags().StringVar(&tenant, "tenant", "", "another tenant's trail (the operator's key)")
	ls.Flags().Uint64Var(&from, "from", 1, "first position")
	var vtenant string
	verify := &cobra.Command{
		Use:   "verify [--tenant T]",
		Short: "Check the audit trail's hash chain; exit 1 and name the record if it was edited, removed or moved",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			rep, err := cl.VerifyAudit(cmd.Context(), vtenant)
			if err != nil {
				return err
			}
			if g.json {
				if err := printJSON(cmd, rep); err != nil {
					return err
				}
			} else if rep.OK {
				fmt.Fprintf(cmd.OutOrStdout(), "audit trail of %s holds: %d records (%d..%d), head %s\n", rep.Tenant, rep.Records, rep.First, rep.Head, rep.HeadHash)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "audit trail of %s is BROKEN at record %d: %s\n", rep.Tenant, rep.BadSeq, rep.Problem)
			}
			if !rep.OK {
				return exitError{1}
			}
			return nil
		},
	}
	verify.Flags().StringVar(&vtenant, "tenant", "", "another tenant's trail (the operator's key)")
	c.AddCommand(ls, verify)
	return c
}
