package main

import (
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func newFilesCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{Use: "files", Short: "Read and write files inside a sandbox"}
	c.AddCommand(newFilesLs(g), newFilesCat(g), newFilesPut(g), newFilesGet(g), newFilesRm(g), newFilesMkdir(g), newFilesMv(g))
	return c
}

func newFilesLs(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "ls SBX [PATH]",
		Short: "List a directory (default /)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := "/"
			if len(args) == 2 {
				dir = args[1]
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			ents, err := cl.List(cmd.Context(), args[0], dir)
			if err != nil {
				return err
			}
			if g.json {
				for _, e := range ents {
					printJSON(cmd, e)
				}
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			for _, e := range ents {
				name := e.Name
				if e.Type == "dir" {
					name += "/"
				} else if e.Link != "" {
					name += " -> " + e.Link
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", e.Type, e.Mode, e.Size, e.ModTime.Local().Format(time.DateTime), name)
			}
			return tw.Flush()
		},
	}
}

func newFilesCat(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "cat SBX PATH",
		Short: "Print a file",
		Args:  exactArgs(2, "a sandbox id and a path"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			return cl.ReadFile(cmd.Context(), args[0], args[1], cmd.OutOrStdout())
		},
	}
}

func newFilesPut(g *globalFlags) *cobra.Command {
	var mode string
	c := &cobra.Command{
		Use:   "put SBX LOCAL REMOTE",
		Short: "Upload a local file (- for stdin) to REMOTE",
		Args:  exactArgs(3, "a sandbox id, a local file and a remote path"),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := strconv.ParseUint(mode, 8, 32)
			if err != nil || m > 0o7777 {
				return usageError{fmt.Errorf("--mode %q is not octal like 0644", mode)}
			}
			var r io.Reader = cmd.InOrStdin()
			if args[1] != "-" {
				f, err := os.Open(args[1])
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			if err := cl.WriteFile(cmd.Context(), args[0], args[2], r, os.FileMode(m)); err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, map[string]any{"path": args[2], "written": true})
			}
			return nil
		},
	}
	c.Flags().StringVar(&mode, "mode", "0644", "permissions of the remote file (octal)")
	return c
}

func newFilesGet(g *globalFlags) *cobra.Command {
	var tarOut bool
	c := &cobra.Command{
		Use:   "get SBX REMOTE [LOCAL]",
		Short: "Download REMOTE to LOCAL (default: its base name; - for stdout); --tar for a directory",
		Args:  cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			local := path.Base(args[1])
			if tarOut {
				local += ".tar"
			}
			if len(args) == 3 {
				local = args[2]
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			var w io.Writer = cmd.OutOrStdout()
			var f *os.File
			if local != "-" {
				if f, err = os.Create(local); err != nil {
					return err
				}
				w = f
			}
			if tarOut {
				err = cl.TarOut(cmd.Context(), args[0], args[1], w)
			} else {
				err = cl.ReadFile(cmd.Context(), args[0], args[1], w)
			}
			if f != nil {
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					os.Remove(local)
				}
			}
			if err == nil && g.json {
				return printJSON(cmd, map[string]any{"path": args[1], "local": local})
			}
			return err
		},
	}
	c.Flags().BoolVar(&tarOut, "tar", false, "download as a tar archive (for directories)")
	return c
}

func newFilesRm(g *globalFlags) *cobra.Command {
	var recursive bool
	c := &cobra.Command{
		Use:   "rm SBX PATH",
		Short: "Remove a file (-r for a directory)",
		Args:  exactArgs(2, "a sandbox id and a path"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			return cl.Remove(cmd.Context(), args[0], args[1], recursive)
		},
	}
	c.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove a directory and its contents")
	return c
}

func newFilesMkdir(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "mkdir SBX PATH",
		Short: "Create a directory",
		Args:  exactArgs(2, "a sandbox id and a path"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			return cl.Mkdir(cmd.Context(), args[0], args[1], 0o755)
		},
	}
}

func newFilesMv(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "mv SBX FROM TO",
		Short: "Rename or move a file or directory (replaces a file at TO)",
		Args:  exactArgs(3, "a sandbox id and two paths"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			return cl.Rename(cmd.Context(), args[0], args[1], args[2])
		},
	}
}
