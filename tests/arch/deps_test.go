// Package arch checks that the house stays as drawn: every package imports
// only what its group's package doc allows (a "May import:" line), and
// docs/ARCHITECTURE.md's map lists every folder that holds a package.
package arch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/amber-run/amber"

// pkg is what the checks need of one package of the module.
type pkg struct {
	Dir        string   // relative to the module root, "/"-separated
	Imports    []string // the module's packages it imports (not its tests), relative
	HasNonTest bool     // it has non-test Go files (a test-only package imports nothing to check)
}

// rule is a group's "May import:" line: the package doc of the folder Dir
// allows Allowed (each a folder: that package and everything under it),
// besides the group's own folder. Nothing means nothing of Amber's
// outside the group; "anything" means no limit.
type rule struct {
	Dir      string
	Allowed  []string
	Anything bool
}

// testKit reports whether dir is a test kit (a package that exists for
// tests: …test, e.g. enginetest, blobtest): it may import what its tests
// need (drivers, stores), never cmd/.
func testKit(dir string) bool { return strings.HasSuffix(filepath.Base(dir), "test") }

// violations returns one line per import a rule forbids, and per package
// that no rule covers.
func violations(pkgs []pkg, rules map[string]rule) []string {
	var out []string
	for _, p := range pkgs {
		if !p.HasNonTest {
			continue
		}
		r, ok := ruleFor(p.Dir, rules)
		if !ok {
			out = append(out, fmt.Sprintf("%s: no group rule (a \"May import:\" line in its or a parent folder's package doc)", p.Dir))
			continue
		}
		for _, imp := range p.Imports {
			if r.Anything || under(imp, r.Dir) || testKit(p.Dir) && !under(imp, "cmd") {
				continue
			}
			allowed := false
			for _, a := range r.Allowed {
				if under(imp, a) {
					allowed = true
					break
				}
			}
			if !allowed {
				out = append(out, fmt.Sprintf("%s imports %s, which its group's doc (%s) does not allow (May import: %s)",
					p.Dir, imp, r.Dir, strings.Join(r.Allowed, ", ")))
			}
		}
	}
	sort.Strings(out)
	return out
}

// ruleFor returns the rule of the nearest folder at or above dir.
func ruleFor(dir string, rules map[string]rule) (rule, bool) {
	for d := dir; ; d = filepath.Dir(d) {
		if r, ok := rules[d]; ok {
			return r, true
		}
		if d == "." || d == "/" {
			return rule{}, false
		}
	}
}

func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

var mayImport = regexp.MustCompile(`(?m)^May import: (.*)$`)

// parseRule reads the "May import:" line of a package doc.
func parseRule(dir, doc string) (rule, bool) {
	m := mayImport.FindStringSubmatch(doc)
	if m == nil {
		return rule{}, false
	}
	r := rule{Dir: dir}
	line := strings.TrimSuffix(strings.TrimSpace(m[1]), ".")
	switch {
	case strings.HasPrefix(line, "anything"):
		r.Anything = true
	case strings.HasPrefix(line, "nothing of Amber's"):
	default:
		for _, a := range strings.Split(line, ",") {
			if a = strings.TrimSuffix(strings.TrimSpace(a), "/"); a != "" {
				r.Allowed = append(r.Allowed, a)
			}
		}
	}
	return r, true
}

// root is the module's root (the test runs in tests/arch).
func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", r, err)
	}
	return r
}

// listPackages runs go list over the module (every build tag the tests use).
func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-tags", "seccomp,extended", "-json", "./...")
	cmd.Dir = root(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			ImportPath string
			GoFiles    []string
			CgoFiles   []string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		q := pkg{Dir: rel(p.ImportPath), HasNonTest: len(p.GoFiles)+len(p.CgoFiles) > 0}
		for _, imp := range p.Imports {
			if under(imp, module) {
				q.Imports = append(q.Imports, rel(imp))
			}
		}
		pkgs = append(pkgs, q)
	}
	return pkgs
}

func rel(importPath string) string {
	if importPath == module {
		return "."
	}
	return strings.TrimPrefix(importPath, module+"/")
}

