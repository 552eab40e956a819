package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/client"
)

func newSecretCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{
		Use:   "secret",
		Short: "Set, list and delete secrets: sandboxes see placeholders, the gateway sends the values to their hosts only",
		Long: `A secret's value never enters a sandbox. The sandbox holds the placeholder
amber-secret://NAME (in an environment variable, a config file, …) and sends it
in a request header; the egress gateway replaces it with the value only for
requests to the hosts the secret is bound to, and refuses any other.

  printf %s "$STRIPE_KEY" | amber secret set stripe --host api.stripe.com:443
  amber sandbox create -t python -e STRIPE_KEY=amber-secret://stripe`,
	}
	var tenant string
	c.PersistentFlags().StringVar(&tenant, "tenant", "", "the tenant whose secrets these are (default: your key's)")
	whose := func(cmd *cobra.Command, cl *client.Client) (string, error) {
		if tenant != "" {
			return tenant, nil
		}
		info, err := cl.Info(cmd.Context())
		if err != nil {
			return "", err
		}
		return info.Tenant, nil
	}

	var hosts []string
	var fromEnv string
	set := &cobra.Command{
		Use:   "set NAME --host HOST:PORT [--host …] [--from-env VAR]",
		Short: "Set a secret; its value is read from stdin (or --from-env), never from the command line",
		Args:  exactArgs(1, "a secret name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(hosts) == 0 {
				return usageError{fmt.Errorf("--host is required: the HOST:PORT the secret may be sent to")}
			}
			var value []byte
			if fromEnv != "" {
				v, ok := os.LookupEnv(fromEnv)
				if !ok {
					return usageError{fmt.Errorf("--from-env %s: not set", fromEnv)}
				}
				value = []byte(v)
			} else {
				b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 1<<20))
				if err != nil {
					return err
				}
				value = bytes.TrimRight(b, "\r\n")
			}
			if len(value) == 0 {
				return usageError{fmt.Errorf("empty value: pipe it on stdin or use --from-env")}
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			t, err := whose(cmd, cl)
			if err != nil {
				return err
			}
			sec, err := cl.PutSecret(cmd.Context(), t, args[0], value, hosts)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, sec)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s  (sent only to %s)\n", sec.Placeholder, strings.Join(sec.Hosts, ", "))
			return nil
		},
	}
	set.Flags().StringSliceVar(&hosts, "host", nil, "HOST:PORT pattern the secret may be sent to (repeatable; *.suffix allowed)")
	set.Flags().StringVar(&fromEnv, "from-env", "", "read the value from this environment variable instead of stdin")

	ls := &cobra.Command{
		Use:   "ls",
		Short: "List secrets (names, placeholders, hosts; never values)",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			t, err := whose(cmd, cl)
			if err != nil {
				return err
			}
			xs, err := cl.Secrets(cmd.Context(), t)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, xs)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tPLACEHOLDER\tHOSTS\tUPDATED")
			for _, x := range xs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", x.Name, x.Placeholder, strings.Join(x.Hosts, ","), x.Updated.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Delete a secret",
		Args:  exactArgs(1, "a secret name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			t, err := whose(cmd, cl)
			if err != nil {
				return err
			}
			return cl.DeleteSecret(cmd.Context(), t, args[0])
		},
	}
	c.AddCommand(set, ls, rm)
	return c
}
