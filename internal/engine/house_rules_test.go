package engine

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// House rules of the engine (issue 19): no struct over 20 fields, no
// non-test file over 800 lines, no function over 150 lines; each
// capability is its own type, in its own files, holding the core and only
// the capabilities it is drawn with (capabilities below, the Engine's doc);
// and the checkpoint and restore files name nothing declared in the
// metering and budget files (a restore does not pass through billing:
// metering and budgets hook into the lifecycle instead, lifecycle.go).
const (
	maxStructFields = 20
	maxFileLines    = 800
	maxFuncLines    = 150
)

// wideStructs are structs allowed more fields, and why (none: Options
// groups its fields in ClusterOptions, RecoveryOptions and EgressOptions).
var wideStructs = map[string]int{}

// capabilities are the engine's capability types: the files that declare
// their methods, and the capabilities each may hold (as a field of type
// *T). The files of a capability declare no method of the Engine, the core
// or another capability; the core holds no capability; no struct holds
// the Engine (a capability reaches only what it is drawn with, and the
// Engine composes them). Files not named here are the core's and the
// lifecycle's (engine.go, core.go, events.go, ops.go, reconcile.go, …).
var capabilities = map[string]struct {
	files []string
	holds []string
}{
	"checkpointer": {[]string{"checkpoint.go", "restore.go", "gc.go", "hostcompat.go", "hottier.go", "upload.go", "lazy.go"}, []string{"egressRunner", "quotas"}},
	"pool":         {[]string{"pool.go"}, []string{"poolDeps"}},
	"mover":        {[]string{"failover.go", "move.go"}, []string{"checkpointer", "policyRunner"}},
	"policyRunner": {[]string{"policy.go", "idle.go"}, []string{"checkpointer", "egressRunner"}},
	"quotas":       {[]string{"quota.go"}, nil},
	"egressRunner": {[]string{"egress.go", "egress_ceiling.go"}, nil},
	"billing":      {[]string{"metering.go", "metering_counts.go", "budget.go"}, []string{"checkpointer"}},
	"templateOps":  {[]string{"template_ops.go", "templates.go"}, []string{"pool"}},
}

// poolDepsType names what the pool is given instead of the Engine: the
// core and the lifecycle's functions (pool.go). The pool holds it rather
// than embedding *core; it holds no capability.
const poolDepsType = "poolDeps"

