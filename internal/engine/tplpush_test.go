package engine_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/host/faults"
	"github.com/amber-run/amber/internal/state/chunkstore"
	"github.com/amber-run/amber/lib/failpoint"
	"github.com/amber-run/amber/stores/localfs"
)

// faultyTemplates is a template catalog whose blob store has the blob.*
// failpoints of fps in front of it (as in the daemon under amber chaos).
func faultyTemplates(t *testing.T, fps *failpoint.Set) *engine.Catalog {
	t.Helper()
	dir := t.TempDir()
	bs, err := localfs.Open(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	fb := faults.Blobs(bs, fps)
	cs, err := chunkstore.New(chunkstore.Config{Blobs: fb, MasterKey: enginetest.TestMasterKey})
	if err != nil {
		t.Fatal(err)
	}
	cat, err := engine.NewCatalog(engine.CatalogOptions{Root: filepath.Join(dir, "templates"),
		Dir: filepath.Join(enginetest.Cache(), "templates"), Blobs: fb, Chunks: cs, Logger: enginetest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cat.Get("minimal"); err != nil {
		t.Skipf("template minimal is not installed: %v", err)
	}
	return cat
}

// TestCheckpointRetriesTemplatePush: a sandbox's first checkpoint pushes
// its template version; a blob store that fails every write for 4 s from
// the push's first write (a chaos blob-errors window) no longer fails the
// checkpoint — the push is retried until the store is back (on main the
// checkpoint failed, and the session's next Wake began the 132 MB push of
// the python template again: the chaos run's longest recoveries).
func TestCheckpointRetriesTemplatePush(t *testing.T) {
	fps := failpoint.New()
	cat := faultyTemplates(t, fps)
	env := enginetest.NewFor(t, enginetest.DriverName(), engine.Options{Templates: cat})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Policy none: nothing pushes the version ahead; the cut does.
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Policy: "none", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	var failed atomic.Int32
	fps.ArmEach(faults.BlobWrite, 1, failpoint.Window(4*time.Second, func(string) error {
		failed.Add(1)
		return errors.New("blob store: connection refused")
	}))
	start := time.Now()
	ck, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb.ID})
	if err != nil {
		t.Fatalf("checkpoint through a 4 s blob write error window (%d writes failed): %v", failed.Load(), err)
	}
	if failed.Load() == 0 {
		t.Fatal("no blob write failed: the window never opened, the test proves nothing")
	}
	if took := time.Since(start); took < 4*time.Second {
		t.Fatalf("checkpoint %s committed %v after the window opened, before it closed", ck.ID, took)
	}
	digest, err := cat.Digest(ctx, "minimal", sb.TemplateVersion)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := cat.Store().Stored(ctx, digest); err != nil || !ok {
		t.Fatalf("template version %s not in the blob store after the checkpoint: %v %v", digest, ok, err)
	}
}

// TestTemplatePushedAhead: creating a sandbox that will be checkpointed
// (strict) pushes its template version in the background, before any
// checkpoint: the first cut does not carry the push (on main it did).
func TestTemplatePushedAhead(t *testing.T) {
	fps := failpoint.New()
	cat := faultyTemplates(t, fps)
	env := enginetest.NewFor(t, enginetest.DriverName(), engine.Options{Templates: cat})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Policy: "strict", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	digest, err := cat.Digest(ctx, "minimal", sb.TemplateVersion)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		ok, err := cat.Store().Stored(ctx, digest)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("template version %s not pushed a minute after the strict sandbox's create", digest)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cks, err := e.ListCheckpoints(ctx, "default", sb.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(cks) != 0 {
		t.Fatalf("the sandbox has %d checkpoints: the version may have been pushed by a cut, not ahead", len(cks))
	}
}

// TestStrictCutDoesNotWaitForTemplatePush: a strict exec whose checkpoint
// commits on the node (the upload behind) does not wait for its
// template's push while the blob store fails: the exec is acknowledged at
// once, and the upload — template first, then the checkpoint — completes
// once the store is back. Before, the first cut carried the push and its
// retries (here 8 s of blob write errors).
func TestStrictCutDoesNotWaitForTemplatePush(t *testing.T) {
	t.Run("strict exec", func(t *testing.T) { strictCutNoPushWait(t, false) })
	// The session harness's cuts (a sandbox of policy none, cut by
	// StrictCheckpoint): on main they uploaded before the answer, the
	// template's push first.
	t.Run("StrictCheckpoint", func(t *testing.T) { strictCutNoPushWait(t, true) })
}

func strictCutNoPushWait(t *testing.T, session bool) {
	fps := failpoint.New()
	cat := faultyTemplates(t, fps)
	env := enginetest.NewFor(t, enginetest.DriverName(), engine.Options{Templates: cat})
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var failed atomic.Int32
	fps.ArmEach(faults.BlobWrite, 1, failpoint.Window(8*time.Second, func(string) error {
		failed.Add(1)
		return errors.New("blob store: connection refused")
	}))
	policy := "strict"
	if session {
		policy = "none"
	}
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Policy: policy, Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if session {
		if _, err := e.StrictCheckpoint(ctx, "default", sb.ID); err != nil {
			t.Fatalf("strict cut while the template's blob store fails: %v", err)
		}
	} else if _, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"true"}}); err != nil {
		t.Fatalf("strict exec while the template's blob store fails: %v", err)
	}
	took := time.Since(start)
	if took > 5*time.Second {
		t.Fatalf("the strict exec took %v: its cut waited for the template's push through the 8 s window", took.Round(time.Millisecond))
	}
	digest, err := cat.Digest(ctx, "minimal", sb.TemplateVersion)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		cks, err := e.ListCheckpoints(ctx, "default", sb.ID, true)
		if err != nil {
			t.Fatal(err)
		}
		stored, _ := cat.Store().Stored(ctx, digest)
		if len(cks) > 0 && !cks[len(cks)-1].UploadPending && stored {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after the window: template stored %v, checkpoints %+v", stored, cks)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if failed.Load() == 0 {
		t.Fatal("no template blob write failed: the test proves nothing")
	}
	if done := time.Since(start); done < 6*time.Second {
		t.Fatalf("the upload ended %v after the cut, inside the 8 s window: the template was not pushed through it", done.Round(time.Millisecond))
	}
}
