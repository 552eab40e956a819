package arch

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// Size limits: a file a newcomer can read in one sitting, a function that
// fits on a screen or two. Tests are exempt, and so is generated code (a
// file marked "// Code generated … DO NOT EDIT.", as protoc's output is):
// nobody reads it in one sitting, its generator is what is reviewed.
const (
	maxFileLines = 800
	maxFuncLines = 150
)

// pending lists path prefixes (relative to the module root) exempt while
// a split is under way; the engine, cmd and metadata splits of the house
// redesign have landed, so none is.
var pending = map[string]bool{}

// sizeViolations returns one line per non-test Go file under r over
// maxFileLines and per top-level function (or method) over maxFuncLines,
// skipping files under a pending prefix.
func sizeViolations(t *testing.T, r string) []string {
	t.Helper()
	var out []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(r, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(r, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") || isPending(rel) {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution|parser.ParseComments)
		if err != nil {
			return err
		}
		if ast.IsGenerated(f) {
			return nil
		}
		tf := fset.File(f.Pos())
		if n := tf.LineCount(); n > maxFileLines {
			out = append(out, fmt.Sprintf("%s: %d lines (max %d)", rel, n, maxFileLines))
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if n > maxFuncLines {
				out = append(out, fmt.Sprintf("%s: func %s: %d lines (max %d)", rel, funcName(fd), n, maxFuncLines))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func isPending(rel string) bool {
	for p := range pending {
		if rel == p || strings.HasPrefix(rel, p+"/") {
			return true
		}
	}
	return false
}

// funcName is "Name" or "(Recv).Name".
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	if ix, ok := typ.(*ast.IndexExpr); ok {
		typ = ix.X
	}
	if ix, ok := typ.(*ast.IndexListExpr); ok {
		typ = ix.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return "(" + id.Name + ")." + fd.Name.Name
	}
	return fd.Name.Name
}

// TestFileAndFunctionSize fails listing each non-test file over
// maxFileLines and each top-level function over maxFuncLines.
func TestFileAndFunctionSize(t *testing.T) {
	for _, v := range sizeViolations(t, root(t)) {
		t.Error(v)
	}
}
