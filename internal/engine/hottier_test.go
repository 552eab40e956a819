package engine_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// TestHotTier: the newest checkpoint of a sandbox stays on the node, and a
// restore on the node starts from it without fetching (the restored event
// says hot, the counter continues); a copy whose file changed is refused
// and the restore is cold; an older checkpoint restores cold; a deleted
// checkpoint's copy is removed; with the tier off nothing is kept.
func TestHotTier(t *testing.T) {
	for _, drv := range []string{"gvisor", "criu"} {
		t.Run(drv, func(t *testing.T) { testHotTier(t, drv) })
	}
}

func restoredPayload(t *testing.T, env *enginetest.Env, id string) engine.RestoredPayload {
	t.Helper()
	evs, err := env.Engine.Events(ctxT(t), "default", id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Type == engine.EventRestored {
			var p engine.RestoredPayload
			if err := json.Unmarshal(evs[i].Payload, &p); err != nil {
				t.Fatal(err)
			}
			return p
		}
	}
	t.Fatalf("no %s event in %s", engine.EventRestored, id)
	return engine.RestoredPayload{}
}

func testHotTier(t *testing.T, drv string) {
	env := enginetest.NewFor(t, drv, engine.Options{})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	pid, err := e.StartProcess(ctx, "default", id, sandbox.ExecSpec{Args: []string{"sh", "-c", counterScript}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	ck1, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: id})
	if err != nil {
		t.Fatal(err)
	}
	at1 := lastLine(t, e, id, pid)
	ck2, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: id})
	if err != nil {
		t.Fatal(err)
	}
	e.WaitHotTier()
	if _, ok := e.HotCopy(ck1.ID); ok {
		t.Errorf("the older checkpoint %s still has a hot copy: one per sandbox", ck1.ID)
	}
	dir2, ok := e.HotCopy(ck2.ID)
	if !ok {
		t.Fatalf("no hot copy of the newest checkpoint %s", ck2.ID)
	}

	// A crash, then a recover on this node: from the hot copy.
	if _, err := e.Kill(ctx, "default", id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Recover(ctx, "default", id, nil); err != nil {
		t.Fatal(err)
	}
	if p := restoredPayload(t, env, id); !p.Hot || p.ImageDigest != ck2.ImageDigest {
		t.Errorf("recover from the newest checkpoint: %+v, want it from the hot copy", p)
	}
	if got := lastLine(t, e, id, pid); got.r != at1.r || got.n < at1.n {
		t.Errorf("counter after the hot restore: %+v, before %+v", got, at1)
	}
	e.WaitHotTier() // the byte check after the restore
	if _, ok := e.HotCopy(ck2.ID); !ok {
		t.Fatalf("the byte check removed a good hot copy")
	}

	// The older checkpoint has no copy: cold, and it works.
	if _, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck1.ID}); err != nil {
		t.Fatal(err)
	}
	if p := restoredPayload(t, env, id); p.Hot || p.Checkpoint != ck1.ID {
		t.Errorf("restore of the older checkpoint: %+v, want it fetched", p)
	}

	// A file of the copy changed since it was kept: refused, cold.
	var victim string
	_ = filepath.WalkDir(dir2, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && filepath.Base(p) != "hot.json" && victim == "" {
			victim = p
		}
		return nil
	})
	f, err := os.OpenFile(victim, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte{0})
	f.Close()
	if _, err := e.Restore(ctx, engine.RestoreRequest{Tenant: "default", Checkpoint: ck2.ID}); err != nil {
		t.Fatalf("restore after the hot copy was changed: %v", err)
	}
	if p := restoredPayload(t, env, id); p.Hot {
		t.Errorf("a changed hot copy was used: %+v", p)
	}
	if _, ok := e.HotCopy(ck2.ID); ok {
		t.Errorf("a changed hot copy was kept")
	}
	if got := lastLine(t, e, id, pid); got.r != at1.r {
		t.Errorf("counter after the cold restore: %+v, before %+v", got, at1)
	}

	// A deleted checkpoint leaves no copy.
	ck3, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: id})
	if err != nil {
		t.Fatal(err)
	}
	e.WaitHotTier()
	if _, ok := e.HotCopy(ck3.ID); !ok {
		t.Fatalf("no hot copy of %s", ck3.ID)
	}
	if err := e.DeleteCheckpoint(ctx, "default", ck3.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.HotCopy(ck3.ID); ok {
		t.Errorf("deleted checkpoint %s still has a hot copy", ck3.ID)
	}

	// Off: nothing kept, every restore fetched.
	off := enginetest.NewFor(t, drv, engine.Options{Recovery: engine.RecoveryOptions{HotTierBytes: -1}})
	sb2, err := off.Engine.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	ck4, err := off.Engine.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb2.ID})
	if err != nil {
		t.Fatal(err)
	}
	off.Engine.WaitHotTier()
	if _, ok := off.Engine.HotCopy(ck4.ID); ok {
		t.Errorf("the tier is off, yet %s has a hot copy", ck4.ID)
	}
}
