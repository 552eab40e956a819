// Command amber is Amber's one binary: the daemon (`amber up`), the CLI and
// the agent harness. This is the only package that picks implementations
// (drivers.go wires the sandbox drivers, up.go the stores).
//
// Exit status: 0 on success; 1 when amber itself fails (the message names
// the cause); 2 for bad usage; `amber exec` exits with the command's status
// (128+N when it died of signal N, 124 when it timed out).
//
// May import: anything: it is the wiring.
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

var version = "dev"

func main() {
	// ── DRIVER INIT HOOKS ────────────────────────────────────────────────
	// Drivers that re-execute this binary (runc's libcontainer, for the
	// criu driver) take over here, before cobra, flags or goroutines.
	// Each hook returns at once in an ordinary process. See drivers.go.
	runDriverInitHooks()
	// ─────────────────────────────────────────────────────────────────────

	os.Exit(run(os.Args[1:]))
}

// exitError carries an exit status without a message (amber exec).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError is a mistake in how amber was called.
type usageError struct{ error }

func run(args []string) int {
	root := newRoot()
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	fmt.Fprintf(os.Stderr, "amber: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) || isFlagError(err) {
		if cmd != nil {
			fmt.Fprintf(os.Stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
		return 2
	}
	return 1
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "amber",
		Short:         "Amber runs AI-agent sandboxes whose recovery is exact",
		SilenceErrors: true,
		SilenceUsage:  true,
		Version:       version,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{err} })
	g := &globalFlags{}
	g.register(root)
	root.AddCommand(
		newUpCmd(g),
		newVersionCmd(),
		newSandboxCmd(g),
		newExecCmd(g),
		newFilesCmd(g),
		newPsCmd(g),
		newWaitCmd(g),
		newStdinCmd(g),
		newLogsCmd(g),
		newPortCmd(g),
		newTemplateCmd(g),
		newCheckpointCmd(g),
		newRestoreCmd(g),
		newTenantCmd(g),
		newSecretCmd(g),
		newDemoCmd(g),
		newChaosCmd(g),
		newKeyCmd(g),
		newAuditCmd(g),
		newSessionCmd(g),
		newUsageCmd(g),
		newNodeCmd(g),
		newAPICmd(g),
	)
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print amber's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "amber", version)
			return nil
		},
	}
}

// exactArgs is cobra.ExactArgs with a usage error that names the arguments.
func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("%s needs %s (got %d arguments)", cmd.CommandPath(), names, len(args))}
		}
		return nil
	}
}

// isFlagError recognises cobra's own usage errors.
func isFlagError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand", "accepts ", "requires at least"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
