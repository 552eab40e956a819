package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/internal/edge/e2b"
)

// newKeyE2BCmd is `amber key e2b [KEY]`: the E2B-form alias of an Amber
// key (the --token's by default), for E2B_API_KEY.
func newKeyE2BCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "e2b [KEY]",
		Short: "Print the e2b_<hex> alias of an Amber key (default: the one this CLI uses), for E2B_API_KEY",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key := ""
			if len(args) == 1 {
				key = args[0]
			} else {
				dir := g.resolvedDataDir()
				if key = firstNonEmpty(g.token, os.Getenv("AMBER_TOKEN"), readTrim(filepath.Join(dir, "admin.key"))); key == "" {
					return usageError{fmt.Errorf("no key: pass one, set AMBER_TOKEN or run where %s is readable", filepath.Join(dir, "admin.key"))}
				}
			}
			fmt.Fprintln(cmd.OutOrStdout(), e2b.Alias(strings.TrimSpace(key)))
			return nil
		},
	}
}

// newTimeoutCmd is `amber sandbox timeout SBX DURATION`: a new deadline
// from now (0: none).
func newTimeoutCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "timeout SBX DURATION",
		Short: "Set a sandbox's deadline to DURATION from now (10m, 600 seconds; 0 removes it)",
		Args:  exactArgs(2, "a sandbox id and a duration"),
		RunE: func(cmd *cobra.Command, args []string) error {
			secs, err := parseTimeout(args[1])
			if err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			sb, err := cl.SetTimeout(cmd.Context(), args[0], secs)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, sb)
			}
			fmt.Fprintln(cmd.OutOrStdout(), formatExpiry(sb))
			return nil
		},
	}
}

// parseTimeout reads a timeout as a Go duration (10m, 1h30m) or whole
// seconds; "" is 0 (none).
func parseTimeout(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= 0 {
		return n, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d%time.Second != 0 {
		return 0, usageError{fmt.Errorf("timeout %q: want whole seconds (600) or a duration (10m)", s)}
	}
	return int64(d / time.Second), nil
}

// parsePairs reads repeated KEY=VALUE flags into a map (nil if none).
func parsePairs(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usageError{fmt.Errorf("%s %q is not KEY=VALUE", flag, kv)}
		}
		m[k] = v
	}
	return m, nil
}

func formatPairs(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + m[k]
	}
	return strings.Join(keys, ",")
}

func formatExpiry(sb api.Sandbox) string {
	if sb.ExpiresAt == nil {
		return "-"
	}
	s := sb.ExpiresAt.Local().Format(time.DateTime)
	if sb.OnTimeout != "" {
		s += " (" + sb.OnTimeout + ")"
	}
	return s
}
