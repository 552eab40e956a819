package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

// TestStatsIsNotActivity: a sandbox whose stats are read every 200 ms (a
// console watching its graphs) still stops when idle, and reading the
// stats of the stopped sandbox does not resume it.
func TestStatsIsNotActivity(t *testing.T) {
	env := enginetest.NewFor(t, "gvisor", engine.Options{Recovery: engine.RecoveryOptions{IdleTimeout: 5 * time.Second}})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.Stats(ctx, "default", sb.ID)
	if err != nil || st.MemoryBytes == 0 || st.DiskTotalBytes <= 0 {
		t.Fatalf("stats of a running sandbox: %+v %v", st, err)
	}
	deadline := time.Now().Add(45 * time.Second)
	for {
		_, serr := e.Stats(ctx, "default", sb.ID)
		cur, err := env.Meta.Get(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if cur.State == meta.StateStopped {
			break
		}
		if serr != nil && !errors.Is(serr, errdefs.ErrFailedPrecondition) {
			t.Fatalf("stats: %v", serr)
		}
		if time.Now().After(deadline) {
			t.Fatalf("watched by stats, the sandbox never stopped idle: %+v", cur)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := e.Stats(ctx, "default", sb.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("stats of the idle-stopped sandbox: %v, want failed precondition", err)
	}
	if cur, _ := env.Meta.Get(ctx, sb.ID); cur.State != meta.StateStopped {
		t.Fatalf("stats resumed the idle sandbox: %+v", cur)
	}
}
