package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/client"
)

const (
	defaultAddr    = "127.0.0.1:7777"
	defaultDataDir = "/var/lib/amber"
)

// globalFlags are shared by every command.
type globalFlags struct {
	addr, token, dataDir string
	json                 bool
	retry                time.Duration
}

func (g *globalFlags) register(root *cobra.Command) {
	pf := root.PersistentFlags()
	pf.StringVar(&g.addr, "addr", "", "daemon address host:port (default $AMBER_ADDR, DATA_DIR/addr, then "+defaultAddr+")")
	pf.StringVar(&g.token, "token", "", "API key (default $AMBER_TOKEN, then DATA_DIR/admin.key)")
	pf.StringVar(&g.dataDir, "data-dir", "", "daemon data directory (default $AMBER_DATA_DIR, then "+defaultDataDir+")")
	pf.BoolVar(&g.json, "json", false, "print one JSON object per result")
	pf.DurationVar(&g.retry, "retry", 0, "retry calls that are safe to repeat (reads) for up to this long while the daemon is unreachable or answers 503 (a node restarting, a sandbox being restored elsewhere)")
}

func (g *globalFlags) resolvedDataDir() string {
	return firstNonEmpty(g.dataDir, os.Getenv("AMBER_DATA_DIR"), defaultDataDir)
}

// client finds the daemon and its key: flags, then AMBER_ADDR/AMBER_TOKEN,
// then the files `amber up` writes into its data directory.
func (g *globalFlags) client() (*client.Client, error) {
	dir := g.resolvedDataDir()
	addr := firstNonEmpty(g.addr, os.Getenv("AMBER_ADDR"), readTrim(filepath.Join(dir, "addr")), defaultAddr)
	token := firstNonEmpty(g.token, os.Getenv("AMBER_TOKEN"))
	if token == "" {
		b, err := os.ReadFile(filepath.Join(dir, "admin.key"))
		if err != nil {
			return nil, fmt.Errorf("no API key: set AMBER_TOKEN, or run where %s is readable (--data-dir / AMBER_DATA_DIR name the daemon's data directory): %v",
				filepath.Join(dir, "admin.key"), err)
		}
		token = strings.TrimSpace(string(b))
	}
	if g.retry < 0 {
		return nil, usageError{fmt.Errorf("--retry %s: must be 0 or more", g.retry)}
	}
	c, err := client.New(addr, token)
	if err != nil {
		return nil, err
	}
	c.Retry = g.retry
	return c, nil
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// printJSON writes v as one line of JSON.
func printJSON(cmd *cobra.Command, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
	return err
}
