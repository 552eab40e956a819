package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/internal/engine/enginetest"
)

// TestE2EFailoverTime measures the time from a node's death to each of its
// sandboxes running again on another node, with the default lease
// settings: AMBER_FAILOVER_SANDBOXES=N sandboxes (a counter in memory,
// checkpointed) on node a; a's process is SIGKILLed and its sandboxes
// destroyed; node b takes them over. It prints p50, p99 and max, and
// appends them to AMBER_BENCH_OUT when set. `make bench-failover` runs it
// for 10 sandboxes; it is skipped otherwise (minutes of work).
func TestE2EFailoverTime(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("AMBER_FAILOVER_SANDBOXES"))
	if n <= 0 {
		t.Skip("set AMBER_FAILOVER_SANDBOXES=N (make bench-failover)")
	}
	bin, dir := e2eSetup(t)
	shared, adminKey := sharedStores(t, dir)
	// The default node lease: drop the test's longer one.
	for i := range shared {
		if shared[i] == "--node-ttl" {
			shared = append(shared[:i:i], shared[i+2:]...)
			break
		}
	}
	// The counter's step (AMBER_FAILOVER_TICK seconds, default 0.1): each
	// step starts three processes in the sandbox, so restored sandboxes
	// compete with the restores still running for the CPU; 1 is closer
	// to an agent's sandbox, idle between tool calls.
	tick := os.Getenv("AMBER_FAILOVER_TICK")
	if _, err := strconv.ParseFloat(tick, 64); err != nil {
		tick = "0.1"
	}
	a := startNode(t, bin, dir, "node-a", adminKey, shared)
	b := startNode(t, bin, dir, "node-b", adminKey, shared)
	// Four at a time (100 one by one took most of the run).
	ids := make([]string, n)
	setup := time.Now()
	var swg sync.WaitGroup
	next := make(chan int)
	for range 4 {
		swg.Add(1)
		go func() {
			defer swg.Done()
			// (t.Errorf, not must: FailNow belongs to the test's goroutine.)
			run := func(args ...string) (string, bool) {
				out, errs, code := a.amber(args...)
				if code != 0 {
					t.Errorf("amber %s: exit %d: %s", strings.Join(args, " "), code, errs)
				}
				return out, code == 0
			}
			for i := range next {
				out, ok := run("sandbox", "create", "--template", "minimal")
				id := strings.TrimSpace(out)
				if !ok {
					continue
				}
				if _, ok := run("exec", "-d", id, "--", "sh", "-c", `i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep `+tick+`; done`); !ok {
					continue
				}
				// A checkpoint is tried again on a passing store error
				// (MinIO on loopback broke a pipe now and then).
				for attempt := 1; attempt <= 3; attempt++ {
					out, errs, code := a.amber("checkpoint", id)
					if code == 0 {
						ids[i] = id
						break
					}
					if attempt == 3 || !strings.Contains(errs, "unavailable") {
						t.Errorf("amber checkpoint %s: exit %d: %s%s", id, code, out, errs)
						break
					}
					time.Sleep(time.Second)
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	swg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d sandboxes made and checkpointed on node-a in %s", n, time.Since(setup).Round(time.Millisecond))
	// The node dies: its process and, at once, its sandboxes. A machine
	// that dies takes every process with it at once; here each process in
	// the node's cgroup tree is SIGKILLed in one pass (the driver's Kill,
	// one runsc call and wait per sandbox, took 7–10 s of the two cores
	// b restores on). Their state is torn down when the test ends.
	killed := time.Now()
	a.stop(syscall.SIGKILL)
	if err := killCgroupTree("/amber/"+enginetest.DriverName()+"-node-a", 30*time.Second); err != nil {
		t.Logf("kill node-a's cgroups: %v; killing through the driver", err)
		drv := enginetest.NewDriver(t, filepath.Join(a.dataDir, "drivers", enginetest.DriverName()))
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := drv.Kill(context.Background(), id); err != nil {
					t.Errorf("kill %s: %v", id, err)
				}
			}()
		}
		wg.Wait()
	}
	t.Logf("node-a and its %d sandboxes killed in %s", n, time.Since(killed).Round(time.Millisecond))
	took := map[string]time.Duration{}
	deadline := killed.Add(time.Duration(n)*30*time.Second + time.Minute)
	for len(took) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d sandboxes running again after %s\n%s", len(took), n, time.Since(killed), tail(b.log(), 40))
		}
		sbs, err := b.cl.ListSandboxes(context.Background())
		now := time.Since(killed)
		if err == nil {
			for _, sb := range sbs {
				if _, done := took[sb.ID]; !done && sb.Node == "node-b" && sb.State == "running" && sb.Generation > 0 {
					took[sb.ID] = now
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	var ds []time.Duration
	for _, id := range ids {
		ds = append(ds, took[id])
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	pct := func(p float64) time.Duration { return ds[int(p*float64(len(ds)-1)+0.5)] }
	line := fmt.Sprintf("failover %d sandboxes (node-ttl default, minimal template, counter step %ss, node-b takes over): p50 %s p99 %s max %s",
		n, tick, pct(0.5).Round(10*time.Millisecond), pct(0.99).Round(10*time.Millisecond), ds[len(ds)-1].Round(10*time.Millisecond))
	t.Log(line)
	if out := os.Getenv("AMBER_BENCH_OUT"); out != "" {
		f, err := os.OpenFile(out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintln(f, line)
			f.Close()
		}
	}
	for _, l := range strings.Split(b.log(), "\n") {
		if strings.Contains(l, "adopted sandbox restored") ||
			strings.Contains(l, `msg="sandbox restored"`) || strings.Contains(l, "node lease expired") ||
			strings.Contains(l, "node process gone") || strings.Contains(l, "spread over") {
			t.Log(l)
		}
	}
	// Each one runs: its counter goes on.
	for _, id := range ids {
		b.must("exec", id, "--", "cat", "/tmp/count")
	}
}

// killCgroupTree SIGKILLs every process in cgroup parent and its
// children (cgroup v1: the pids hierarchy, else memory) until none is left
// or timeout passes. Only the processes of the node this test started are
// in it (its --cgroup parent is named after its node id).
func killCgroupTree(parent string, timeout time.Duration) error {
	var root string
	for _, ctrl := range []string{"pids", "memory"} {
		if st, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctrl, parent)); err == nil && st.IsDir() {
			root = filepath.Join("/sys/fs/cgroup", ctrl, parent)
			break
		}
	}
	if root == "" {
		return fmt.Errorf("no cgroup %s", parent)
	}
	deadline := time.Now().Add(timeout)
	for {
		var pids []int
		filepath.WalkDir(root, func(p string, de os.DirEntry, err error) error {
			if err != nil || de.IsDir() || de.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if n, err := strconv.Atoi(f); err == nil {
					pids = append(pids, n)
				}
			}
			return nil
		})
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: processes %v do not exit", parent, pids)
		}
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
