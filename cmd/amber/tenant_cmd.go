package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
)

func newTenantCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{Use: "tenant", Aliases: []string{"tenants"}, Short: "Create and list tenants (the operator's admin key)"}
	c.AddCommand(newTenantCreateCmd(g), newTenantLsCmd(g), newTenantPolicyCmd(g), newTenantQuotaCmd(g))
	return c
}

func newTenantCreateCmd(g *globalFlags) *cobra.Command {
	var name string
	c := &cobra.Command{
		Use:   "create ID [--name NAME]",
		Short: "Create a tenant (needs the operator's key: DATA_DIR/admin.key)",
		Long: `Create a tenant: a team whose sandboxes, checkpoints and keys no other
tenant sees. ID is 1 to 40 of a-z, 0-9 and '-'. Then give it a key:

  amber key create admin --tenant ID --scope read,write,admin`,
		Args: exactArgs(1, "a tenant id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			t, err := cl.CreateTenant(cmd.Context(), api.CreateTenantRequest{ID: args[0], Name: name})
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, t)
			}
			fmt.Fprintln(cmd.OutOrStdout(), t.ID)
			return nil
		},
	}
	c.Flags().StringVar(&name, "name", "", "a name for people (default: the id)")
	return c
}

func newTenantLsCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List tenants (every tenant for the operator, your own otherwise)",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			ts, err := cl.Tenants(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				for _, t := range ts {
					if err := printJSON(cmd, t); err != nil {
						return err
					}
				}
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSTATE\tCREATED")
			for _, t := range ts {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.ID, t.Name, t.State, t.Created.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
}

func newKeyCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{Use: "key", Aliases: []string{"keys"}, Short: "Create, list and revoke a tenant's API keys (an admin-scoped key)"}
	c.AddCommand(newKeyCreateCmd(g), newKeyLsCmd(g), newKeyRevokeCmd(g), newKeyE2BCmd(g))
	return c
}

// parseExpiry reads --expires: a duration from now ("24h", "90m", "30d")
// or an RFC 3339 time. "" is never.
func parseExpiry(s string, now time.Time) (*time.Time, error) {
	if s == "" {
		return nil, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return &t, nil
	}
	var d time.Duration
	var err error
	if days, ok := strings.CutSuffix(s, "d"); ok {
		var n int
		n, err = strconv.Atoi(days)
		d = time.Duration(n) * 24 * time.Hour
	} else {
		d, err = time.ParseDuration(s)
	}
	if err != nil || d <= 0 {
		return nil, usageError{fmt.Errorf("--expires %q is not a positive duration (24h, 30d) or an RFC 3339 time", s)}
	}
	t := now.Add(d).UTC().Truncate(time.Second)
	return &t, nil
}

func requireTenant(tenant string) error {
	if tenant == "" {
		return usageError{fmt.Errorf("--tenant is required (the tenant whose keys these are)")}
	}
	return nil
}

func newKeyCreateCmd(g *globalFlags) *cobra.Command {
	var tenant, scopes, expires string
	c := &cobra.Command{
		Use:   "create NAME --tenant T [--scope read,write] [--expires 24h]",
		Short: "Create an API key and print it (shown this once)",
		Long: `Create an API key of tenant T and print it. The daemon keeps only its
SHA-256: the key cannot be shown again, so store it now.

Scopes: read (look at sandboxes, checkpoints, files, events), write (create,
exec, change, checkpoint, restore, destroy), admin (manage the tenant's keys).
The operator's key (DATA_DIR/admin.key) makes keys for any tenant; a tenant's
admin key for its own tenant only.`,
		Args: exactArgs(1, "a key name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireTenant(tenant); err != nil {
				return err
			}
			exp, err := parseExpiry(expires, time.Now())
			if err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			k, err := cl.CreateKey(cmd.Context(), tenant, api.CreateKeyRequest{Name: args[0], Scopes: strings.Split(scopes, ","), ExpiresAt: exp})
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, k)
			}
			fmt.Fprintln(cmd.OutOrStdout(), k.Key)
			fmt.Fprintf(cmd.ErrOrStderr(), "key %q of tenant %s (%s): shown once, store it now; use it as AMBER_TOKEN or --token\n",
				k.Name, k.Tenant, strings.Join(k.Scopes, ","))
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&tenant, "tenant", "", "the tenant the key belongs to")
	f.StringVar(&scopes, "scope", "read,write", "comma-separated scopes: read, write, admin")
	f.StringVar(&expires, "expires", "", "when the key stops working: a duration from now (24h, 30d) or an RFC 3339 time (default: never)")
	return c
}

