package main

import (
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/templateimport"
)

// `amber template` works on this node's template catalog directly (like
// `make setup`, it is an operator's command run as root on the node); a
// running daemon finds a newly imported template at its next create.
func newTemplateCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{Use: "template", Short: "List and import sandbox templates on this node"}
	c.AddCommand(newTemplateImportCmd(g), newTemplateLsCmd(g))
	return c
}

func templatesDir() string { return filepath.Join(cacheDir(), "templates") }

func newTemplateImportCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "import NAME TARBALL|-",
		Short: "Import a root filesystem tarball (e.g. `docker export` output) as template NAME",
		Args:  exactArgs(2, "a template name and a tarball path (or - for stdin)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := cmd.InOrStdin()
			if args[1] != "-" {
				f, err := os.Open(args[1])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			res, err := templateimport.Import(cmd.Context(), templatesDir(), args[0], in)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, res)
			}
			verb := "imported"
			if res.Existed {
				verb = "already there (same content)"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "template %s %s: %s\n", res.Name, verb, res.Dir)
			return nil
		},
	}
}

func newTemplateLsCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List the templates on this node",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cat, err := engine.LoadCatalog(templatesDir())
			if err != nil {
				return err
			}
			if g.json {
				for _, n := range cat.Names() {
					t, _ := cat.Get(n)
					if err := printJSON(cmd, t); err != nil {
						return err
					}
				}
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tVERSION\tROOTFS")
			for _, n := range cat.Names() {
				t, _ := cat.Get(n)
				fmt.Fprintf(tw, "%s\t%s\t%s\n", t.Name, t.Version, t.RootFS)
			}
			return tw.Flush()
		},
	}
}
