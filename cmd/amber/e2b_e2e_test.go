package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/edge/e2b"
)

// TestE2EE2B runs ordinary E2B programs (tests/e2b/*.mjs) with the official
// e2b SDK (npm e2b@2.51.0, pinned by tests/e2b/package-lock.json and
// installed by scripts/setup/e2b-deps.sh, `make setup-e2b-deps`) against a
// real daemon started with --e2b, configured only by the environment the
// SDK reads: E2B_API_KEY (the admin key's e2b_ alias), E2B_API_URL (the
// daemon's /e2b) and E2B_SANDBOX_URL (the daemon). Each program runs
// twice: PHASE=before makes two sandboxes and pauses one; the daemon is
// then killed with SIGKILL and started again; PHASE=after connects to both
// and finds their processes still running with their memory.
func TestE2EE2B(t *testing.T) {
	src, _ := filepath.Abs("../../tests/e2b")
	node, deps := npmDeps(t, src, "e2b", "e2b/package.json", "setup-e2b-deps")
	programs, _ := filepath.Glob(filepath.Join(src, "*.mjs"))
	if len(programs) == 0 {
		t.Fatal("no programs in tests/e2b")
	}
	work := t.TempDir()
	if err := os.Symlink(deps, filepath.Join(work, "node_modules")); err != nil {
		t.Fatal(err)
	}
	for _, p := range programs {
		if out, err := exec.Command("cp", p, work).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v: %s", p, err, out)
		}
	}
	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	d := startDaemon(t, bin, dir, addr, "--pool", "0", "--e2b")
	key, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	run := func(program, phase string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, node, program)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "E2B_API_KEY="+e2b.Alias(strings.TrimSpace(string(key))),
			"E2B_API_URL=http://"+addr+"/e2b", "E2B_SANDBOX_URL=http://"+addr, "DAEMON_ADDR="+addr,
			"PHASE="+phase, "STATE_FILE="+filepath.Join(work, program+".state"), "NO_COLOR=1")
		out, err := cmd.CombinedOutput()
		t.Logf("%s %s:\n%s", program, phase, out)
		if err != nil || !strings.Contains(string(out), strings.ToUpper(phase)+" OK") {
			t.Fatalf("%s %s: %v\n%s\ndaemon log:\n%s", program, phase, err, out, tail(d.log(), 40))
		}
	}
	for _, p := range programs {
		run(filepath.Base(p), "before")
	}
	d.stop(syscall.SIGKILL)
	d = startDaemon(t, bin, dir, addr, "--pool", "0", "--e2b")
	for _, p := range programs {
		run(filepath.Base(p), "after")
	}
}
