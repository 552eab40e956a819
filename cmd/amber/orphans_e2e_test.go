package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/chaos"
)

// hostProcsWith lists the host pids whose command line contains any of
// subs (not this test's own process).
func hostProcsWith(subs ...string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		for _, s := range subs {
			if strings.Contains(cmd, s) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// TestE2EUpKillsOrphanSandboxes (issue 23): a daemon killed with its
// sandboxes running, whose data directory is then removed (a failed chaos
// run's clean-up, an operator's rm -rf), leaves sandboxes that belong to
// nobody. The next `amber up` on this host — any data dir — finds and
// kills them (their processes are gone) before it serves.
func TestE2EUpKillsOrphanSandboxes(t *testing.T) {
	bin, dir := e2eSetup(t)
	a := startDaemon(t, bin, dir, freeAddr(t), "--pool", "0")
	id := strings.TrimSpace(a.must("sandbox", "create", "--template", "minimal"))
	marker := "sleep 987" + strconv.Itoa(os.Getpid()%1000+100)
	a.must("exec", id, "--", "sh", "-c", `(setsid `+marker+` </dev/null >/dev/null 2>&1 &) ; exit 0`)
	// The sandbox's host processes: its own (criu) or its runsc processes
	// named by their state under dir (gvisor).
	if got := hostProcsWith(marker, dir+"/"); len(got) == 0 {
		t.Fatalf("no host process of sandbox %s found (marker %q, dir %s): the test cannot tell a kill", id, marker, dir)
	}
	// Should the sweep fail, the test's own leftovers go by their pids.
	t.Cleanup(func() {
		for _, pid := range hostProcsWith(marker, dir+"/") {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	a.stop(syscall.SIGKILL)
	chaos.UnmountUnder(dir)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatalf("remove the data dir: %v", err)
	}
	if got := hostProcsWith(marker, dir+"/"); len(got) == 0 {
		t.Fatal("the sandbox died with its daemon: nothing is left for the next daemon to find")
	}
	_, dir2 := e2eSetup(t)
	b := startDaemon(t, bin, dir2, freeAddr(t), "--pool", "0")
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := hostProcsWith(marker, dir+"/")
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the next amber up, the orphan sandbox's processes %v still run\n%s", left, tail(b.log(), 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(b.log(), "killed an orphan sandbox") {
		t.Fatalf("the orphan's processes are gone but the daemon did not say it killed it\n%s", tail(b.log(), 20))
	}
}
