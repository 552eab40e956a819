package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2EPythonSDK runs the Python SDK's tests (sdk/python/tests) against a
// real daemon.
func TestE2EPythonSDK(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("python3 is missing (make setup-test installs it)")
		}
		t.Skip("no python3")
	}
	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	d := startDaemon(t, bin, dir, addr, "--pool", "0")
	key, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	root, _ := filepath.Abs("../..")
	cmd := exec.Command(py, "-m", "unittest", "discover", "-v", "-s", filepath.Join(root, "sdk/python/tests"))
	cmd.Env = append(os.Environ(), "AMBER_ADDR="+addr, "AMBER_TOKEN="+strings.TrimSpace(string(key)), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("python SDK tests: %v\ndaemon log:\n%s", err, tail(d.log(), 30))
	}
	if !strings.Contains(string(out), "Ran 8 tests") || strings.Contains(string(out), "skipped") {
		t.Fatalf("the SDK tests did not all run")
	}
}