func newKeyLsCmd(g *globalFlags) *cobra.Command {
	var tenant string
	c := &cobra.Command{
		Use:     "ls --tenant T",
		Aliases: []string{"list"},
		Short:   "List a tenant's keys (never the keys themselves: name, scopes, prefix, times)",
		Args:    exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireTenant(tenant); err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			keys, err := cl.Keys(cmd.Context(), tenant)
			if err != nil {
				return err
			}
			if g.json {
				for _, k := range keys {
					if err := printJSON(cmd, k); err != nil {
						return err
					}
				}
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tTENANT\tSCOPES\tPREFIX\tCREATED\tEXPIRES\tREVOKED")
			for _, k := range keys {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.Name, k.Tenant, strings.Join(k.Scopes, ","), dash(k.Prefix),
					k.Created.Local().Format(time.DateTime), fmtTime(k.ExpiresAt), fmtTime(k.RevokedAt))
			}
			return tw.Flush()
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "the tenant whose keys to list")
	return c
}

func newKeyRevokeCmd(g *globalFlags) *cobra.Command {
	var tenant string
	c := &cobra.Command{
		Use:   "revoke NAME --tenant T",
		Short: "Revoke a key: it is refused from now on",
		Args:  exactArgs(1, "a key name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireTenant(tenant); err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			if err := cl.RevokeKey(cmd.Context(), tenant, args[0]); err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, map[string]any{"tenant": tenant, "name": args[0], "revoked": true})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s/%s revoked\n", tenant, args[0])
			return nil
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "the tenant the key belongs to")
	return c
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Local().Format(time.DateTime)
}

func newTenantPolicyCmd(g *globalFlags) *cobra.Command {
	var recovery string
	var fastEvery, keep int
	var fastInterval, replayBudget, idle time.Duration
	c := &cobra.Command{
		Use:   "policy TENANT [--recovery none|fast|strict] [--fast-every N] [--fast-interval D] [--fast-replay-budget D] [--keep-checkpoints N] [--idle-timeout D]",
		Short: "Show or set a tenant's recovery policy",
		Long: `Show a tenant's recovery policy, or set it with flags (flags not given keep
their value; 0 means the daemon's default):

  --recovery          policy of sandboxes created without --recovery
  --fast-every N      the fast policy checkpoints after N execs …
  --fast-interval D   … or D after the last checkpoint
  --fast-replay-budget D
                      … or once the execs since it ran D in all (what a
                      crash would replay; default 5s)
  --keep-checkpoints  keep each sandbox's newest N checkpoints plus tagged ones
  --idle-timeout D    checkpoint and stop sandboxes idle this long`,
		Args: exactArgs(1, "a tenant id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			p, err := cl.TenantPolicy(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			f := cmd.Flags()
			if f.NFlag() > 0 {
				if f.Changed("recovery") {
					p.Recovery = recovery
				}
				if f.Changed("fast-every") {
					p.FastEvery = fastEvery
				}
				if f.Changed("fast-interval") {
					p.FastIntervalMS = fastInterval.Milliseconds()
				}
				if f.Changed("fast-replay-budget") {
					p.FastReplayBudgetMS = replayBudget.Milliseconds()
				}
				if f.Changed("keep-checkpoints") {
					p.KeepCheckpoints = keep
				}
				if f.Changed("idle-timeout") {
					p.IdleTimeoutMS = idle.Milliseconds()
				}
				if p, err = cl.SetTenantPolicy(cmd.Context(), args[0], p); err != nil {
					return err
				}
			}
			if g.json {
				return printJSON(cmd, p)
			}
			show := func(v any, dflt string) string {
				if fmt.Sprint(v) == "0" || fmt.Sprint(v) == "" {
					return dflt
				}
				return fmt.Sprint(v)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "recovery\t%s\n", show(p.Recovery, "none"))
			fmt.Fprintf(tw, "fast every\t%s\n", show(p.FastEvery, "default"))
			fmt.Fprintf(tw, "fast interval\t%s\n", show(time.Duration(p.FastIntervalMS)*time.Millisecond, "default"))
			fmt.Fprintf(tw, "fast replay budget\t%s\n", show(time.Duration(p.FastReplayBudgetMS)*time.Millisecond, "default"))
			fmt.Fprintf(tw, "keep checkpoints\t%s\n", show(p.KeepCheckpoints, "default"))
			fmt.Fprintf(tw, "idle timeout\t%s\n", show(time.Duration(p.IdleTimeoutMS)*time.Millisecond, "default"))
			return tw.Flush()
		},
	}
	f := c.Flags()
	f.StringVar(&recovery, "recovery", "", "none, fast or strict")
	f.IntVar(&fastEvery, "fast-every", 0, "fast policy: checkpoint after this many execs")
	f.DurationVar(&fastInterval, "fast-interval", 0, "fast policy: checkpoint this long after the last one")
	f.DurationVar(&replayBudget, "fast-replay-budget", 0, "fast policy: checkpoint once the execs since the last one ran this long in all")
	f.IntVar(&keep, "keep-checkpoints", 0, "keep each sandbox's newest N checkpoints (plus tagged)")
	f.DurationVar(&idle, "idle-timeout", 0, "checkpoint and stop sandboxes idle this long")
	return c
}

