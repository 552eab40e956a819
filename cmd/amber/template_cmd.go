package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/internal/state/templatestore"
)

// `amber template` talks to the daemon: versions are immutable and named by
// the digest of their content, names are tags, and every version is kept
// in the daemon's blob store (internal/state/templatestore). Listing and
// inspecting need any key; the rest needs the operator's.
func newTemplateCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{Use: "template", Aliases: []string{"templates"}, Short: "List, inspect, import, build, tag and remove template versions"}
	c.AddCommand(newTemplateLsCmd(g), newTemplateInspectCmd(g), newTemplateImportCmd(g), newTemplateBuildCmd(g),
		newTemplateTagCmd(g), newTemplateRmCmd(g), newTemplateGCCmd(g))
	return c
}

// readDefaults reads a template.json (env, cwd, user, limits).
func readDefaults(path string) (*api.Template, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d api.Template
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		return nil, usageError{fmt.Errorf("%s: %v", path, err)}
	}
	return &d, nil
}

func printImport(cmd *cobra.Command, g *globalFlags, name string, res api.ImportTemplateResult) error {
	if g.json {
		return printJSON(cmd, res)
	}
	v := res.Version
	switch {
	case res.Existed:
		fmt.Fprintf(cmd.OutOrStdout(), "template %s already there (same content): %s\n", name, v.Digest)
	case res.Previous != "":
		fmt.Fprintf(cmd.OutOrStdout(), "template %s imported: %s (tag moved from %s)\n", name, v.Digest, res.Previous)
	default:
		fmt.Fprintf(cmd.OutOrStdout(), "template %s imported: %s\n", name, v.Digest)
	}
	return nil
}

func newTemplateImportCmd(g *globalFlags) *cobra.Command {
	var defaults string
	c := &cobra.Command{
		Use:   "import NAME TARBALL|- [--defaults template.json]",
		Short: "Import a root filesystem tarball (e.g. `docker export` output) as a version of NAME and tag it NAME",
		Long: `Import a root filesystem tarball as a template version. The version is the
digest of the content (files with modes, owners, links and file times;
defaults; package versions from its dpkg database): importing the same
content again makes no new version. NAME is a tag moved to the version;
sandboxes and checkpoints on the previous version keep it.`,
		Args: exactArgs(2, "a template name and a tarball path (or - for stdin)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !templatestore.ValidName.MatchString(args[0]) {
				return usageError{fmt.Errorf("template name %q: use 1-32 of [a-z0-9_], starting with a letter", args[0])}
			}
			var d *api.Template
			if defaults != "" {
				var err error
				if d, err = readDefaults(defaults); err != nil {
					return err
				}
			}
			in := cmd.InOrStdin()
			if args[1] != "-" {
				f, err := os.Open(args[1])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			res, err := cl.ImportTemplate(cmd.Context(), args[0], in, d)
			if err != nil {
				return err
			}
			return printImport(cmd, g, args[0], res)
		},
	}
	c.Flags().StringVar(&defaults, "defaults", "", "a template.json with the version's defaults: env, cwd, user, limits")
	return c
}

func newTemplateBuildCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "build NAME DIR",
		Short: "Make a version of NAME from a build's output directory (DIR/rootfs, optional DIR/template.json), e.g. a setup script's",
		Long: `Make a template version from a directory laid out as the setup scripts build
them: DIR/rootfs (the files) and optionally DIR/template.json (defaults). The
exact package versions are read from the rootfs's dpkg database and recorded
in the version. Rebuilding with pinned inputs (same packages, same file
times) gives the same version; any change gives a new one and moves the tag.`,
		Args: exactArgs(2, "a template name and a directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, dir := args[0], args[1]
			if !templatestore.ValidName.MatchString(name) {
				return usageError{fmt.Errorf("template name %q: use 1-32 of [a-z0-9_], starting with a letter", name)}
			}
			rootfs := filepath.Join(dir, "rootfs")
			if st, err := os.Stat(rootfs); err != nil || !st.IsDir() {
				return usageError{fmt.Errorf("%s is not a directory: want DIR/rootfs (and optionally DIR/template.json)", rootfs)}
			}
			var d *api.Template
			if _, err := os.Stat(filepath.Join(dir, "template.json")); err == nil {
				var err error
				if d, err = readDefaults(filepath.Join(dir, "template.json")); err != nil {
					return err
				}
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			// GNU tar keeps owners, modes, links, xattrs and file times.
			tarCmd := exec.CommandContext(cmd.Context(), "tar", "--numeric-owner", "--xattrs", "-C", rootfs, "-cf", "-", ".")
			out, err := tarCmd.StdoutPipe()
			if err != nil {
				return err
			}
			var stderr strings.Builder
			tarCmd.Stderr = &stderr
			if err := tarCmd.Start(); err != nil {
				return err
			}
			res, err := cl.ImportTemplate(cmd.Context(), name, out, d)
			io.Copy(io.Discard, out)
			if werr := tarCmd.Wait(); werr != nil && err == nil {
				err = fmt.Errorf("tar %s: %v: %s", rootfs, werr, strings.TrimSpace(stderr.String()))
			}
			if err != nil {
				return err
			}
			return printImport(cmd, g, name, res)
		},
	}
}

