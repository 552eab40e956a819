package main

import (
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func newPortCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{Use: "port", Aliases: []string{"ports"}, Short: "Expose ports of a sandbox through the daemon (HTTP and WebSocket)"}
	c.AddCommand(newPortExposeCmd(g), newPortLsCmd(g), newPortRmCmd(g))
	return c
}

func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, usageError{fmt.Errorf("port %q is not a number in 1..65535", s)}
	}
	return p, nil
}

func newPortExposeCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "expose SBX PORT",
		Short: "Print a URL that proxies HTTP and WebSocket to 127.0.0.1:PORT inside the sandbox",
		Long: "Print a URL that proxies HTTP and WebSocket to 127.0.0.1:PORT inside the sandbox.\n" +
			"The port has an origin of its own, http://PORT-SBX.DOMAIN/ (DOMAIN is the daemon's --port-domain,\n" +
			"ports.localhost by default), so its pages share no cookies or storage with the API, the console\n" +
			"or other sandboxes. The URL carries a secret token (?amber_token=…) and needs no API key: anyone\n" +
			"who has it can use it. A browser keeps the token as a cookie of that origin; scripts may send it\n" +
			"as the header X-Amber-Port-Token instead. The token is shown only now; exposing the port again\n" +
			"replaces it.",
		Args: exactArgs(2, "a sandbox id and a port"),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := parsePort(args[1])
			if err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			x, err := cl.ExposePort(cmd.Context(), args[0], port)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, x)
			}
			fmt.Fprintln(cmd.OutOrStdout(), x.URL)
			return nil
		},
	}
}

func newPortLsCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "ls SBX",
		Aliases: []string{"list"},
		Short:   "List a sandbox's exposed ports and their origins (the tokens are not shown: only expose prints one)",
		Args:    exactArgs(1, "a sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			ps, err := cl.Ports(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				for _, p := range ps {
					if err := printJSON(cmd, p); err != nil {
						return err
					}
				}
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PORT\tURL\tEXPOSED")
			for _, p := range ps {
				fmt.Fprintf(tw, "%d\t%s\t%s\n", p.Port, p.URL, p.Created.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
}

func newPortRmCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "rm SBX PORT",
		Aliases: []string{"remove", "unexpose"},
		Short:   "Stop exposing a port (its URL answers 404 from now on)",
		Args:    exactArgs(2, "a sandbox id and a port"),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := parsePort(args[1])
			if err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			return cl.UnexposePort(cmd.Context(), args[0], port)
		},
	}
}
