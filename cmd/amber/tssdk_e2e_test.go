package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/amber-run/amber/internal/engine/enginetest"
)

// tsSDKTests is how many tests sdk/typescript/test holds: fewer passing
// means some were lost (a file not compiled, a describe skipped).
const tsSDKTests = 33

// TestE2ETypeScriptSDK compiles the TypeScript SDK and its tests
// (sdk/typescript) with tsc and runs them with Node's test runner against a
// real daemon. The package is copied to a temporary directory and the
// dev dependencies that scripts/setup/tssdk-deps.sh installed (`make
// setup-test`), keyed by the lockfile's hash, are linked into the copy: the
// source tree is not written to. One of the tests regenerates the OpenAPI
// types from api/openapi.json and fails when the committed ones differ.
func TestE2ETypeScriptSDK(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("node is missing (make setup-test installs it)")
		}
		t.Skip("no node")
	}
	root, _ := filepath.Abs("../..")
	pkg := filepath.Join(root, "sdk/typescript")
	lock, err := os.ReadFile(filepath.Join(pkg, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock)
	deps := filepath.Join(enginetest.Cache(), "npm", "tssdk-"+hex.EncodeToString(sum[:])[:16], "node_modules")
	if _, err := os.Stat(filepath.Join(deps, "typescript", "bin", "tsc")); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the TypeScript SDK's dev dependencies are not in %s: run make setup-test (scripts/setup/tssdk-deps.sh)", deps)
		}
		t.Skipf("no %s: run scripts/setup/tssdk-deps.sh", deps)
	}

	if testing.Short() {
		t.Skip("end-to-end test; skipped with -short")
	}

	// Compile while the daemon starts: the package as published (dist/,
	// what "exports" names), then the tests.
	work := t.TempDir()
	for _, f := range []string{"package.json", "package-lock.json", "tsconfig.json", "tsconfig.test.json", "src", "test"} {
		if out, err := exec.Command("cp", "-r", filepath.Join(pkg, f), work).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v: %s", f, err, out)
		}
	}
	if err := os.Symlink(deps, filepath.Join(work, "node_modules")); err != nil {
		t.Fatal(err)
	}
	compiled := make(chan error, 1)
	go func() {
		for _, cfg := range []string{"tsconfig.json", "tsconfig.test.json"} {
			tsc := exec.Command(node, filepath.Join(work, "node_modules", "typescript", "bin", "tsc"), "-p", cfg)
			tsc.Dir = work
			if out, err := tsc.CombinedOutput(); err != nil {
				compiled <- fmt.Errorf("tsc -p %s: %v\n%s", cfg, err, out)
				return
			}
		}
		compiled <- nil
	}()
	var compileErr error
	compileDone := false
	wait := func() error {
		if !compileDone {
			compileErr, compileDone = <-compiled, true
		}
		return compileErr
	}
	t.Cleanup(func() { wait() }) // before work is removed, also when skipped

	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	d := startDaemon(t, bin, dir, addr, "--pool", "0")
	key, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	tests, _ := filepath.Glob(filepath.Join(work, "build-test", "test", "*.test.js"))
	if len(tests) == 0 {
		t.Fatal("tsc made no test files")
	}

	// Two test files at a time: the OpenAPI generation (CPU) overlaps
	// the sandbox suites (mostly waiting on the daemon).
	cmd := exec.Command(node, append([]string{"--test", "--test-reporter=tap", "--test-concurrency=2"}, tests...)...)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "AMBER_ADDR="+addr, "AMBER_TOKEN="+strings.TrimSpace(string(key)),
		"AMBER_OPENAPI="+filepath.Join(root, "api", "openapi.json"))
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("TypeScript SDK tests: %v\ndaemon log:\n%s", err, tail(d.log(), 30))
	}
	count := func(name string) int {
		m := regexp.MustCompile(`(?m)^# ` + name + ` (\d+)$`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("node --test printed no %q count", name)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	if pass, fail, skipped := count("pass"), count("fail"), count("skipped"); pass != tsSDKTests || fail != 0 || skipped != 0 {
		t.Fatalf("the SDK tests did not all run: %d passed, %d failed, %d skipped; want %d passed", pass, fail, skipped, tsSDKTests)
	}
}
