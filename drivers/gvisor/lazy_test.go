package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// TestCheckpointLazy: a lazy restore (`runsc restore --background`) runs
// the sandbox before its memory is in, and every byte of that memory is
// the checkpoint's (the pattern program checks all of it on SIGUSR1,
// after the restore and again after a cut taken while the pages were
// still loading). Loaded reports the load's end; a cut waits for it; a
// sandbox whose process dies during the load reports DataLoss through
// Loaded.
func TestCheckpointLazy(t *testing.T) {
	runsc := requireHost(t)
	tmpl := minimalTemplate(t)
	ctx := context.Background()
	d := newTestDriver(t, runsc, "/amber/gvisor-lazy")
	if !d.Capabilities().LazyRestore {
		t.Fatal("Capabilities().LazyRestore is false")
	}
	const mib = 192
	id := fmt.Sprintf("lazy-%d", os.Getpid())
	spec := sandbox.Spec{ID: id, Template: tmpl, Limits: sandbox.Limits{MemoryBytes: (mib + 256) << 20}}
	if _, err := d.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background(), id) })
	putFile(t, d, id, buildPattern(t), "/root/pattern")
	seed := strconv.FormatInt(time.Now().UnixNano()%1_000_000_007, 10)
	pid, err := d.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/root/pattern", strconv.Itoa(mib), seed}})
	if err != nil {
		t.Fatal(err)
	}
	log := fmt.Sprintf("%s/%d.log", procLogDir, pid)
	mustSh(t, d, id, `for i in $(seq 600); do grep -q ready `+log+` 2>/dev/null && exit 0; sleep 0.05; done; exit 1`)
	// verify has the program check its memory and waits for its answer
	// (the n-th "ok" line, or any "bad" line).
	checks := 0
	verify := func(when string) {
		t.Helper()
		checks++
		out := mustSh(t, d, id, fmt.Sprintf(`kill -USR1 %d; for i in $(seq 600); do grep -q bad %s && break; [ "$(grep -c '^ok ' %s)" -ge %d ] && break; sleep 0.05; done; cat %s`, pid, log, log, checks, log))
		if strings.Contains(out, "bad") || strings.Count(out, "ok "+seed) < checks {
			t.Fatalf("%s: the memory check says %q, want %d × ok %s", when, out, checks, seed)
		}
	}
	verify("before the cut")

	// Cut, kill, restore lazily; cut again at once (during the load).
	img1 := filepath.Join(t.TempDir(), "img1")
	if _, err := d.Checkpoint(ctx, id, img1, sandbox.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	killStopped(t, d, id)
	rs, err := d.Restore(ctx, spec, img1, sandbox.RestoreOptions{Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rs.Lazy || rs.Loaded == nil {
		t.Fatalf("asked for a lazy restore: Lazy %v, Loaded %v", rs.Lazy, rs.Loaded)
	}
	loading := loadRunning(d, id)
	t.Logf("lazy restore running after %v (pages still loading: %v)", rs.Running, loading)
	img2 := filepath.Join(t.TempDir(), "img2")
	cs, err := d.Checkpoint(ctx, id, img2, sandbox.CheckpointOptions{})
	if err != nil {
		t.Fatalf("a cut during the load: %v", err)
	}
	select {
	case err := <-rs.Loaded:
		if err != nil {
			t.Fatalf("Loaded: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Loaded reported nothing within a minute")
	}
	if _, ok := <-rs.Loaded; ok {
		t.Error("Loaded gave a second value; want it closed")
	}
	if cs.MemoryBytes < mib<<20 {
		t.Errorf("the cut during the load saved %d B of memory, want ≥ %d MiB", cs.MemoryBytes, mib)
	}
	verify("after the lazy restore")

	// The image cut during the load, restored lazily, holds the memory
	// (and the log of before the second check).
	killStopped(t, d, id)
	checks = 1
	rs, err = d.Restore(ctx, spec, img2, sandbox.RestoreOptions{Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	verify("after restoring the cut taken during the load")
	if err := <-rs.Loaded; err != nil {
		t.Fatalf("Loaded: %v", err)
	}

	// The sandbox's process dies while its pages load (SIGKILL, as a
	// crash): Loaded says DataLoss.
	killStopped(t, d, id)
	var loadingAtKill bool
	testLazyRestored = func(id string) {
		loadingAtKill = loadRunning(d, id)
		b, err := os.ReadFile(filepath.Join(d.dir(id), "sandbox.pid"))
		if err != nil {
			t.Errorf("sandbox pid: %v", err)
			return
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Errorf("kill the sandbox process %d: %v", pid, err)
		}
	}
	defer func() { testLazyRestored = nil }()
	rs, err = d.Restore(ctx, spec, img2, sandbox.RestoreOptions{Lazy: true})
	testLazyRestored = nil
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-rs.Loaded:
		switch {
		case !loadingAtKill:
			t.Logf("the load had ended before the kill (Loaded: %v): the crash case is not exercised", err)
		case !errdefs.IsDataLoss(err):
			t.Errorf("Loaded after the sandbox died during its load: %v, want DataLoss", err)
		default:
			t.Logf("Loaded after the sandbox died during its load: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Loaded reported nothing within a minute of the kill")
	}
}

// loadRunning reports whether sandbox id's lazy load is still running.
func loadRunning(d *Driver, id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.loads[id] != nil
}

// buildPattern builds a static program that fills argv[1] MiB with a
// pattern drawn from the seed argv[2], prints "ready", and on every
// SIGUSR1 checks every byte: "ok <seed>" or "bad <offset>".
func buildPattern(t *testing.T) string {
	src := `package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
)

var mem []byte

func at(seed uint64, i int) byte {
	x := seed + uint64(i>>3)*0x9e3779b97f4a7c15
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	return byte(x >> (8 * uint(i&7)))
}

func main() {
	n, _ := strconv.Atoi(os.Args[1])
	seed, _ := strconv.ParseUint(os.Args[2], 10, 64)
	mem = make([]byte, n<<20)
	for i := range mem {
		mem[i] = at(seed, i)
	}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	fmt.Println("ready")
	for range usr1 {
		bad := -1
		for i := range mem {
			if mem[i] != at(seed, i) {
				bad = i
				break
			}
		}
		if bad >= 0 {
			fmt.Println("bad", bad)
		} else {
			fmt.Println("ok", os.Args[2])
		}
	}
}
`
	return buildStatic(t, "pattern", src)
}