func newTemplateLsCmd(g *globalFlags) *cobra.Command {
	var all bool
	c := &cobra.Command{
		Use:     "ls [--all]",
		Aliases: []string{"list"},
		Short:   "List template tags and the version each names (--all: every version)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			l, err := cl.TemplateList(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, l)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			if !all {
				fmt.Fprintln(tw, "NAME\tVERSION\tPOOL")
				for _, t := range l.Templates {
					v := t.Version
					if v == "" {
						v = "(setup script's; digested at first use)"
					}
					fmt.Fprintf(tw, "%s\t%s\t%d/%d\n", t.Name, v, t.PoolReady, t.PoolSize)
				}
				return tw.Flush()
			}
			sort.Slice(l.Versions, func(i, j int) bool { return l.Versions[i].Created.After(l.Versions[j].Created) })
			fmt.Fprintln(tw, "VERSION\tNAME\tTAGS\tSANDBOXES\tCHECKPOINTS\tSIZE\tLOCAL\tSTORED\tCREATED")
			for _, v := range l.Versions {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%v\t%v\t%s\n", v.Digest, v.Name, strings.Join(v.Tags, ","),
					len(v.Sandboxes), len(v.Checkpoints), formatSize(v.Bytes), v.Local, v.Stored, v.Created.Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVarP(&all, "all", "a", false, "list every version with what references it")
	return c
}

func newTemplateInspectCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect NAME|NAME@sha256:HEX|sha256:HEX",
		Short: "Show a template version: digest, defaults, exact package versions, references",
		Args:  exactArgs(1, "a template reference"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			v, err := cl.InspectTemplate(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd, v)
		},
	}
}

func newTemplateTagCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "tag NAME VERSION",
		Short: "Point tag NAME at VERSION (sha256:HEX or another reference); new sandboxes of NAME get it",
		Args:  exactArgs(2, "a template name and a version"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			v, err := cl.TagTemplate(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, v)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s → %s\n", args[0], v.Digest)
			return nil
		},
	}
}

func newTemplateRmCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME|NAME@sha256:HEX|sha256:HEX",
		Short: "Remove a tag (NAME) or a version nothing references (here and in the blob store)",
		Args:  exactArgs(1, "a template reference"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			return cl.RemoveTemplate(cmd.Context(), args[0])
		},
	}
}

func newTemplateGCCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "gc",
		Short: "Remove every template version no tag, sandbox or retained checkpoint references",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			res, err := cl.GCTemplates(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd, res)
			}
			for _, d := range res.Removed {
				fmt.Fprintln(cmd.OutOrStdout(), "removed", d)
			}
			return nil
		},
	}
}

func newUpgradeCmd(g *globalFlags) *cobra.Command {
	var template string
	c := &cobra.Command{
		Use:   "upgrade SBX --template NAME[@sha256:HEX]",
		Short: "Move a sandbox to another template version: a new sandbox with its files; the old one is checkpointed and stopped",
		Long: `Upgrade creates a new sandbox from the template version given, with the old
sandbox's tenant, limits, env and recovery policy, and copies into it the
files the old sandbox had changed on top of its template (new, modified and
deleted files). Processes do not carry over: the new sandbox boots fresh.
The old sandbox is checkpointed (tagged pre-upgrade-…) and stopped; recover
it to go back. Both sandboxes' logs record sandbox.upgraded. Prints the new
sandbox's id.`,
		Args: exactArgs(1, "a sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if template == "" {
				return usageError{fmt.Errorf("--template is required (e.g. --template python@sha256:…)")}
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			sb, err := cl.UpgradeSandbox(cmd.Context(), args[0], template)
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
	c.Flags().StringVar(&template, "template", "", "the template version: NAME (its tag), NAME@sha256:HEX or sha256:HEX")
	return c
}
