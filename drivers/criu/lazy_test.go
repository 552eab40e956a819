package criu

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
)

// lazyWorkload starts, in a new sandbox, busybox awk holding mib MiB and
// the counter, cuts it (left stopped) and returns its id, the image and
// the counter's state.
func lazyWorkload(t *testing.T, td *testDriver, mib int) (string, string, *fidelityState) {
	t.Helper()
	ctx := context.Background()
	id := td.create(sandbox.Limits{MemoryBytes: int64(mib+256) << 20})
	prog := `BEGIN { s = sprintf("%` + strconv.Itoa(mib<<20) + `s", ""); while (1) system("sleep 3600") }`
	if _, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"awk", prog}}); err != nil {
		t.Fatal(err)
	}
	waitRSS(t, td, id, "awk", int64(mib)<<20)
	pid, err := td.Start(ctx, id, sandbox.ExecSpec{Args: []string{"/bin/sh", "-c", counterScript}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	lines := counterLines(t, td, id, pid)
	if len(lines) == 0 {
		t.Fatal("counter logged nothing")
	}
	at, _ := strconv.Atoi(lines[len(lines)-1][0])
	images := t.TempDir()
	if _, err := td.Checkpoint(ctx, id, images, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatal(err)
	}
	return id, images, &fidelityState{counterPid: pid, random: lines[0][1], counterAt: at}
}

// TestLazyCutWaits: a checkpoint of a sandbox whose lazy load has not
// ended (here: lazy-pages' exit held back by a wrapper until a gate file
// goes) waits for it, bounded (Unavailable after lazyCutWait, the sandbox
// running on); a cut started during the load goes ahead once it ends
// (Loaded nil), and its image, restored eagerly, has the memory.
func TestLazyCutWaits(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	if !td.Capabilities().LazyRestore {
		t.Skip("LazyRestore is off")
	}
	ctx := context.Background()
	id, images, st := lazyWorkload(t, td, 64)
	gate := filepath.Join(t.TempDir(), "gate")
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer func(c func(string, ...string) *exec.Cmd) { lazyPagesCommand = c }(lazyPagesCommand)
	lazyPagesCommand = func(criu string, args ...string) *exec.Cmd {
		return exec.Command("/bin/sh", append([]string{"-c", `"$@"; rc=$?; while [ -e ` + gate + ` ]; do sleep 0.02; done; exit $rc`, "sh", criu}, args...)...)
	}
	defer os.Remove(gate)
	rs, err := td.Restore(ctx, sandbox.Spec{ID: id}, images, sandbox.RestoreOptions{Lazy: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rs.Lazy || rs.Loaded == nil {
		t.Fatalf("asked for a lazy restore: Lazy %v, Loaded %v", rs.Lazy, rs.Loaded)
	}
	ls, err := td.container(id)
	if err != nil {
		t.Fatal(err)
	}
	pid := ls.lazy.pid()

	defer func(w time.Duration) { lazyCutWait = w }(lazyCutWait)
	lazyCutWait = time.Second
	t0 := time.Now()
	_, err = td.Checkpoint(ctx, id, t.TempDir(), sandbox.CheckpointOptions{})
	if !errdefs.IsUnavailable(err) || time.Since(t0) < lazyCutWait {
		t.Fatalf("checkpoint during the load: %v after %v, want Unavailable after %v", err, time.Since(t0), lazyCutWait)
	}
	if in, err := td.Inspect(ctx, id); err != nil || in.State != sandbox.StateRunning {
		t.Fatalf("after the refused cut: %+v, %v; want it running", in, err)
	}

	lazyCutWait = time.Minute
	const held = 700 * time.Millisecond
	time.AfterFunc(held, func() { _ = os.Remove(gate) })
	t0 = time.Now()
	images2 := t.TempDir()
	if _, err := td.Checkpoint(ctx, id, images2, sandbox.CheckpointOptions{LeaveStopped: true}); err != nil {
		t.Fatalf("checkpoint during the load, which then ends: %v", err)
	}
	if took := time.Since(t0); took < held {
		t.Errorf("the cut took %v: it did not wait for the load (held %v)", took, held)
	}
	select {
	case err := <-rs.Loaded:
		if err != nil {
			t.Fatalf("Loaded: %v", err)
		}
	default:
		t.Fatal("the cut went ahead before Loaded reported the end of the load")
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Errorf("lazy-pages %d still exists after the load", pid)
	}
	if _, err := td.Restore(ctx, sandbox.Spec{ID: id}, images2, sandbox.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRSS(t, td, id, "awk", 64<<20)
	if err := checkMemory(t, td, id, st); err != nil {
		t.Error(err)
	}
}

// TestLazyPagesCrash: lazy-pages killed mid-load (as soon as CRIU's
// restore returns): the failure is reported — by Restore, or by Loaded
// (DataLoss) — the sandbox does not run on, lazy-pages is gone, and a
// checkpoint is refused.
func TestLazyPagesCrash(t *testing.T) {
	td := newTestDriver(t)
	requireCriu(t, td)
	if !td.Capabilities().LazyRestore {
		t.Skip("LazyRestore is off")
	}
	ctx := context.Background()
	id, images, _ := lazyWorkload(t, td, 256)
	pid := 0
	testAfterLazyRestore = func(p int) { pid = p; _ = syscall.Kill(p, syscall.SIGKILL) }
	defer func() { testAfterLazyRestore = nil }()
	rs, err := td.Restore(ctx, sandbox.Spec{ID: id}, images, sandbox.RestoreOptions{Lazy: true})
	if pid == 0 {
		t.Fatalf("no lazy restore: %v", err)
	}
	if err != nil {
		t.Logf("Restore: %v", err)
	} else {
		select {
		case err := <-rs.Loaded:
			if !errdefs.IsDataLoss(err) {
				t.Fatalf("Loaded after lazy-pages was killed: %v, want DataLoss", err)
			}
			t.Logf("Loaded: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("Loaded reported nothing 30s after lazy-pages was killed")
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		in, err := td.Inspect(ctx, id)
		if err != nil || in.State != sandbox.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox still runs after its load failed: %+v", in)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Errorf("lazy-pages %d still exists", pid)
	}
	if _, err := td.Checkpoint(ctx, id, t.TempDir(), sandbox.CheckpointOptions{}); err == nil {
		t.Error("a checkpoint of the sandbox whose load failed succeeded")
	}
}
