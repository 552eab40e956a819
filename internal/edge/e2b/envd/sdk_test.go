package envd_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/edge/e2b/envd"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// sdkDir is a directory holding node_modules/e2b: $AMBER_E2B_SDK, else
// the one the project's setup installs ($AMBER_CACHE/npm/e2b-<key>,
// `make setup-e2b-deps`; the newest if there are several). Without one
// the test is skipped, or fails under CI (which runs the setup first).
func sdkDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("AMBER_E2B_SDK")
	if dir == "" {
		ms, _ := filepath.Glob(filepath.Join(enginetest.Cache(), "npm", "e2b-*", "node_modules", "e2b", "dist", "index.js"))
		newest := time.Time{}
		for _, m := range ms {
			if fi, err := os.Stat(m); err == nil && fi.ModTime().After(newest) {
				newest, dir = fi.ModTime(), filepath.Dir(filepath.Dir(filepath.Dir(filepath.Dir(m))))
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "dist", "index.js")); dir == "" || err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the e2b npm package is not installed (CI runs `make setup-test` first; it did not work)")
		}
		t.Skip("the e2b npm package is not installed: run `make setup-e2b-deps` (or set AMBER_E2B_SDK to a directory holding node_modules/e2b)")
	}
	return dir
}

// TestEnvdOfficialSDK runs testdata/sdk_envd.mjs: the official e2b
// package's commands and files against this envd and a real sandbox.
func TestEnvdOfficialSDK(t *testing.T) {
	dir := sdkDir(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node")
	}
	// The SDK runs commands with /bin/bash -l -c, which the minimal
	// template has not.
	f := newFixtureOf(t, "python")
	cmd := exec.CommandContext(ctxT(t), node, "testdata/sdk_envd.mjs", dir)
	cmd.Env = append(os.Environ(), "E2B_SANDBOX_URL="+f.url, "SANDBOX_ID="+f.id, "ACCESS_TOKEN="+keyA,
		"ENVD_VERSION="+envd.Version, "E2B_API_KEY=e2b_0000000000000000000000000000000000000000")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil || !strings.Contains(string(out), "ALL OK") {
		t.Fatalf("the SDK script failed: %v", err)
	}
}
