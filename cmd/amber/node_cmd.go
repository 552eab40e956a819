package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/api"
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
	c.AddCommand(newNodeDrainCmd(g), newNodeUndrainCmd(g))
	return c
}

func newNodeDrainCmd(g *globalFlags) *cobra.Command {
	var wait bool
	c := &cobra.Command{
		Use:   "drain NODE [--wait]",
		Short: "Move every sandbox off a node before maintenance (the operator's key)",
		Long: `Mark NODE draining: it keeps running and renewing its lease but takes no
new sandboxes (creates that reach it go to another node), and each of its
sandboxes moves to the live node with the most room: checkpointed and
stopped on NODE, then restored on the other node from that checkpoint (one
generation on; files, processes and memory as at the cut). Calls to a
sandbox through any node reach it wherever it runs; its event stream goes
on. With --wait, prints each move and returns once NODE holds no
sandboxes; stop NODE then. A drained node stays draining (amber node ls)
until it stops, or until amber node undrain NODE.

Refused, and NODE left as it is, when NODE is unknown or down, or when it
holds sandboxes and no other node has room.`,
		Args: exactArgs(1, "NODE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			last, err := cl.DrainNode(cmd.Context(), args[0], wait, func(f api.DrainFrame) {
				switch {
				case g.json:
					printJSON(cmd, f)
				case f.Moved != nil:
					m := f.Moved
					what := "checkpointed → restored on node " + m.To
					if m.State != "running" {
						what = "(" + m.State + ") moved to node " + m.To
					}
					fmt.Fprintf(out, "%s %s (%.1f s)\n", m.Sandbox, what, float64(m.TookMS)/1000)
				case f.Done:
					fmt.Fprintf(out, "node %s is %s and holds no sandboxes; it can be stopped\n", f.Node, f.State)
				default:
					fmt.Fprintf(out, "node %s is %s; moving its %d sandboxes\n", f.Node, f.State, f.Sandboxes)
				}
			})
			if err != nil {
				return err
			}
			if !wait {
				if g.json {
					return printJSON(cmd, last)
				}
				fmt.Fprintf(out, "node %s is %s; its %d sandboxes are moving (amber node ls, or drain --wait, to follow)\n", last.Node, last.State, last.Sandboxes)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&wait, "wait", false, "print each move and return once the node holds no sandboxes")
	return c
}

func newNodeUndrainCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "undrain NODE",
		Short: "Make a draining node live again: it takes new sandboxes (the operator's key)",
		Args:  exactArgs(1, "NODE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			n, err := cl.UndrainNode(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, n)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s is %s\n", n.ID, n.State)
			return nil
		},
	}
}

func orUnlimited(n int) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func gib(b int64) string { return fmt.Sprintf("%.1fGi", float64(b)/(1<<30)) }
