package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2EPythonSDK installs the Python SDK as a package (pyproject.toml)
// into a venv, as a user would, and runs its tests (sdk/python/tests)
// with it against a real daemon. No package index is reachable here: the
// venv sees the system's site packages, where Debian's python3-setuptools
// is (make setup-test installs it), and pip builds with that
// (--no-build-isolation --no-index). The package is built from a copy, so
// that the build leaves nothing in the tree.
func TestE2EPythonSDK(t *testing.T) {
	py := "/usr/bin/python3" // Debian's: its setuptools is python3-setuptools
	if _, err := os.Stat(py); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("python3 is missing (make setup-test installs it)")
		}
		t.Skip("no /usr/bin/python3")
	}
	bin, dir := e2eSetup(t)
	root, _ := filepath.Abs("../..")
	work := t.TempDir()
	venv := filepath.Join(work, "venv")
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PIP_DISABLE_PIP_VERSION_CHECK=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run(py, "-m", "venv", "--system-site-packages", venv)
	src := filepath.Join(work, "src")
	run("cp", "-r", filepath.Join(root, "sdk/python"), src)
	run(filepath.Join(venv, "bin/pip"), "install", "-q", "--no-build-isolation", "--no-index", src)
	vpy := filepath.Join(venv, "bin/python")
	if where := run(vpy, "-c", "import amber; print(amber.__file__)"); !strings.HasPrefix(where, venv) {
		t.Fatalf("amber imports from %s, not the installed package", where)
	}

	addr := freeAddr(t)
	d := startDaemon(t, bin, dir, addr, "--pool", "0")
	key, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	// From the work dir: the tests import the installed package, not the tree's.
	cmd := exec.Command(vpy, "-m", "unittest", "discover", "-v", "-s", filepath.Join(root, "sdk/python/tests"))
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "AMBER_ADDR="+addr, "AMBER_TOKEN="+strings.TrimSpace(string(key)), "PYTHONDONTWRITEBYTECODE=1", "AMBER_SDK_INSTALLED=1")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("python SDK tests: %v\ndaemon log:\n%s", err, tail(d.log(), 30))
	}
	if !strings.Contains(string(out), "Ran 13 tests") || strings.Contains(string(out), "skipped") {
		t.Fatalf("the SDK tests did not all run")
	}
}
