package engine

import (
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
// non-test file over 800 lines, no function over 150 lines, and the
// checkpoint and restore files name nothing declared in the metering and
// budget files (a restore does not pass through billing: metering and
// budgets hook into the lifecycle instead, lifecycle.go).
const (
	maxStructFields = 20
	maxFileLines    = 800
	maxFuncLines    = 150
)

// wideStructs are structs allowed more fields, and why (none: Options
// groups its fields in ClusterOptions, RecoveryOptions and EgressOptions).
var wideStructs = map[string]int{}

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
				// Functions, and methods of the Engine; a method of a
				// billing type is reached only through its type.
				if d.Recv == nil || recvName(d.Recv) == "Engine" {
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
	// The Engine's fields of a billing type (its meter) are billing too.
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || ts.Name.Name != "Engine" {
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
	// What each function and Engine method outside the billing files names
	// (refs) and calls (callees: f(…) and e.f(…)).
	refs, callees := map[string][]string{}, map[string][]string{}
	for _, p := range names {
		if billing(p) {
			continue
		}
		for _, d := range files[p].Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil && (fd.Recv == nil || recvName(fd.Recv) == "Engine") {
				refs[fd.Name.Name] = idents(fd.Body)
				callees[fd.Name.Name] = called(fd.Body)
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
		via := map[string]string{}
		var queue []string
		for _, id := range called(files[p]) {
			if _, ok := via[id]; !ok && refs[id] != nil {
				via[id] = ""
				queue = append(queue, id)
			}
		}
		for len(queue) > 0 {
			fn := queue[0]
			queue = queue[1:]
			for _, id := range refs[fn] {
				if from, ok := billed[id]; ok && !seen[id] {
					seen[id] = true
					path := fn
					for f := via[fn]; f != ""; f = via[f] {
						path = f + " → " + path
					}
					t.Errorf("%s reaches %s (declared in %s) through %s", p, id, from, path)
				}
			}
			for _, id := range callees[fn] {
				if _, ok := via[id]; !ok && refs[id] != nil {
					via[id] = fn
					queue = append(queue, id)
				}
			}
		}
	}
	if _, err := os.Stat("lifecycle.go"); err != nil {
		t.Errorf("lifecycle.go (the hooks metering and budgets register) is missing: %v", err)
	}
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

// called are the names of the functions n calls directly (f(…)) and of
// the Engine methods it calls on its receiver (e.f(…)).
func called(n ast.Node) []string {
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
			if x, ok := f.X.(*ast.Ident); ok && x.Name == "e" {
				out = append(out, f.Sel.Name)
			}
		}
		return true
	})
	return out
}
