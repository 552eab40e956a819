package engine_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/lib/failpoint"
)

// fullDriver is what the drivers implement, so a wrapper keeps every
// power the engine finds by type assertion.
type fullDriver interface {
	sandbox.Driver
	sandbox.Checkpointer
	sandbox.PortDialer
	sandbox.OutputReader
	sandbox.RuntimeReporter
}

// hangingDriver is a driver whose next hangCuts Checkpoint calls and
// hangRestores Restore calls hang until their context ends: a kernel call
// that does not come back. Its next holdExecs Exec calls say so on
// entered and wait for gate to close (or their context to end) before
// they run: a command that holds its sandbox's cut lock for reading.
type hangingDriver struct {
	fullDriver
	hangCuts, hangRestores atomic.Int32
	holdExecs              atomic.Int32
	gate, entered          chan struct{}
}

func (h *hangingDriver) Exec(ctx context.Context, id string, spec sandbox.ExecSpec) (sandbox.ExitStatus, error) {
	if h.holdExecs.Add(-1) >= 0 {
		h.entered <- struct{}{}
		select {
		case <-h.gate:
		case <-ctx.Done():
			return sandbox.ExitStatus{}, ctx.Err()
		}
	}
	return h.fullDriver.Exec(ctx, id, spec)
}

func (h *hangingDriver) Checkpoint(ctx context.Context, id, dir string, o sandbox.CheckpointOptions) (sandbox.CheckpointStats, error) {
	if h.hangCuts.Add(-1) >= 0 {
		<-ctx.Done()
		return sandbox.CheckpointStats{}, ctx.Err()
	}
	return h.fullDriver.Checkpoint(ctx, id, dir, o)
}

func (h *hangingDriver) Restore(ctx context.Context, spec sandbox.Spec, dir string, o sandbox.RestoreOptions) (sandbox.RestoreStats, error) {
	if h.hangRestores.Add(-1) >= 0 {
		<-ctx.Done()
		return sandbox.RestoreStats{}, ctx.Err()
	}
	return h.fullDriver.Restore(ctx, spec, dir, o)
}

// TestDriverCallsHaveDeadlines (issue 23, self-healing): a driver
// Checkpoint or Restore that hangs ends at the engine's deadline with an
// error, releases the sandbox (an exec runs, a destroy would not wait),
// and the next call works — no restart.
func TestDriverCallsHaveDeadlines(t *testing.T) {
	env := enginetest.NewFor(t, enginetest.DriverName(), engine.Options{Recovery: engine.RecoveryOptions{DriverTimeout: 2 * time.Second}})
	var h *hangingDriver
	env.WrapDriver = func(d sandbox.Driver) sandbox.Driver {
		h = &hangingDriver{fullDriver: d.(fullDriver)}
		return h
	}
	env.Restart(t)
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	h.hangCuts.Store(1)
	start := time.Now()
	_, err = e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb.ID})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 30*time.Second {
		t.Fatalf("a hung cut: %v after %v", err, time.Since(start))
	}
	if out, code := execOut(t, e, "default", sb.ID, "echo", "free"); code != 0 || out != "free\n" {
		t.Fatalf("after the hung cut: %q %d", out, code)
	}
	ck, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb.ID})
	if err != nil {
		t.Fatalf("the next cut: %v", err)
	}

	h.hangRestores.Store(1)
	start = time.Now()
	if _, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID}); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 60*time.Second {
		t.Fatalf("a hung restore: %v after %v", err, time.Since(start))
	}
	if _, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID}); err != nil {
		t.Fatalf("the next restore: %v", err)
	}
	if out, code := execOut(t, e, "default", sb.ID, "echo", "back"); code != 0 || out != "back\n" {
		t.Fatalf("after the restore: %q %d", out, code)
	}
}

// TestCutLockHasADeadline (issue 23, self-healing): a call into the
// sandbox that hangs while it holds the read side of the cut lock does
// not hold a checkpoint forever: the checkpoint fails Unavailable, naming
// the sandbox, within RecoveryOptions.CutLockTimeout, lets go (other calls
// run), and the next checkpoint, once the call ended, is taken — no
// restart.
func TestCutLockHasADeadline(t *testing.T) {
	const wait = 2 * time.Second
	env := enginetest.NewFor(t, enginetest.DriverName(), engine.Options{Recovery: engine.RecoveryOptions{CutLockTimeout: wait}})
	var h *hangingDriver
	env.WrapDriver = func(d sandbox.Driver) sandbox.Driver {
		h = &hangingDriver{fullDriver: d.(fullDriver), gate: make(chan struct{}), entered: make(chan struct{}, 1)}
		return h
	}
	env.Restart(t)
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	h.holdExecs.Store(1)
	held := make(chan error, 1)
	go func() {
		_, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"true"}})
		held <- err
	}()
	select {
	case <-h.entered:
	case <-time.After(time.Minute):
		t.Fatal("the held exec never reached the driver")
	}
	start := time.Now()
	_, err = e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb.ID})
	took := time.Since(start)
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), sb.ID) || took < wait || took > wait+30*time.Second {
		t.Fatalf("a cut behind a hung call: %v after %v, want Unavailable naming %s after %v", err, took, sb.ID, wait)
	}
	t.Logf("the cut gave up after %v: %v", took.Round(time.Millisecond), err)
	if e.CutHeld(sb.ID) {
		t.Fatal("the cut that gave up still holds calls into the sandbox back")
	}
	if out, code := execOut(t, e, "default", sb.ID, "echo", "beside"); code != 0 || out != "beside\n" {
		t.Fatalf("a call beside the hung one: %q %d", out, code)
	}
	if got, err := e.Get(ctx, "default", sb.ID); err != nil || got.State != meta.StateRunning {
		t.Fatalf("after the failed cut: %+v %v, want the sandbox running", got, err)
	}
	close(h.gate)
	if err := <-held; err != nil {
		t.Fatalf("the held exec: %v", err)
	}
	if _, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb.ID}); err != nil {
		t.Fatalf("the next cut: %v", err)
	}
	if out, code := execOut(t, e, "default", sb.ID, "echo", "after"); code != 0 || out != "after\n" {
		t.Fatalf("after the cut: %q %d", out, code)
	}
}

