package main

import (
	"encoding/csv"
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/client"
)

func newUsageCmd(g *globalFlags) *cobra.Command {
	var q client.UsageQuery
	var asCSV bool
	c := &cobra.Command{
		Use:   "usage [--from T] [--to T] [--group-by meter|sandbox|day] [--tenant T] [--json|--csv]",
		Short: "What the tenant consumed: CPU-seconds, memory GiB-seconds, egress, checkpoints, restores, storage",
		Long: "Sums the tenant's usage records (one per sandbox, meter and metering interval) whose interval\n" +
			"starts in [--from, --to). Times are RFC 3339 or YYYY-MM-DD (UTC).",
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			rep, err := cl.Usage(cmd.Context(), q)
			if err != nil {
				return err
			}
			switch {
			case g.json:
				return printJSON(cmd, rep)
			case asCSV:
				w := csv.NewWriter(cmd.OutOrStdout())
				_ = w.Write([]string{"tenant", "group_by", "sandbox", "day", "meter", "quantity", "records"})
				for _, r := range rep.Rows {
					_ = w.Write([]string{rep.Tenant, rep.GroupBy, r.Sandbox, r.Day, r.Meter,
						strconv.FormatFloat(r.Quantity, 'f', -1, 64), strconv.Itoa(r.Records)})
				}
				w.Flush()
				return w.Error()
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			switch rep.GroupBy {
			case "sandbox":
				fmt.Fprintln(tw, "SANDBOX\tMETER\tQUANTITY\tRECORDS")
			case "day":
				fmt.Fprintln(tw, "DAY\tMETER\tQUANTITY\tRECORDS")
			default:
				fmt.Fprintln(tw, "METER\tQUANTITY\tRECORDS")
			}
			for _, r := range rep.Rows {
				qty := strconv.FormatFloat(r.Quantity, 'f', 3, 64)
				switch rep.GroupBy {
				case "sandbox":
					sbx := r.Sandbox
					if sbx == "" {
						sbx = "(tenant)"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", sbx, r.Meter, qty, r.Records)
				case "day":
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", r.Day, r.Meter, qty, r.Records)
				default:
					fmt.Fprintf(tw, "%s\t%s\t%d\n", r.Meter, qty, r.Records)
				}
			}
			return tw.Flush()
		},
	}
	f := c.Flags()
	f.StringVar(&q.From, "from", "", "records whose interval starts at or after this time")
	f.StringVar(&q.To, "to", "", "records whose interval starts before this time")
	f.StringVar(&q.GroupBy, "group-by", "meter", "meter, sandbox or day")
	f.StringVar(&q.Tenant, "tenant", "", "another tenant's usage (the operator's key)")
	f.BoolVar(&asCSV, "csv", false, "print CSV (tenant, group_by, sandbox, day, meter, quantity, records)")
	return c
}