// readRules reads every package doc of the module for "May import:" lines.
func readRules(t *testing.T, pkgs []pkg) map[string]rule {
	t.Helper()
	rules := map[string]rule{}
	r := root(t)
	for _, p := range pkgs {
		fset := token.NewFileSet()
		files, err := parser.ParseDir(fset, filepath.Join(r, p.Dir), func(fi os.FileInfo) bool {
			return !strings.HasSuffix(fi.Name(), "_test.go")
		}, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, ap := range files {
			for _, f := range ap.Files {
				if f.Doc == nil {
					continue
				}
				if rl, ok := parseRule(p.Dir, f.Doc.Text()); ok {
					if old, dup := rules[p.Dir]; dup && fmt.Sprint(old) != fmt.Sprint(rl) {
						t.Errorf("%s: two different \"May import:\" lines", p.Dir)
					}
					rules[p.Dir] = rl
				}
			}
		}
	}
	return rules
}

// TestDependencies: every package imports only what its group's doc
// allows; the drivers import nothing of internal/ but drivers/internal.
func TestDependencies(t *testing.T) {
	pkgs := listPackages(t)
	rules := readRules(t, pkgs)
	if len(rules) < 10 {
		t.Fatalf("only %d group rules found: the docs lost their \"May import:\" lines?", len(rules))
	}
	t.Logf("%d packages, %d group rules", len(pkgs), len(rules))
	for _, v := range violations(pkgs, rules) {
		t.Error(v)
	}
	for _, p := range pkgs {
		if !under(p.Dir, "drivers") {
			continue
		}
		for _, imp := range p.Imports {
			if under(imp, "internal") {
				t.Errorf("%s imports %s: drivers import nothing of internal/ (only drivers/internal)", p.Dir, imp)
			}
		}
	}
	for _, p := range pkgs {
		if p.Dir == "lib/netns" && len(p.Imports) > 0 {
			t.Errorf("lib/netns imports %v: it is a leaf that imports nothing of Amber's", p.Imports)
		}
	}
}

// TestDependenciesFixture: the check fails on a graph with forbidden
// imports (a driver importing the engine, a store importing internal/,
// a core package importing a store), and on a package no rule covers —
// so TestDependencies can fail.
func TestDependenciesFixture(t *testing.T) {
	rules := map[string]rule{}
	for dir, doc := range map[string]string{
		"core":             "May import: nothing of Amber's outside core.",
		"drivers":          "May import: core, lib, drivers/internal.",
		"stores":           "May import: core, lib.",
		"internal/engine":  "May import: core, lib, internal/state.",
		"cmd/amber":        "May import: anything: it is the wiring.",
		"internal/obs/doc": "no rule here",
	} {
		if r, ok := parseRule(dir, doc); ok {
			rules[dir] = r
		}
	}
	pkgs := []pkg{
		{Dir: "drivers/gvisor", HasNonTest: true, Imports: []string{"core/sandbox", "drivers/internal/layer", "internal/engine"}},
		{Dir: "stores/sqlite", HasNonTest: true, Imports: []string{"core/eventlog", "internal/state/meta"}},
		{Dir: "core/eventlog", HasNonTest: true, Imports: []string{"core/errdefs", "stores/sqlite"}},
		{Dir: "internal/engine", HasNonTest: true, Imports: []string{"internal/state/meta", "internal/edge/server"}},
		{Dir: "internal/engine/enginetest", HasNonTest: true, Imports: []string{"drivers/gvisor", "stores/sqlite"}},
		{Dir: "internal/nowhere", HasNonTest: true, Imports: []string{"core/clock"}},
		{Dir: "cmd/amber", HasNonTest: true, Imports: []string{"internal/engine", "drivers/gvisor"}},
		{Dir: "deploy", Imports: nil},
	}
	got := violations(pkgs, rules)
	want := []string{
		"core/eventlog imports stores/sqlite",
		"drivers/gvisor imports internal/engine",
		"internal/engine imports internal/edge/server",
		"internal/nowhere: no group rule",
		"stores/sqlite imports internal/state/meta",
	}
	if len(got) != len(want) {
		t.Fatalf("violations:\n%s\nwant %d: %v", strings.Join(got, "\n"), len(want), want)
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) {
			t.Errorf("violation %d: %q, want it to start with %q", i, got[i], w)
		}
	}
}

// TestArchitectureMap: the map at the top of docs/ARCHITECTURE.md (the
// "## Map" section: one "- `folder/` — what it is" line each) lists every
// folder that holds a package, and no folder that does not exist.
func TestArchitectureMap(t *testing.T) {
	r := root(t)
	f, err := os.Open(filepath.Join(r, "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	listed := map[string]bool{}
	entry := regexp.MustCompile("^\\s*- `([^`]+)/` — ")
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			if in {
				break
			}
			in = line == "## Map"
			continue
		}
		if m := entry.FindStringSubmatch(line); in && m != nil {
			listed[m[1]] = true
		}
	}
	if len(listed) == 0 {
		t.Fatal(`docs/ARCHITECTURE.md has no "## Map" section with "- ` + "`folder/`" + ` — …" lines`)
	}
	have := map[string]bool{}
	for _, p := range listPackages(t) {
		if p.Dir != "." {
			have[p.Dir] = true
		}
	}
	for d := range have {
		if !listed[d] {
			t.Errorf("folder %s/ holds a package but is not in the map of docs/ARCHITECTURE.md", d)
		}
	}
	for d := range listed {
		if _, err := os.Stat(filepath.Join(r, d)); err != nil {
			t.Errorf("the map lists %s/, which does not exist", d)
		} else if !have[d] {
			// A group folder without Go files of its own is fine to list.
			if ents, _ := filepath.Glob(filepath.Join(r, d, "*")); len(ents) == 0 {
				t.Errorf("the map lists %s/, which is empty", d)
			}
		}
	}
}