// TestStartSurvivesAHungStore (issue 23, self-healing): a metadata read
// that hangs during the start-up reconcile (a database that stopped
// answering) ends at the attempt's deadline (RecoveryOptions.StartTimeout);
// the reconcile is tried again and Start completes, the sandbox
// reconciled, instead of `amber up` hanging.
func TestStartSurvivesAHungStore(t *testing.T) {
	const deadline = 2 * time.Second
	env := enginetest.New(t, engine.Options{Recovery: engine.RecoveryOptions{StartTimeout: deadline}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := env.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	fps := failpoint.New()
	release := make(chan struct{})
	// Released anyway after a minute: the test fails instead of hanging
	// if the hung read had no deadline.
	safety := time.AfterFunc(time.Minute, func() { close(release) })
	defer safety.Stop()
	hang := failpoint.Hang(release)
	var reads, ended atomic.Int32
	fps.ArmCtx("meta.read", 1, true, func(ctx context.Context, subject string) error {
		if reads.Add(1) > 1 { // the new daemon's first read hangs
			return nil
		}
		err := hang(ctx, subject)
		if err != nil {
			ended.Add(1)
		}
		return err
	})
	env.MetaFailpoints = fps
	start := time.Now()
	env.Restart(t) // t.Fatal if Start returns an error
	took := time.Since(start)
	if ended.Load() != 1 {
		t.Fatalf("the hung read was not ended by a deadline (reads %d, ended %d, start took %v)", reads.Load(), ended.Load(), took)
	}
	if took < deadline || took > deadline+45*time.Second {
		t.Fatalf("start took %v with a hung read, want about the attempt's deadline (%v)", took, deadline)
	}
	t.Logf("started in %v despite a hung read", took.Round(time.Millisecond))
	got, err := env.Engine.Get(ctx, "default", sb.ID)
	if err != nil || got.State != meta.StateRunning {
		t.Fatalf("after the start: %+v %v, want the sandbox running", got, err)
	}
	if out, code := execOut(t, env.Engine, "default", sb.ID, "echo", "ok"); code != 0 || out != "ok\n" {
		t.Fatalf("exec after the start: %q %d", out, code)
	}
}

// TestDriverFailpointsHang: the failpoints in front of the driver's calls
// (driver.checkpoint, driver.restore; the daemon's hang/DUR action) hang a
// call until its deadline, DriverTimeout: the call fails, and the next
// one works — no restart.
func TestDriverFailpointsHang(t *testing.T) {
	fps := failpoint.New()
	env := enginetest.NewFor(t, enginetest.DriverName(), engine.Options{Failpoints: fps, Recovery: engine.RecoveryOptions{DriverTimeout: 2 * time.Second}})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	fps.ArmCtx(engine.FPDriverCheckpoint, fps.Hits(engine.FPDriverCheckpoint)+1, false, failpoint.Hang(nil))
	start := time.Now()
	if _, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb.ID}); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 30*time.Second {
		t.Fatalf("a cut hung at %s: %v after %v", engine.FPDriverCheckpoint, err, time.Since(start))
	}
	ck, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb.ID})
	if err != nil {
		t.Fatalf("the next cut: %v", err)
	}
	fps.ArmCtx(engine.FPDriverRestore, fps.Hits(engine.FPDriverRestore)+1, false, failpoint.Hang(nil))
	start = time.Now()
	if _, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID}); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 60*time.Second {
		t.Fatalf("a restore hung at %s: %v after %v", engine.FPDriverRestore, err, time.Since(start))
	}
	if _, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck.ID}); err != nil {
		t.Fatalf("the next restore: %v", err)
	}
	if out, code := execOut(t, e, "default", sb.ID, "echo", "back"); code != 0 || out != "back\n" {
		t.Fatalf("after the restore: %q %d", out, code)
	}
	if fps.Hits(engine.FPDriverCheckpoint) < 2 || fps.Hits(engine.FPDriverRestore) < 2 {
		t.Fatalf("failpoint hits: checkpoint %d, restore %d; want 2 each", fps.Hits(engine.FPDriverCheckpoint), fps.Hits(engine.FPDriverRestore))
	}
}
