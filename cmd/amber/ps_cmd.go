package main

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func newPsCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "ps SBX",
		Short: "List the processes running in a sandbox",
		Args:  exactArgs(1, "a sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			ps, err := cl.Processes(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				for _, p := range ps {
					printJSON(cmd, p)
				}
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PID\tPPID\tSTATE\tCOMMAND")
			for _, p := range ps {
				fmt.Fprintf(tw, "%d\t%d\t%s\t%s\n", p.PID, p.PPID, p.State, strings.Join(p.Args, " "))
			}
			return tw.Flush()
		},
	}
}

func newWaitCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "wait SBX PID",
		Short: "Wait for a background process to end; exit with its status",
		Long: `Wait until a process that 'amber exec -d' started has ended, print how it
ended, and exit with its exit code, as 'amber exec' does (128+N if signal N
ended it). The status is kept inside the sandbox: waiting after the end, or
again, gives the same answer. Interrupting amber stops the wait, not the
process. With --json, amber prints the status as {"code":…,"signal":…}.`,
		Args: exactArgs(2, "a sandbox id and a PID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := strconv.Atoi(args[1])
			if err != nil || pid <= 0 {
				return usageError{fmt.Errorf("PID %q is not a process id", args[1])}
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			st, err := cl.Wait(cmd.Context(), args[0], pid)
			if err != nil {
				return err
			}
			if g.json {
				if err := printJSON(cmd, st); err != nil {
					return err
				}
			} else if st.Signal != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "killed by %s (exit %d)\n", st.Signal, st.Code)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "exit %d\n", st.Code)
			}
			if code := exitCode(st); code != 0 {
				return exitError{code}
			}
			return nil
		},
	}
}

func newStdinCmd(g *globalFlags) *cobra.Command {
	var closeAfter bool
	c := &cobra.Command{
		Use:   "stdin SBX PID",
		Short: "Send amber's stdin to a background process's stdin",
		Long: `Send what amber reads on its stdin, to its end, to the stdin of a process that
'amber exec -d --stdin' started. The process's stdin stays open for more
unless --close is given, which closes it after (the process then reads end
of file).`,
		Args: exactArgs(2, "a sandbox id and a PID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := strconv.Atoi(args[1])
			if err != nil || pid <= 0 {
				return usageError{fmt.Errorf("PID %q is not a process id", args[1])}
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			return cl.WriteStdin(cmd.Context(), args[0], pid, cmd.InOrStdin(), closeAfter)
		},
	}
	c.Flags().BoolVar(&closeAfter, "close", false, "close the process's stdin after amber's stdin ends")
	return c
}
