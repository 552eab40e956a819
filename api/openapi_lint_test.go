package api_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenAPILint runs Redocly's CLI (`redocly lint`, the pinned version of
// api/lint/package-lock.json, which scripts/setup/npm-deps.sh openapi-lint
// installs into the cache: `make setup-test`) on openapi.json with its
// recommended rules (api/lint/redocly.yaml): no error and no warning.
func TestOpenAPILint(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("node is missing (make setup-test installs it)")
		}
		t.Skip("no node")
	}
	lock, err := os.ReadFile(filepath.Join("lint", "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock)
	cache := os.Getenv("AMBER_CACHE")
	if cache == "" {
		cache = "/var/cache/amber"
	}
	cli := filepath.Join(cache, "npm", "openapi-lint-"+hex.EncodeToString(sum[:])[:16], "node_modules", "@redocly", "cli", "bin", "cli.js")
	if _, err := os.Stat(cli); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("Redocly's CLI is not at %s: run make setup-test (scripts/setup/npm-deps.sh openapi-lint)", cli)
		}
		t.Skipf("no %s: run scripts/setup/npm-deps.sh openapi-lint api/lint @redocly/cli/bin/cli.js", cli)
	}
	cmd := exec.Command(node, cli, "lint", "--config", filepath.Join("lint", "redocly.yaml"), "--format", "summary", "openapi.json")
	// No telemetry, no update check: the lint needs no network.
	cmd.Env = append(os.Environ(), "REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true", "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Your API description is valid") || strings.Contains(string(out), "warning ") {
		t.Fatalf("redocly lint openapi.json: %v\n%s", err, out)
	}
}
