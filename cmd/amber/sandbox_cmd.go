package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
)

func newSandboxCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{Use: "sandbox", Aliases: []string{"sandboxes", "sbx"}, Short: "Create, list, inspect and remove sandboxes"}
	c.AddCommand(newCreateCmd(g), newLsCmd(g), newInspectCmd(g), newRmCmd(g), newKillCmd(g), newEventsCmd(g), newRecoverCmd(g),
		newEffectsCmd(g), newEgressCmd(g), newUpgradeCmd(g), newTimeoutCmd(g))
	return c
}

func newCreateCmd(g *globalFlags) *cobra.Command {
	var template, memory, cpus, disk, recovery, timeout, onTimeout string
	var pids int64
	var env, egressAllow, md []string
	var cold bool
	c := &cobra.Command{
		Use:   "create --template T [--memory 256Mi] [--cpus 1] [--disk 1Gi] [--egress-allow HOST:PORT] [--metadata K=V] [--timeout 10m]",
		Short: "Create a sandbox and print its id",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if template == "" {
				return usageError{fmt.Errorf("--template is required (e.g. --template python; `amber sandbox create --help`)")}
			}
			req := api.CreateSandboxRequest{Template: template, Env: env, Cold: cold, Limits: api.Limits{Pids: pids}, Recovery: recovery, OnTimeout: onTimeout}
			var err error
			if req.Metadata, err = parsePairs("--metadata", md); err != nil {
				return err
			}
			if req.Timeout, err = parseTimeout(timeout); err != nil {
				return err
			}
			if len(egressAllow) > 0 {
				req.Egress = &api.EgressPolicy{Allow: egressAllow}
			}
			if memory != "" {
				if req.Limits.MemoryBytes, err = parseSize(memory); err != nil {
					return err
				}
			}
			if disk != "" {
				if req.Limits.DiskBytes, err = parseSize(disk); err != nil {
					return err
				}
			}
			if cpus != "" {
				if req.Limits.MilliCPUs, err = parseCPUs(cpus); err != nil {
					return err
				}
			}
			for _, kv := range env {
				if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
					return usageError{fmt.Errorf("--env %q is not KEY=VALUE", kv)}
				}
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			sb, err := cl.CreateSandbox(cmd.Context(), req)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, sb)
			}
			fmt.Fprintln(cmd.OutOrStdout(), sb.ID)
			return nil
		},
	}
	f := c.Flags()
	f.StringVarP(&template, "template", "t", "", "template to create the sandbox from (minimal, python, …)")
	f.StringVar(&memory, "memory", "", "memory limit, e.g. 256Mi (default: the template's)")
	f.StringVar(&cpus, "cpus", "", "CPU limit, e.g. 1, 0.5 or 500m (default: the template's)")
	f.StringVar(&disk, "disk", "", "writable-layer size limit, e.g. 1Gi (default: the template's)")
	f.Int64Var(&pids, "pids", 0, "process limit (default: the template's)")
	f.StringArrayVarP(&env, "env", "e", nil, "KEY=VALUE added to every process (repeatable)")
	f.BoolVar(&cold, "cold", false, "do not claim from the warm pool")
	f.StringVar(&recovery, "recovery", "", "recovery policy: none (checkpoint on request), fast (in the background) or strict (after every exec)")
	f.StringArrayVar(&md, "metadata", nil, "KEY=VALUE label of the sandboxes (repeatable; `sandbox ls --label` selects by them)")
	f.StringVar(&timeout, "timeout", "", "deadline from now, e.g. 10m or 600 (seconds); then the sandbox is killed, or paused with --on-timeout pause")
	f.StringVar(&onTimeout, "on-timeout", "", "what happens at the deadline: kill (default; files kept until rm), pause (checkpoint and stop; the next call resumes it) or destroy")
	f.StringSliceVar(&egressAllow, "egress-allow", nil, "destinations the sandbox may reach through the gateway, HOST:PORT patterns (*.suffix and * allowed); default: its tenant's policy")
	return c
}

func newLsCmd(g *globalFlags) *cobra.Command {
	var states, labels []string
	c := &cobra.Command{
		Use:     "ls [--state running] [--label K=V]",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			md, err := parsePairs("--label", labels)
			if err != nil {
				return err
			}
			sbs, err := cl.FindSandboxes(cmd.Context(), client.ListFilter{States: states, Metadata: md})
			if err != nil {
				return err
			}
			if g.json {
				for _, sb := range sbs {
					if err := printJSON(cmd, sb); err != nil {
						return err
					}
				}
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTEMPLATE\tSTATE\tMEMORY\tCPUS\tCREATED\tEXPIRES\tMETADATA")
			for _, sb := range sbs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%g\t%s\t%s\t%s\n", sb.ID, sb.Template, sb.State, formatSize(sb.Limits.MemoryBytes),
					float64(sb.Limits.MilliCPUs)/1000, sb.Created.Local().Format(time.DateTime), formatExpiry(sb), formatPairs(sb.Metadata))
			}
			return tw.Flush()
		},
	}
	c.Flags().StringSliceVar(&states, "state", nil, "only sandboxes in these states (running, stopped, crashed, …; repeatable or comma-separated)")
	c.Flags().StringArrayVar(&labels, "label", nil, "only sandboxes whose metadata hold KEY=VALUE (repeatable: every pair)")
	return c
}

func newInspectCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect SBX",
		Short: "Show a sandbox as JSON",
		Args:  exactArgs(1, "a sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			sb, err := cl.GetSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, sb)
			}
			b, _ := json.MarshalIndent(sb, "", "  ")
			fmt.Fprintln(cmd.OutOrStdout(), string(b))
			return nil
		},
	}
}

func newRmCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "rm SBX...",
		Aliases: []string{"destroy"},
		Short:   "Destroy sandboxes (processes, files, everything)",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := cl.DeleteSandbox(cmd.Context(), id); err != nil {
					return fmt.Errorf("rm %s: %w", id, err)
				}
				if g.json {
					printJSON(cmd, map[string]any{"id": id, "state": "destroyed"})
				} else {
					fmt.Fprintln(cmd.OutOrStdout(), id)
				}
			}
			return nil
		},
	}
}

func newKillCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "kill SBX",
		Short: "SIGKILL every process of a sandbox (it keeps its files until rm)",
		Args:  exactArgs(1, "a sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			sb, err := cl.KillSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, sb)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", sb.ID, sb.State)
			return nil
		},
	}
}

func newEventsCmd(g *globalFlags) *cobra.Command {
	var from uint64
	c := &cobra.Command{
		Use:   "events SBX",
		Short: "Show a sandbox's lifecycle events from the event log",
		Args:  exactArgs(1, "a sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			for {
				list, err := cl.Events(cmd.Context(), args[0], from, 1000)
				if err != nil {
					return err
				}
				for _, ev := range list.Events {
					if g.json {
						printJSON(cmd, ev)
					} else {
						fmt.Fprintf(cmd.OutOrStdout(), "%d\t%s\t%s\t%s\n", ev.Seq, ev.Time.Local().Format(time.DateTime+".000"), ev.Type, ev.Payload)
					}
				}
				if len(list.Events) == 0 {
					return nil
				}
				from = list.Next
			}
		},
	}
	c.Flags().Uint64Var(&from, "from", 1, "first position")
	return c
}