func TestEngineHouseRules(t *testing.T) {
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[p] = f
	}
	billing := func(p string) bool { return strings.HasPrefix(p, "metering") || strings.HasPrefix(p, "budget") }
	restoring := func(p string) bool { return strings.HasPrefix(p, "checkpoint") || strings.HasPrefix(p, "restore") }

	billed := map[string]string{} // identifier declared in a billing file → its file
	for p, f := range files {
		if lines := fset.File(f.Pos()).LineCount(); lines > maxFileLines {
			t.Errorf("%s: %d lines (at most %d)", p, lines, maxFileLines)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if l := fset.Position(n.End()).Line - fset.Position(n.Pos()).Line + 1; l > maxFuncLines {
					t.Errorf("%s: func %s: %d lines (at most %d)", p, n.Name.Name, l, maxFuncLines)
				}
			case *ast.TypeSpec:
				if st, ok := n.Type.(*ast.StructType); ok {
					c := 0
					for _, fl := range st.Fields.List {
						c += max(len(fl.Names), 1)
					}
					if limit := max(maxStructFields, wideStructs[n.Name.Name]); c > limit {
						t.Errorf("%s: struct %s: %d fields (at most %d)", p, n.Name.Name, c, limit)
					}
				}
			}
			return true
		})
		if !billing(p) {
			continue
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				// Functions, and methods of the Engine and of billing;
				// a method of another billing type (meter, the hooks) is
				// reached only through its type.
				if d.Recv == nil || recvName(d.Recv) == "Engine" || recvName(d.Recv) == "billing" {
					billed[d.Name.Name] = p
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						billed[s.Name.Name] = p
					case *ast.ValueSpec:
						for _, n := range s.Names {
							billed[n.Name] = p
						}
					}
				}
			}
		}
	}
	// The fields of a billing type (billing's meter) of the Engine and of
	// billing are billing too.
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || ts.Name.Name != "Engine" && ts.Name.Name != "billing" {
				return true
			}
			for _, fl := range ts.Type.(*ast.StructType).Fields.List {
				if id, ok := fl.Type.(*ast.Ident); ok && billed[id.Name] != "" {
					for _, n := range fl.Names {
						billed[n.Name] = billed[id.Name]
					}
				}
			}
			return false
		})
	}
	var names []string
	for p := range files {
		names = append(names, p)
	}
	sort.Strings(names)
	// What each function and method outside the billing files names (refs)
	// and calls (callees: f(…), e.f(…), e.ckr.f(…), …), keyed by name: two
	// methods of one name count as one, which only widens the search.
	refs, callees := map[string][]string{}, map[string][]string{}
	via := capabilityFields(files)
	for _, p := range names {
		if billing(p) {
			continue
		}
		for _, d := range files[p].Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				refs[fd.Name.Name] = append(refs[fd.Name.Name], idents(fd.Body)...)
				callees[fd.Name.Name] = append(callees[fd.Name.Name], called(fd.Body, via)...)
			}
		}
	}
	for _, p := range names {
		if !restoring(p) {
			continue
		}
		seen := map[string]bool{}
		ast.Inspect(files[p], func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && !seen[id.Name] {
				if from, ok := billed[id.Name]; ok && id.Name != "_" {
					seen[id.Name] = true
					t.Errorf("%s:%d: names %s, declared in %s", p, fset.Position(id.Pos()).Line, id.Name, from)
				}
			}
			return true
		})
		// Nor through what it calls: a restore does not pass through the
		// billing files.
		from := map[string]string{}
		var queue []string
		for _, id := range called(files[p], via) {
			if _, ok := from[id]; !ok && refs[id] != nil {
				from[id] = ""
				queue = append(queue, id)
			}
		}
		for len(queue) > 0 {
			fn := queue[0]
			queue = queue[1:]
			for _, id := range refs[fn] {
				if decl, ok := billed[id]; ok && !seen[id] {
					seen[id] = true
					path := fn
					for f := from[fn]; f != ""; f = from[f] {
						path = f + " → " + path
					}
					t.Errorf("%s reaches %s (declared in %s) through %s", p, id, decl, path)
				}
			}
			for _, id := range callees[fn] {
				if _, ok := from[id]; !ok && refs[id] != nil {
					from[id] = fn
					queue = append(queue, id)
				}
			}
		}
	}
	if _, err := os.Stat("lifecycle.go"); err != nil {
		t.Errorf("lifecycle.go (the hooks metering and budgets register) is missing: %v", err)
	}
	for _, msg := range capabilityRules(fset, files) {
		t.Error(msg)
	}
	t.Run("a bad fixture fails", func(t *testing.T) {
		bad := map[string]string{
			"core.go":       "package engine\ntype core struct{ ckr *checkpointer }\n",
			"checkpoint.go": "package engine\ntype checkpointer struct{ *core; bill *billing; back func() *Engine }\nfunc (e *Engine) Restore() {}\n",
			"metering.go":   "package engine\ntype billing struct{ *core }\nfunc (e *checkpointer) meterTick() {}\n",
			"engine.go":     "package engine\nfunc (e *billing) Usage() {}\n",
		}
		fset := token.NewFileSet()
		files := map[string]*ast.File{}
		for p, src := range bad {
			f, err := parser.ParseFile(fset, p, src, 0)
			if err != nil {
				t.Fatal(err)
			}
			files[p] = f
		}
		got := strings.Join(capabilityRules(fset, files), "\n")
		for _, want := range []string{
			"struct core holds capabilities [checkpointer]",
			"struct checkpointer holds *billing",
			"struct checkpointer: a field of the Engine",
			"method Restore of Engine in a file of checkpointer",
			"method meterTick of checkpointer in a file of billing",
			"method Usage of billing outside its files",
			"capability mover: no struct declares it",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("the rules miss %q; they said:\n%s", want, got)
			}
		}
	})
}

