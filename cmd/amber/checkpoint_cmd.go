package main

import (
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/amber-run/amber/api"
)

// progressPrinter shows a long operation's progress on stderr: one line
// rewritten in place on a terminal, otherwise one line per phase.
type progressPrinter struct {
	w     io.Writer
	tty   bool
	phase string
	start time.Time
	drawn bool
}

func newProgress(cmd *cobra.Command) *progressPrinter {
	w := cmd.ErrOrStderr()
	f, ok := w.(*os.File)
	return &progressPrinter{w: w, tty: ok && term.IsTerminal(int(f.Fd())), start: time.Now()}
}

func (p *progressPrinter) update(pr api.Progress) {
	if !p.tty {
		if pr.Phase != p.phase {
			fmt.Fprintf(p.w, "%s…\n", pr.Phase)
		}
		p.phase = pr.Phase
		return
	}
	line := fmt.Sprintf("%-8s %6.1fs", pr.Phase, time.Since(p.start).Seconds())
	if pr.Total > 0 {
		line += fmt.Sprintf("  %s / %s (%d%%)", formatSize(pr.Done), formatSize(pr.Total), pr.Done*100/pr.Total)
	}
	fmt.Fprintf(p.w, "\r\033[K%s", line)
	p.phase, p.drawn = pr.Phase, true
}

// done ends the progress line.
func (p *progressPrinter) done() {
	if p.tty && p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

func newCheckpointCmd(g *globalFlags) *cobra.Command {
	var tag string
	var stop bool
	c := &cobra.Command{
		Use:   "checkpoint SBX [--tag T] [--stop]",
		Short: "Checkpoint a sandbox (and list, inspect, delete checkpoints)",
		Long: `Cut a consistent checkpoint of a running sandbox — memory, processes, files,
environment — tied to the current position of its event log, and commit it
to the checkpoint store. Prints the checkpoint id (--json: the checkpoint).

  amber checkpoint SBX             checkpoint SBX
  amber checkpoint ls SBX          its checkpoints
  amber checkpoint inspect CKPT    one checkpoint as JSON
  amber checkpoint rm CKPT         delete one
  amber restore CKPT [--as-new]    bring one back`,
		Args: exactArgs(1, "a sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			p := newProgress(cmd)
			ck, err := cl.Checkpoint(cmd.Context(), args[0], api.CreateCheckpointRequest{Tag: tag, Stop: stop}, p.update)
			p.done()
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, ck)
			}
			fmt.Fprintln(cmd.OutOrStdout(), ck.ID)
			return nil
		},
	}
	c.Flags().StringVar(&tag, "tag", "", "name the checkpoint (tagged checkpoints are kept by retention)")
	c.Flags().BoolVar(&stop, "stop", false, "leave the sandbox stopped once the checkpoint is committed")
	c.AddCommand(newCheckpointLsCmd(g), newCheckpointInspectCmd(g), newCheckpointRmCmd(g))
	return c
}

func newCheckpointLsCmd(g *globalFlags) *cobra.Command {
	var all bool
	c := &cobra.Command{
		Use:     "ls SBX [--all]",
		Aliases: []string{"list"},
		Short:   "List a sandbox's checkpoints, oldest first",
		Args:    exactArgs(1, "a sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			cks, err := cl.ListCheckpoints(cmd.Context(), args[0], all)
			if err != nil {
				return err
			}
			if g.json {
				for _, ck := range cks {
					if err := printJSON(cmd, ck); err != nil {
						return err
					}
				}
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tLOG SEQ\tTAG\tIMAGE\tSTORED\tFROZEN\tCREATED")
			for _, ck := range cks {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", ck.ID, ck.State, ck.Seq, ck.Tag,
					formatSize(ck.Stats.ImageBytes), formatSize(ck.Stats.StoredBytes),
					time.Duration(ck.Stats.FrozenNS).Round(time.Millisecond), ck.Created.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&all, "all", false, "also pending, failed and deleted checkpoints")
	return c
}

func newCheckpointInspectCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect CKPT",
		Short: "Show a checkpoint as JSON",
		Args:  exactArgs(1, "a checkpoint id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			ck, err := cl.GetCheckpoint(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd, ck)
		},
	}
}

func newCheckpointRmCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "rm CKPT",
		Short: "Delete a checkpoint and the chunks only it used",
		Args:  exactArgs(1, "a checkpoint id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			return cl.DeleteCheckpoint(cmd.Context(), args[0])
		},
	}
}

func newRestoreCmd(g *globalFlags) *cobra.Command {
	var asNew bool
	c := &cobra.Command{
		Use:   "restore CKPT [--as-new]",
		Short: "Restore a checkpoint and print the sandbox id",
		Long: `Restore a checkpoint. Without --as-new its own sandbox is brought back to the
cut (a running incarnation is killed first); with --as-new a new sandbox is
made from it (a fork) and the original is untouched. The image is verified
chunk by chunk before anything runs.`,
		Args: exactArgs(1, "a checkpoint id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			p := newProgress(cmd)
			sb, err := cl.Restore(cmd.Context(), args[0], api.RestoreRequest{AsNew: asNew}, p.update)
			p.done()
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
	c.Flags().BoolVar(&asNew, "as-new", false, "restore into a new sandbox (a fork)")
	return c
}

func newRecoverCmd(g *globalFlags) *cobra.Command {
	var toEvent uint64
	c := &cobra.Command{
		Use:   "recover SBX [--to-event N]",
		Short: "Restore a sandbox in place from its latest checkpoint (or the last one cut at or before event N)",
		Args:  exactArgs(1, "a sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			p := newProgress(cmd)
			sb, err := cl.Recover(cmd.Context(), args[0], api.RecoverRequest{ToEvent: toEvent}, p.update)
			p.done()
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
	c.Flags().Uint64Var(&toEvent, "to-event", 0, "recover the state as of this event of the sandbox's log (see `amber sandbox events`)")
	return c
}
