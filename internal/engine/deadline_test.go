package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
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
// that does not come back.
type hangingDriver struct {
	fullDriver
	hangCuts, hangRestores atomic.Int32
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
