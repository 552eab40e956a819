package engine_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

// TestIdleStopAndResume: a sandbox without calls is checkpointed and
// stopped after the idle timeout; two execs arriving together resume it
// once, and its in-memory counter continues.
func TestIdleStopAndResume(t *testing.T) {
	env := enginetest.NewFor(t, "gvisor", engine.Options{Recovery: engine.RecoveryOptions{IdleTimeout: 2 * time.Second}})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	pid, err := e.StartProcess(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"sh", "-c", counterScript}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	before := lastLine(t, e, sb.ID, pid)

	deadline := time.Now().Add(time.Minute)
	for {
		cur, err := env.Meta.Get(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if cur.State == meta.StateStopped {
			if !strings.HasPrefix(cur.Reason, "idle") {
				t.Fatalf("stopped for another reason: %q", cur.Reason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not stopped after a minute idle: %+v", cur)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if in, err := env.Driver.Inspect(ctx, sb.ID); err == nil && in.State == sandbox.StateRunning {
		t.Fatalf("the driver still runs the idle sandbox: %+v", in)
	}

	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"true"}})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("exec %d on an idle sandbox: %v", i, err)
		}
	}
	after := lastLine(t, e, sb.ID, pid)
	if after.r != before.r || after.n < before.n {
		t.Errorf("counter after resume %+v, before %+v: restarted, not resumed", after, before)
	}
	evs, err := e.Events(ctx, "default", sb.ID, 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	restores := 0
	for _, ev := range evs {
		if ev.Type == engine.EventRestored {
			restores++
		}
	}
	if restores != 1 {
		t.Errorf("%d restores for two concurrent calls, want 1", restores)
	}
	// The engine's own act is in the tenant's audit trail.
	recs, err := env.Audit.List(ctx, "default", 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range recs {
		found = found || (r.Actor == "system" && r.Action == "sandbox.idle_stop" && r.Outcome == "ok" && strings.HasPrefix(r.Resource, sb.ID))
	}
	if !found {
		t.Errorf("no audit record of the idle stop: %+v", recs)
	}
}