// capabilityRules checks files (path → parsed file) against capabilities
// and returns what breaks them.
func capabilityRules(fset *token.FileSet, files map[string]*ast.File) []string {
	var bad []string
	owner := map[string]string{} // file → its capability
	for c, d := range capabilities {
		for _, p := range d.files {
			owner[p] = c
		}
	}
	var names []string
	for p := range files {
		names = append(names, p)
	}
	sort.Strings(names)
	structs := map[string]*ast.StructType{}
	for _, p := range names {
		for _, d := range files[p].Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					continue
				}
				r := recvName(d.Recv)
				_, isCap := capabilities[r]
				switch c, mine := owner[p]; {
				case mine && (r == "Engine" || r == "core" || isCap && r != c):
					bad = append(bad, fmt.Sprintf("%s:%d: method %s of %s in a file of %s", p, fset.Position(d.Pos()).Line, d.Name.Name, r, c))
				case !mine && isCap:
					bad = append(bad, fmt.Sprintf("%s:%d: method %s of %s outside its files %v", p, fset.Position(d.Pos()).Line, d.Name.Name, r, capabilities[r].files))
				}
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					if ts, ok := sp.(*ast.TypeSpec); ok {
						if st, ok := ts.Type.(*ast.StructType); ok {
							structs[ts.Name.Name] = st
						}
					}
				}
			}
		}
	}
	// No struct holds the Engine, in any form (*Engine, []*Engine, a func
	// of it): the Engine composes, nothing reaches back into it.
	for name, st := range structs {
		for _, fl := range st.Fields.List {
			if mentions(fl.Type, "Engine") {
				bad = append(bad, fmt.Sprintf("struct %s: a field of the Engine (%s)", name, fset.Position(fl.Pos())))
			}
		}
	}
	// The core holds no capability; each capability embeds *core and holds
	// only the capabilities it is drawn with.
	held := func(name string) (embedsCore bool, caps []string) {
		for _, fl := range structs[name].Fields.List {
			star, ok := fl.Type.(*ast.StarExpr)
			if !ok {
				continue
			}
			id, ok := star.X.(*ast.Ident)
			if !ok {
				continue
			}
			if id.Name == "core" && len(fl.Names) == 0 {
				embedsCore = true
			}
			if _, ok := capabilities[id.Name]; ok || id.Name == poolDepsType {
				caps = append(caps, id.Name)
			}
		}
		return embedsCore, caps
	}
	if structs["core"] == nil {
		return append(bad, "struct core is missing")
	}
	if _, caps := held("core"); len(caps) > 0 {
		bad = append(bad, fmt.Sprintf("struct core holds capabilities %v: nothing may reach one through the core", caps))
	}
	var caps []string
	for c := range capabilities {
		caps = append(caps, c)
	}
	sort.Strings(caps)
	for _, c := range append(caps, poolDepsType) {
		if structs[c] == nil {
			bad = append(bad, fmt.Sprintf("capability %s: no struct declares it", c))
			continue
		}
		embeds, holds := held(c)
		if !embeds && c != "pool" {
			bad = append(bad, fmt.Sprintf("struct %s does not embed *core", c))
		}
		for _, h := range holds {
			ok := false
			for _, a := range capabilities[c].holds {
				ok = ok || a == h
			}
			if !ok {
				bad = append(bad, fmt.Sprintf("struct %s holds *%s; it is drawn with %v (capabilities in house_rules_test.go, the Engine's doc)", c, h, capabilities[c].holds))
			}
		}
	}
	return bad
}

// mentions reports whether the type expression x names the type name.
func mentions(x ast.Expr, name string) bool {
	found := false
	ast.Inspect(x, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Name == name {
			found = true
		}
		return !found
	})
	return found
}

// recvName is the name of a method's receiver type.
func recvName(fl *ast.FieldList) string {
	x := fl.List[0].Type
	if s, ok := x.(*ast.StarExpr); ok {
		x = s.X
	}
	if id, ok := x.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// idents are the identifiers in n.
func idents(n ast.Node) []string {
	var out []string
	ast.Inspect(n, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok {
			out = append(out, id.Name)
		}
		return true
	})
	return out
}

// capabilityFields are the names of the struct fields that hold a
// capability or the pool's dependencies (ckr, eg, …): the calls through
// them are followed.
func capabilityFields(files map[string]*ast.File) map[string]bool {
	out := map[string]bool{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			fl, ok := n.(*ast.Field)
			if !ok {
				return true
			}
			if star, ok := fl.Type.(*ast.StarExpr); ok {
				if id, ok := star.X.(*ast.Ident); ok {
					if _, isCap := capabilities[id.Name]; isCap || id.Name == poolDepsType {
						for _, n := range fl.Names {
							out[n.Name] = true
						}
					}
				}
			}
			return true
		})
	}
	return out
}

// called are the names of the functions n calls directly (f(…)) and of
// the methods it calls on its receiver (e.f(…)) or through a receiver's
// field that holds a capability (e.ckr.f(…), p.e.f(…): fields in via).
func called(n ast.Node, via map[string]bool) []string {
	var out []string
	ast.Inspect(n, func(n ast.Node) bool {
		c, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		switch f := c.Fun.(type) {
		case *ast.Ident:
			out = append(out, f.Name)
		case *ast.SelectorExpr:
			x := f.X
			if sx, ok := x.(*ast.SelectorExpr); ok && via[sx.Sel.Name] {
				x = sx.X
			}
			if id, ok := x.(*ast.Ident); ok && (id.Name == "e" || id.Name == "p") {
				out = append(out, f.Sel.Name)
			}
		}
		return true
	})
	return out
}
