package main

import (
	"github.com/spf13/cobra"

	"github.com/amber-run/amber/internal/demo"
)

// amber demo: an agent that survives a sandbox crash and a daemon crash
// (internal/demo) behind its flags.

func newDemoCmd(g *globalFlags) *cobra.Command {
	var keep bool
	var driver string
	c := &cobra.Command{
		Use:   "demo",
		Short: "Run an agent that survives a sandbox crash and a daemon crash (exact recovery, orders placed once)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return demo.Run(cmd.Context(), cmd.OutOrStdout(), keep, driver)
		},
	}
	c.Flags().BoolVar(&keep, "keep", false, "keep the temporary data directory (its daemon log, event log) afterwards")
	c.Flags().StringVar(&driver, "driver", "gvisor", "sandbox driver: gvisor or criu")
	return c
}
