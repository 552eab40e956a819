package engine_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// gatedLoadDriver is the real driver, whose lazy restores report the end
// of their load (RestoreStats.Loaded) to the engine only once gate is
// closed: a load the test holds open as long as it looks. loadedAt is
// closed when the driver's own report came.
type gatedLoadDriver struct {
	fullDriver
	gate     chan struct{}
	loadedAt chan struct{}
}

func (g *gatedLoadDriver) Restore(ctx context.Context, spec sandbox.Spec, dir string, o sandbox.RestoreOptions) (sandbox.RestoreStats, error) {
	rs, err := g.fullDriver.Restore(ctx, spec, dir, o)
	if err != nil || rs.Loaded == nil {
		return rs, err
	}
	inner, gated, done := rs.Loaded, make(chan error, 1), g.loadedAt
	go func() {
		v := <-inner
		close(done)
		<-g.gate
		gated <- v
		close(gated)
	}()
	rs.Loaded = gated
	return rs, nil
}

// tickerBin builds cmd/amber/testdata/ticker (the restore benchmark's
// workload: N MiB of a pseudo-random pattern, checked on SIGUSR1).
func tickerBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ticker")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "../../cmd/amber/testdata/ticker")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the ticker: %v\n%s", err, out)
	}
	return bin
}

// tickerLine waits (up to a minute) for a line of process pid's output
// that starts with prefix and comes after skip such lines; it returns it.
func tickerLine(t *testing.T, e *engine.Engine, id string, pid int, prefix string, skip int) string {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; {
		out, _ := execOut(t, e, "default", id, "sh", "-c", fmt.Sprintf("grep '^%s' /run/amber/proc/%d.log || true", prefix, pid))
		if ls := strings.Split(strings.TrimSpace(out), "\n"); len(ls) > skip && ls[skip] != "" {
			return ls[skip]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q line (after %d) from %d", prefix, skip, pid)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestLazyRestore (issue 21): the engine restores lazily where the driver
// can (both drivers: criu lazy-pages, runsc restore --background). A sandbox holding 64 MiB of a pseudo-random pattern,
// recovered from its hot copy, runs lazily (the event says lazy and hot);
// while its load has not ended (held open by gatedLoadDriver) the image
// stays — the restore's directory of the hot copy's links, and the hot
// copy itself, which a newer cut would otherwise replace; a checkpoint
// right after the restore works, and once the load ends the image is
// released and the older copy pruned. Restored from that checkpoint, the
// process is the same and every byte of its memory checks.
func TestLazyRestore(t *testing.T) {
	for _, drv := range []string{"gvisor", "criu"} {
		t.Run(drv, func(t *testing.T) { testLazyRestore(t, drv) })
	}
}

func testLazyRestore(t *testing.T, drv string) {
	env := enginetest.NewFor(t, drv, engine.Options{})
	g := &gatedLoadDriver{gate: make(chan struct{}), loadedAt: make(chan struct{})}
	env.WrapDriver = func(d sandbox.Driver) sandbox.Driver { g.fullDriver = d.(fullDriver); return g }
	env.Restart(t)
	defer func() {
		select {
		case <-g.gate:
		default:
			close(g.gate)
		}
	}()
	e := env.Engine
	if !env.Driver.Capabilities().LazyRestore {
		t.Skipf("the %s driver cannot restore lazily here", drv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const mib = 64
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true,
		Limits: sandbox.Limits{MemoryBytes: (mib + 256) << 20}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	fs, err := e.Files(ctx, "default", id)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(tickerBin(t))
	if err != nil {
		t.Fatal(err)
	}
	err = fs.WriteFile(ctx, "/root/ticker", f, 0o755)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := e.StartProcess(ctx, "default", id, sandbox.ExecSpec{Args: []string{"/root/ticker", fmt.Sprint(mib), "88172645463325252"}})
	if err != nil {
		t.Fatal(err)
	}
	ready := tickerLine(t, e, id, pid, "ready", 0)
	ck1, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: id})
	if err != nil {
		t.Fatal(err)
	}
	e.WaitHotTier()
	if _, err := e.Kill(ctx, "default", id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Recover(ctx, "default", id, nil); err != nil {
		t.Fatal(err)
	}
	p := restoredPayload(t, env, id)
	if !p.Hot || !p.Lazy {
		t.Fatalf("recover: hot %v lazy %v, want both", p.Hot, p.Lazy)
	}
	held, _ := filepath.Glob(filepath.Join(env.Dir, "work", "hot-"+ck1.ID+"-*"))
	if len(held) != 1 {
		t.Fatalf("the lazy restore's image while its load runs: %v, want one directory", held)
	}

	// A cut right after the restore (the driver waits for its own load);
	// the engine still holds the image: ck1's copy outlives the newer one.
	ck2, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: id})
	if err != nil {
		t.Fatalf("checkpoint right after the lazy restore: %v", err)
	}
	e.WaitHotTier()
	select {
	case <-g.loadedAt:
	default:
		t.Error("the cut returned before the driver's load ended")
	}
	if _, ok := e.HotCopy(ck2.ID); !ok {
		t.Fatalf("no hot copy of %s", ck2.ID)
	}
	if _, ok := e.HotCopy(ck1.ID); !ok {
		t.Error("the hot copy a lazy restore loads from was pruned before its load ended")
	}
	if _, err := os.Stat(held[0]); err != nil {
		t.Errorf("the lazy restore's image before its load ended: %v", err)
	}

	close(g.gate) // the engine learns the load ended
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, statErr := os.Stat(held[0])
		_, kept := e.HotCopy(ck1.ID)
		if os.IsNotExist(statErr) && !kept {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after the load ended: image %v, older hot copy kept %v; want both gone", statErr, kept)
		}
	}

	// The cut taken right after the lazy restore holds every byte.
	if _, err := e.Kill(ctx, "default", id); err != nil {
		t.Fatal(err)
	}
	g.loadedAt = make(chan struct{})
	if _, err := e.Recover(ctx, "default", id, nil); err != nil {
		t.Fatal(err)
	}
	if p := restoredPayload(t, env, id); p.Checkpoint != ck2.ID || !p.Lazy {
		t.Errorf("recover from the cut after the lazy restore: %+v", p)
	}
	if got := tickerLine(t, e, id, pid, "ready", 0); got != ready {
		t.Errorf("after the restores: %q, want %q", got, ready)
	}
	if err := e.Signal(ctx, "default", id, pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if v := tickerLine(t, e, id, pid, "verify", 0); !strings.HasPrefix(v, "verify ok "+strings.TrimPrefix(ready, "ready ")+" ") {
		t.Errorf("memory check after the lazy restores: %q (the process said %q)", v, ready)
	}
}
