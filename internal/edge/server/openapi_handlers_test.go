package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/amber-run/amber/api"
)

// TestBodyTypesAreTheHandlers checks bodyTypes (openapi_fields_test.go)
// against the code: the server package is type-checked (go/types, with
// the export data `go list -export` gives) and, for every route, the
// types its handler decodes (readJSON, readOptionalJSON, json.Decoder.Decode) and encodes
// (writeJSON, json.Encoder.Encode, json.Marshal), itself or through the package's
// functions it reaches, are collected. The table's request type must be
// one the handler decodes, each of its response types one it encodes, and
// each named type it encodes (but the error body) one the table lists for
// that route: a handler that starts sending another type, or a table entry
// that names the wrong one, fails.
func TestBodyTypesAreTheHandlers(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks the package; skipped with -short")
	}
	pkg, info, files := typeCheckServer(t)
	handlers := routeHandlers(t, files)
	funcs := map[types.Object]*ast.FuncDecl{}
	for _, f := range files {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				funcs[info.Defs[fd.Name]] = fd
			}
		}
	}
	own := collectFacts(pkg, info, funcs)
	reach := func(start types.Object) (dec, enc map[string]bool) {
		dec, enc = map[string]bool{}, map[string]bool{}
		seen := map[types.Object]bool{}
		stack := []types.Object{start}
		for len(stack) > 0 {
			o := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if seen[o] || own[o] == nil {
				continue
			}
			seen[o] = true
			for k := range own[o].decodes {
				dec[k] = true
			}
			for k := range own[o].encodes {
				enc[k] = true
			}
			stack = append(stack, own[o].refs...)
		}
		delete(dec, "")
		delete(enc, "")
		return dec, enc
	}
	byName := map[string]types.Object{}
	for obj := range funcs {
		if sig, ok := obj.Type().(*types.Signature); ok && sig.Recv() != nil && types.TypeString(sig.Recv().Type(), nil) == "*"+pkg.Path()+".Server" {
			byName[obj.Name()] = obj
		}
	}
	drift := func(table map[string]map[string][]reflect.Type) (errs []string, checked int) {
		errorf := func(f string, a ...any) { errs = append(errs, fmt.Sprintf(f, a...)) }
		for route, h := range handlers {
			bodies := table[route] // none: the handler encodes no named type
			obj := byName[h]
			if obj == nil {
				errorf("%s: no method %s", route, h)
				continue
			}
			dec, enc := reach(obj)
			listed := map[string]bool{}
			for body, ts := range bodies {
				for _, rt := range ts {
					name := typeName(rt)
					if rt.Kind() == reflect.Interface {
						continue // free-form (MCP's JSON-RPC, the document itself)
					}
					checked++
					if body == "request" {
						if !dec[name] {
							errorf("%s: bodyTypes says it decodes %s; %s decodes %v", route, name, h, keys(dec))
						}
						continue
					}
					listed[name] = true
					if !enc[name] {
						errorf("%s %s: bodyTypes says %s; %s encodes %v", route, body, name, h, keys(enc))
					}
				}
			}
			// What a listed type holds is listed too: a helper that writes an
			// OperationFrame's checkpoint alone (its JSON answer) is covered by
			// the OperationFrame.
			for body, ts := range bodies {
				if body != "request" {
					for _, rt := range ts {
						fieldTypes(rt, listed)
					}
				}
			}
			for name := range enc {
				if !listed[name] && !strings.HasSuffix(name, "api.Error") && !strings.HasSuffix(name, "api.ErrorBody") {
					errorf("%s: %s encodes %s, which bodyTypes does not list for it", route, h, name)
				}
			}
		}
		return errs, checked
	}
	errs, checked := drift(bodyTypes)
	for _, e := range errs {
		t.Error(e)
	}
	if checked < 60 {
		t.Errorf("only %d bodies checked against their handlers", checked)
	}
	// The check bites: a wrong request type, a wrong response type and a
	// response left out are each found.
	for name, mutate := range map[string]func(m map[string]map[string][]reflect.Type){
		"request": func(m map[string]map[string][]reflect.Type) {
			m["POST /v1/sandboxes"]["request"] = []reflect.Type{typ[api.ExecRequest]()}
		},
		"response": func(m map[string]map[string][]reflect.Type) {
			m["GET /v1/info"]["200 application/json"] = []reflect.Type{typ[api.Sandbox]()}
		},
		"left out": func(m map[string]map[string][]reflect.Type) { delete(m, "GET /v1/sandboxes/{id}/stats") },
	} {
		m := map[string]map[string][]reflect.Type{}
		for k, v := range bodyTypes {
			m[k] = map[string][]reflect.Type{}
			for b, ts := range v {
				m[k][b] = ts
			}
		}
		mutate(m)
		if errs, _ := drift(m); len(errs) == 0 {
			t.Errorf("a table with a %s body wrong passed", name)
		}
	}
}

// facts are what a function decodes and encodes itself, and the package's
// functions it refers to.
type facts struct {
	decodes, encodes map[string]bool
	refs             []types.Object
}

