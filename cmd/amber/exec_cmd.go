package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/amber-run/amber/api"
)

func newExecCmd(g *globalFlags) *cobra.Command {
	var interactive, tty, detach, openStdin bool
	var timeout time.Duration
	var env []string
	var cwd, shellCmd string
	c := &cobra.Command{
		Use:   "exec SBX [flags] -- CMD [ARGS...]  |  exec SBX -c 'SHELL COMMAND LINE'",
		Short: "Run a command in a sandbox, streaming its output; exit with its status",
		Long: `Run a command in a sandbox to completion. Its stdout and stderr stream to
amber's own as they are produced, and amber exits with the command's exit code
(128+N if it died of signal N, 124 if --timeout killed it).

With -d, the command starts in the background instead (it keeps running
between execs; its output goes to /run/amber/proc/<pid>.log inside the
sandbox, and 'amber logs SBX PID -f' follows it) and amber prints its PID.
Either way the command is a child of the sandbox's own init (its agent), so
it and everything it leaves running are part of every checkpoint and come
back with a restore.

With -c, the command is one shell command line, run by the sandbox's /bin/sh
-c ('ls -la | wc -l'); without, CMD and ARGS are run as they are, no shell.

With -i, amber's stdin is streamed to the command; without it the command's
stdin is empty. With -d --stdin, the background process's stdin stays open:
'amber stdin SBX PID' sends to it. -t runs the command on a pseudo-terminal. With --json, amber
prints one JSON object at the end: {"exit":{…},"stdout":…,"stderr":…}.`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case shellCmd != "" && len(args) != 1:
				return usageError{fmt.Errorf("exec -c takes the command line as its value, and no CMD after the sandbox id: amber exec SBX -c 'ls | wc -l'")}
			case shellCmd == "" && len(args) < 2:
				return usageError{fmt.Errorf("exec needs a sandbox id and a command: amber exec SBX -- CMD [ARGS...] (or -c 'SHELL COMMAND LINE')")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			if detach {
				if interactive || tty || timeout != 0 {
					return usageError{fmt.Errorf("--detach runs in the background: -i, -t and --timeout do not apply (--stdin keeps its stdin open for 'amber stdin')")}
				}
				pid, err := cl.StartProcess(cmd.Context(), args[0], api.StartProcessRequest{Args: args[1:], Cmd: shellCmd, Env: env, Cwd: cwd, Stdin: openStdin})
				if err != nil {
					return err
				}
				if g.json {
					return printJSON(cmd, api.StartProcessResponse{PID: pid})
				}
				fmt.Fprintln(cmd.OutOrStdout(), pid)
				return nil
			}
			if openStdin {
				return usageError{fmt.Errorf("--stdin is for a background process (-d); use -i to stream stdin to a command")}
			}
			req := api.ExecRequest{Args: args[1:], Cmd: shellCmd, Env: env, Cwd: cwd, TTY: tty, TimeoutMS: timeout.Milliseconds()}
			var stdin io.Reader
			if interactive {
				stdin = os.Stdin
				if tty && term.IsTerminal(int(os.Stdin.Fd())) {
					if old, err := term.MakeRaw(int(os.Stdin.Fd())); err == nil {
						defer term.Restore(int(os.Stdin.Fd()), old)
					}
				}
			}
			stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			var outBuf, errBuf bytes.Buffer
			if g.json {
				stdout, stderr = &outBuf, &errBuf
			}
			st, err := cl.Exec(cmd.Context(), args[0], req, stdin, stdout, stderr)
			if err != nil {
				return err
			}
			if g.json {
				if err := printJSON(cmd, map[string]any{"exit": st, "stdout": outBuf.String(), "stderr": errBuf.String()}); err != nil {
					return err
				}
			}
			if st.Reason != "" && !g.json {
				fmt.Fprintf(cmd.ErrOrStderr(), "amber: killed: %s\n", st.Reason)
			}
			if code := exitCode(st); code != 0 {
				return exitError{code}
			}
			return nil
		},
	}
	f := c.Flags()
	f.BoolVarP(&interactive, "interactive", "i", false, "stream stdin to the command")
	f.BoolVarP(&tty, "tty", "t", false, "run on a pseudo-terminal")
	f.BoolVarP(&detach, "detach", "d", false, "start in the background and print the PID")
	f.StringVarP(&shellCmd, "command", "c", "", "a shell command line, run by the sandbox's /bin/sh -c")
	f.BoolVar(&openStdin, "stdin", false, "with -d: keep the process's stdin open ('amber stdin SBX PID' sends to it)")
	f.DurationVar(&timeout, "timeout", 0, "kill the command after this long (e.g. 30s); 0 means none")
	f.StringArrayVarP(&env, "env", "e", nil, "KEY=VALUE for the command (repeatable)")
	f.StringVarP(&cwd, "workdir", "w", "", "working directory inside the sandbox")
	return c
}

// exitCode maps an exit status to a shell-style code.
func exitCode(st api.ExitStatus) int {
	switch {
	case st.TimedOut:
		return 124
	case st.Signal != "":
		if sig, err := parseSignalName(st.Signal); err == nil {
			return 128 + int(sig)
		}
		if st.Code != 0 {
			return st.Code
		}
		return 128 + int(syscall.SIGKILL)
	}
	return st.Code
}
