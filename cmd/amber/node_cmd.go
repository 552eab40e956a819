package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func newNodeCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{
		Use:   "node",
		Short: "The nodes of a deployment on shared stores (amber up --store postgres://…)",
	}
	c.AddCommand(&cobra.Command{
		Use:   "ls",
		Short: "List the nodes: lease, state, capacity (the operator's key)",
		Long: `List every node that registered in the shared metadata store: its API
address, its lease epoch (one more at each start), its state (live,
draining, dead: its lease expired and TAKEN-BY took over its sandboxes;
left: stopped cleanly), whether its lease runs now, and the capacity it
reported at its last heartbeat.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			nodes, err := cl.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				for _, n := range nodes {
					printJSON(cmd, n)
				}
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tADDR\tEPOCH\tSTATE\tALIVE\tSANDBOXES\tMEMORY\tHEARTBEAT\tTAKEN-BY\tTEMPLATES")
			for _, n := range nodes {
				age := "-"
				if !n.Heartbeat.IsZero() {
					age = time.Since(n.Heartbeat).Round(100*time.Millisecond).String() + " ago"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%t\t%d/%s\t%s/%s\t%s\t%s\t%s\n", n.ID, n.Addr, n.Epoch, n.State, n.Alive,
					n.Capacity.Sandboxes, orUnlimited(n.Capacity.MaxSandboxes), gib(n.Capacity.UsedMemoryBytes), gib(n.Capacity.MemoryBytes),
					age, dash(n.TakenBy), strings.Join(n.Capacity.Templates, ","))
			}
			return tw.Flush()
		},
	})
	return c
}

func orUnlimited(n int) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func gib(b int64) string { return fmt.Sprintf("%.1fGi", float64(b)/(1<<30)) }