func newTenantQuotaCmd(g *globalFlags) *cobra.Command {
	var sandboxes int
	var memory, cpus, ckpt string
	var rps float64
	var budgets []string
	c := &cobra.Command{
		Use:   "quota TENANT [--max-sandboxes N] [--max-memory 8Gi] [--max-cpus 4] [--max-checkpoint-bytes 50Gi] [--requests-per-second R] [--budget METER=N]...",
		Short: "Show or set a tenant's quota (setting needs the operator's key; 0 means no limit)",
		Long: `Show or set a tenant's quota (setting needs the operator's key; 0 means no limit).

--budget METER=N bounds what the tenant may consume per calendar month (UTC),
measured by the usage meters (amber usage): e.g. --budget cpu_seconds=36000
--budget egress_requests=10000. Once a budget is used up the tenant's running
sandboxes are checkpointed and stopped (nothing is lost) and new work is
refused with 429 until the month ends or the budget is raised; the next call
into a stopped sandbox then resumes it. METER=0 removes that budget.`,
		Args: exactArgs(1, "a tenant id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			q, err := cl.TenantQuota(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			f := cmd.Flags()
			if f.NFlag() > 0 {
				if f.Changed("max-sandboxes") {
					q.MaxSandboxes = sandboxes
				}
				if f.Changed("max-memory") {
					if q.MaxMemoryBytes, err = parseSize(memory); err != nil {
						return err
					}
				}
				if f.Changed("max-cpus") {
					if q.MaxMilliCPUs, err = parseCPUs(cpus); err != nil {
						return err
					}
				}
				if f.Changed("max-checkpoint-bytes") {
					if q.MaxCheckpointBytes, err = parseSize(ckpt); err != nil {
						return err
					}
				}
				if f.Changed("requests-per-second") {
					q.RequestsPerSecond = rps
				}
				for _, b := range budgets {
					meter, n, ok := strings.Cut(b, "=")
					v, err := strconv.ParseFloat(strings.TrimSpace(n), 64)
					if !ok || meter == "" || err != nil || v < 0 {
						return fmt.Errorf("--budget %q: want METER=N with N ≥ 0, e.g. cpu_seconds=36000", b)
					}
					if q.Budgets == nil {
						q.Budgets = map[string]float64{}
					}
					if v == 0 {
						delete(q.Budgets, meter)
					} else {
						q.Budgets[meter] = v
					}
				}
				if q, err = cl.SetTenantQuota(cmd.Context(), args[0], q); err != nil {
					return err
				}
			}
			if g.json {
				return printJSON(cmd, q)
			}
			lim := func(v int64, f func(int64) string) string {
				if v == 0 {
					return "no limit"
				}
				return f(v)
			}
			num := func(v int64) string { return strconv.FormatInt(v, 10) }
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "sandboxes\t%s\n", lim(int64(q.MaxSandboxes), num))
			fmt.Fprintf(tw, "memory\t%s\n", lim(q.MaxMemoryBytes, formatSize))
			fmt.Fprintf(tw, "cpus\t%s\n", lim(q.MaxMilliCPUs, func(v int64) string { return fmt.Sprintf("%g", float64(v)/1000) }))
			fmt.Fprintf(tw, "checkpoint bytes\t%s\n", lim(q.MaxCheckpointBytes, formatSize))
			fmt.Fprintf(tw, "requests/s\t%s\n", lim(int64(q.RequestsPerSecond*1000), func(v int64) string { return fmt.Sprintf("%g", q.RequestsPerSecond) }))
			if len(q.Budgets) > 0 {
				month := time.Now().UTC().Format("2006-01")
				used := map[string]float64{}
				if rep, err := cl.Usage(cmd.Context(), client.UsageQuery{From: month + "-01", Tenant: args[0]}); err == nil {
					for _, r := range rep.Rows {
						used[r.Meter] += r.Quantity
					}
				}
				names := make([]string, 0, len(q.Budgets))
				for m := range q.Budgets {
					names = append(names, m)
				}
				sort.Strings(names)
				for _, m := range names {
					fmt.Fprintf(tw, "budget %s\t%g per month (used %.6g in %s)\n", m, q.Budgets[m], used[m], month)
				}
			}
			return tw.Flush()
		},
	}
	f := c.Flags()
	f.IntVar(&sandboxes, "max-sandboxes", 0, "sandboxes not destroyed, forks included")
	f.StringVar(&memory, "max-memory", "", "sum of the sandboxes' memory limits, e.g. 8Gi")
	f.StringVar(&cpus, "max-cpus", "", "sum of the sandboxes' CPU limits, e.g. 4 or 500m")
	f.StringVar(&ckpt, "max-checkpoint-bytes", "", "bytes the tenant's checkpoints may store, e.g. 50Gi")
	f.Float64Var(&rps, "requests-per-second", 0, "API requests per second (burst: twice as many)")
	f.StringArrayVar(&budgets, "budget", nil, "METER=N: what the tenant may consume per calendar month (repeatable; N=0 removes it)")
	return c
}
