package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/amber-run/amber/internal/engine/enginetest"
)

// npmDeps is the opening of a test that runs node programs: node on PATH,
// and the node_modules scripts/setup/npm-deps.sh installed for lockDir's
// package-lock.json as $AMBER_CACHE/npm/NAME-<first 16 hex of its sha256>,
// holding probe (a path under node_modules). Either missing fails the test
// under CI (make setup-test installs both, target says which) and skips it
// elsewhere; -short skips it too. It returns node and the node_modules.
func npmDeps(t *testing.T, lockDir, name, probe, target string) (node, deps string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("node is missing (make setup-test installs it)")
		}
		t.Skip("no node")
	}
	lock, err := os.ReadFile(filepath.Join(lockDir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock)
	deps = filepath.Join(enginetest.Cache(), "npm", name+"-"+hex.EncodeToString(sum[:])[:16], "node_modules")
	if _, err := os.Stat(filepath.Join(deps, probe)); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not in %s: run make setup-test (make %s)", probe, deps, target)
		}
		t.Skipf("no %s: run make %s", deps, target)
	}
	if testing.Short() {
		t.Skip("end-to-end test; skipped with -short")
	}
	return node, deps
}
