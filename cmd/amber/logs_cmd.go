package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/api"
)

func newLogsCmd(g *globalFlags) *cobra.Command {
	var (
		follow bool
		offset int64
	)
	cmd := &cobra.Command{
		Use:   "logs SBX PID",
		Short: "Print a process's output; with -f, follow it until it ends",
		Long: `Print the output of a process that amber started in the sandbox (exec, or
exec -d), from byte --offset on (stdout and stderr, in the order the process
wrote them, to amber's stdout and stderr). The output is kept inside the
sandbox (the last 1 MiB per process), so it is there after a daemon restart,
a checkpoint or a restore. With -f amber follows the output until the
process ends and exits with its status, re-attaching by itself from the
last byte it printed when the stream breaks: nothing is printed twice or
skipped. "rewound" (the sandbox was restored to an older cut) and "lost"
(output fell out of the kept window) are reported on stderr. With --json,
every frame is printed as it came.`,
		Args: exactArgs(2, "a sandbox id and a PID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := strconv.Atoi(args[1])
			if err != nil || pid <= 0 {
				return usageError{fmt.Errorf("PID %q is not a process id", args[1])}
			}
			if offset < 0 {
				return usageError{fmt.Errorf("--offset %d is negative", offset)}
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			var exit *api.ExitStatus
			err = cl.ProcessOutput(ctx, args[0], pid, offset, follow, func(f api.OutputFrame) error {
				if g.json {
					_ = printJSON(cmd, f)
				} else {
					switch f.Stream {
					case "stdout":
						_, _ = cmd.OutOrStdout().Write(f.Data)
					case "stderr":
						_, _ = cmd.ErrOrStderr().Write(f.Data)
					case "rewound":
						fmt.Fprintf(cmd.ErrOrStderr(), "amber: the sandbox was restored to an older cut: output goes on from byte %d\n", f.Offset)
					case "lost":
						fmt.Fprintf(cmd.ErrOrStderr(), "amber: lost %d bytes of output (no longer kept); going on from byte %d\n", f.Lost, f.Offset)
					}
				}
				if f.Stream == "exited" {
					exit = f.Exit
				}
				return nil
			})
			if err != nil {
				return err
			}
			if exit != nil {
				if code := exitCode(*exit); code != 0 {
					return exitError{code}
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the output until the process ends, then exit with its status")
	cmd.Flags().Int64Var(&offset, "offset", 0, "start at this byte of the output")
	return cmd
}
