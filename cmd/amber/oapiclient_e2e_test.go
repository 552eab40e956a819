package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2EOpenAPIClient generates a TypeScript client from api/openapi.json
// as it is now (openapi-typescript), compiles testdata/oapiclient/client.ts,
// which calls it through openapi-fetch, with tsc --strict, and runs it
// against a real daemon: it creates a sandbox, reads the NDJSON exec stream
// line by line with the line type the document names, narrows a directory
// listing to FileList (and a stat to FileInfo) without a cast, and reads an
// error body. The dependencies are scripts/setup/npm-deps.sh oapi-client's
// (`make setup-test`), keyed by testdata/oapiclient/package-lock.json.
func TestE2EOpenAPIClient(t *testing.T) {
	root, _ := filepath.Abs("../..")
	pkg := filepath.Join(root, "cmd/amber/testdata/oapiclient")
	node, deps := npmDeps(t, pkg, "oapi-client", "openapi-fetch/package.json", "setup-oapi-client-deps")

	work := t.TempDir()
	for _, f := range []string{"package.json", "tsconfig.json", "client.ts"} {
		b, err := os.ReadFile(filepath.Join(pkg, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(work, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(deps, filepath.Join(work, "node_modules")); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(node, args...)
		cmd.Dir = work
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run(filepath.Join(deps, "openapi-typescript", "bin", "cli.js"), filepath.Join(root, "api", "openapi.json"), "-o", "openapi.ts")
	run(filepath.Join(deps, "typescript", "bin", "tsc"), "--strict", "-p", "tsconfig.json")

	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	d := startDaemon(t, bin, dir, addr, "--pool", "0")
	key, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, filepath.Join(work, "build", "client.js"))
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "AMBER_ADDR="+addr, "AMBER_TOKEN="+strings.TrimSpace(string(key)))
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("the generated client: %v\ndaemon log:\n%s", err, tail(d.log(), 30))
	}
	for _, want := range []string{
		`exec out="out\n" err="err\n" code=3 lines=`,
		"list a.txt file 3 2026, sub dir ",
		"stat a.txt file 3 0644",
		"missing 404 not found",
		"delete 204",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the client printed no %q", want)
		}
	}
}
