package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func newPsCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "ps SBX",
		Short: "List the processes running in a sandbox",
		Args:  exactArgs(1, "a sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			ps, err := cl.Processes(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				for _, p := range ps {
					printJSON(cmd, p)
				}
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PID\tPPID\tSTATE\tCOMMAND")
			for _, p := range ps {
				fmt.Fprintf(tw, "%d\t%d\t%s\t%s\n", p.PID, p.PPID, p.State, strings.Join(p.Args, " "))
			}
			return tw.Flush()
		},
	}
}
