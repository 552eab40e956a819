package console

import (
	"io/fs"
	"strings"
	"testing"
)

// TestBuildIsFresh fails when the committed build (dist/) was not made from
// the sources as they are: run `make console` and commit dist/.
func TestBuildIsFresh(t *testing.T) {
	want, err := SourceHash(".")
	if err != nil {
		t.Fatal(err)
	}
	if got := BuiltHash(); got != want {
		t.Fatalf("console/dist was built from other sources (dist/SOURCE_HASH %q, sources hash %q): run `make console` and commit console/dist", got, want)
	}
}

// TestAssetsServeTheApp: the embedded build has an index.html that loads
// its script and stylesheet from /console/assets/, and those are embedded.
func TestAssetsServeTheApp(t *testing.T) {
	a := Assets()
	idx, err := fs.ReadFile(a, "index.html")
	if err != nil {
		t.Fatal(err)
	}
	ents, err := fs.ReadDir(a, "assets")
	if err != nil {
		t.Fatal(err)
	}
	var js, css int
	for _, e := range ents {
		if !strings.Contains(string(idx), "/console/assets/"+e.Name()) {
			continue
		}
		switch {
		case strings.HasSuffix(e.Name(), ".js"):
			js++
		case strings.HasSuffix(e.Name(), ".css"):
			css++
		}
	}
	if js != 1 || css != 1 {
		t.Fatalf("index.html references %d embedded scripts and %d stylesheets, want 1 and 1:\n%s", js, css, idx)
	}
}

// TestSourceHashSeesChanges: the hash covers the sources (a negative
// control for TestBuildIsFresh).
func TestSourceHashSeesChanges(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		t.Helper()
		if err := writeFile(dir, name, s); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"index.html", "package.json", "package-lock.json", "vite.config.js", "src/main.jsx", "public/favicon.svg"} {
		write(f, f)
	}
	a, err := SourceHash(dir)
	if err != nil {
		t.Fatal(err)
	}
	write("src/main.jsx", "changed")
	b, err := SourceHash(dir)
	if err != nil {
		t.Fatal(err)
	}
	write("src/new.jsx", "")
	c, err := SourceHash(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a == b || b == c {
		t.Fatalf("hash did not change: %s %s %s", a, b, c)
	}
}