// collectFacts finds the facts of each of the package's functions.
func collectFacts(pkg *types.Package, info *types.Info, funcs map[types.Object]*ast.FuncDecl) map[types.Object]*facts {
	own := map[types.Object]*facts{}
	for obj, fd := range funcs {
		f := &facts{decodes: map[string]bool{}, encodes: map[string]bool{}}
		own[obj] = f
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.Ident:
				if o := info.Uses[n]; o != nil && funcs[o] != nil {
					f.refs = append(f.refs, o)
				}
			case *ast.CallExpr:
				callee := calleeOf(info, n)
				if callee == nil || len(n.Args) == 0 {
					return true
				}
				name := callee.Pkg().Path() + "." + callee.Name()
				if sig, ok := callee.Type().(*types.Signature); ok && sig.Recv() != nil {
					name = types.TypeString(sig.Recv().Type(), nil) + "." + callee.Name()
				}
				switch name {
				case pkg.Path() + ".readJSON", pkg.Path() + ".readOptionalJSON":
					f.decodes[typeName(info.TypeOf(n.Args[1]))] = true
				case "*encoding/json.Decoder.Decode":
					f.decodes[typeName(info.TypeOf(n.Args[0]))] = true
				case pkg.Path() + ".writeJSON":
					f.encodes[typeName(info.TypeOf(n.Args[2]))] = true
				case "*encoding/json.Encoder.Encode", "encoding/json.Marshal":
					f.encodes[typeName(info.TypeOf(n.Args[0]))] = true
				}
			}
			return true
		})
	}
	return own
}

// typeName names a type the same way for go/types and reflect:
// "importpath.Name" (pointers and slices stripped: the body's element).
func typeName(t any) string {
	switch t := t.(type) {
	case types.Type:
		t = types.Unalias(t)
		for p, ok := t.(*types.Pointer); ok; p, ok = t.(*types.Pointer) {
			t = types.Unalias(p.Elem())
		}
		if n, ok := t.(*types.Named); ok && n.Obj().Pkg() != nil {
			return n.Obj().Pkg().Path() + "." + n.Obj().Name()
		}
		if _, ok := t.Underlying().(*types.Interface); ok {
			return ""
		}
		return t.String()
	case reflect.Type:
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.PkgPath() != "" {
			return t.PkgPath() + "." + t.Name()
		}
		return t.String()
	}
	return ""
}

// fieldTypes adds the named types t's fields hold, recursively, to into.
func fieldTypes(t reflect.Type, into map[string]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || into[typeName(t)+" fields"] {
		return
	}
	into[typeName(t)+" fields"] = true
	for i := range t.NumField() {
		ft := t.Field(i).Type
		into[typeName(ft)] = true
		fieldTypes(ft, into)
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// calleeOf is the function or method a call calls, when it is one.
func calleeOf(info *types.Info, c *ast.CallExpr) *types.Func {
	var id *ast.Ident
	switch f := ast.Unparen(c.Fun).(type) {
	case *ast.Ident:
		id = f
	case *ast.SelectorExpr:
		id = f.Sel
	default:
		return nil
	}
	fn, _ := info.Uses[id].(*types.Func)
	if fn == nil || fn.Pkg() == nil {
		return nil
	}
	return fn
}

// typeCheckServer type-checks the server package's own files (not its
// tests) against the export data of its dependencies.
func typeCheckServer(t *testing.T) (*types.Package, *types.Info, []*ast.File) {
	t.Helper()
	cmd := exec.Command("go", "list", "-tags", "seccomp", "-export", "-deps", "-json=ImportPath,Export,Dir,GoFiles", ".")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, stderr.Bytes())
	}
	type listed struct{ ImportPath, Export, Dir string }
	exports := map[string]string{}
	var self struct {
		listed
		GoFiles []string
	}
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p struct {
			listed
			GoFiles []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		exports[p.ImportPath] = p.Export
		self = p // the package itself comes last
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range self.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(self.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		p, ok := exports[path]
		if !ok || p == "" {
			return nil, os.ErrNotExist
		}
		return os.Open(p)
	})
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Defs: map[*ast.Ident]types.Object{}, Uses: map[*ast.Ident]types.Object{}}
	pkg, err := (&types.Config{Importer: imp}).Check(self.ImportPath, fset, files, info)
	if err != nil {
		t.Fatalf("type-check %s: %v", self.ImportPath, err)
	}
	return pkg, info, files
}

// routeHandlers reads routes() in the source: "METHOD path" → the name of
// the method its h field names.
func routeHandlers(t *testing.T, files []*ast.File) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Name.Name != "routes" || fd.Recv == nil {
				continue
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				cl, ok := n.(*ast.CompositeLit)
				if !ok {
					return true
				}
				var method, path, h string
				for _, e := range cl.Elts {
					kv, ok := e.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					k, _ := kv.Key.(*ast.Ident)
					if k == nil {
						continue
					}
					switch v := kv.Value.(type) {
					case *ast.BasicLit:
						s, _ := strconv.Unquote(v.Value)
						if k.Name == "Method" {
							method = s
						} else if k.Name == "Path" {
							path = s
						}
					case *ast.SelectorExpr:
						if k.Name == "h" {
							h = v.Sel.Name
						}
					}
				}
				if method != "" && path != "" && h != "" {
					out[method+" "+path] = h
					return false
				}
				return true
			})
		}
	}
	if len(out) < 60 {
		t.Fatalf("read only %d routes from routes()", len(out))
	}
	return out
}
