package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

// commitWindowMeta is a metadata store whose CommitCheckpoint fails for
// window from its first call once armed (a db-errors window that opens
// just as a checkpoint's row is committed).
type commitWindowMeta struct {
	metadata.Store
	window time.Duration
	mu     sync.Mutex
	armed  bool
	until  time.Time
	failed int
}

// hit reports whether a call falls in the window (opening it at the
// first call once armed), counting it.
func (m *commitWindowMeta) hit() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.armed && m.until.IsZero() {
		m.until = time.Now().Add(m.window)
	}
	fail := m.armed && time.Now().Before(m.until)
	if fail {
		m.failed++
	}
	return fail
}

func (m *commitWindowMeta) arm() {
	m.mu.Lock()
	m.armed = true
	m.mu.Unlock()
}

func (m *commitWindowMeta) failures() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failed
}

func (m *commitWindowMeta) CommitCheckpoint(ctx context.Context, c meta.Checkpoint) (meta.Checkpoint, error) {
	if m.hit() {
		return c, errors.New("injected: database is locked")
	}
	return m.Store.CommitCheckpoint(ctx, c)
}

// restoredWindowMeta fails Restored (the row of a restored sandbox) for
// window from its first call once armed: a disk-full window.
type restoredWindowMeta struct{ commitWindowMeta }

func (m *restoredWindowMeta) CommitCheckpoint(ctx context.Context, c meta.Checkpoint) (meta.Checkpoint, error) {
	return m.Store.CommitCheckpoint(ctx, c)
}

func (m *restoredWindowMeta) Restored(ctx context.Context, id, origin string) (meta.Sandbox, error) {
	if m.hit() {
		return meta.Sandbox{}, fmt.Errorf("injected: write meta.db: %w", syscall.ENOSPC)
	}
	return m.Store.Restored(ctx, id, origin)
}

// TestRestoreRetriedThroughDiskFull: a recover whose restored sandbox's
// row meets a 2 s full-disk window records it once the disk has room —
// the recover succeeds, the sandbox runs. On main the restore gave up at
// the first ENOSPC and left the row restoring (the next attempt killed
// and restored it again).
func TestRestoreRetriedThroughDiskFull(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	wm := &restoredWindowMeta{commitWindowMeta{window: 2 * time.Second}}
	env.WrapMeta = func(s metadata.Store) metadata.Store { wm.Store = s; return wm }
	env.Restart(t)
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Policy: "none", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Checkpoint(ctx, engine.CheckpointRequest{Tenant: "default", Sandbox: sb.ID}); err != nil {
		t.Fatal(err)
	}
	wm.arm()
	got, err := e.Recover(ctx, "default", sb.ID, nil)
	if err != nil {
		t.Fatalf("recover whose row met a 2 s full-disk window (%d failed): %v", wm.failures(), err)
	}
	if wm.failures() == 0 {
		t.Fatal("no Restored call failed: the test proves nothing")
	}
	if got.State != meta.StateRunning {
		t.Fatalf("after the recover the sandbox is %s, want running", got.State)
	}
	var out strings.Builder
	if st, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"echo", "ok"}, Stdout: &out}); err != nil || st.Code != 0 {
		t.Fatalf("exec after the recover: %v %+v %q", err, st, out.String())
	}
}

// TestCheckpointCommitRetried: a strict exec's checkpoint whose row commit
// meets a 2 s metadata error window commits once the store is back
// (commitRow) — the exec succeeds and its checkpoint is committed. On
// main the checkpoint gave up at the first error: the exec failed, the
// cut was thrown away and the session's next attempt made it again.
func TestCheckpointCommitRetried(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	wm := &commitWindowMeta{window: 2 * time.Second}
	env.WrapMeta = func(s metadata.Store) metadata.Store { wm.Store = s; return wm }
	env.Restart(t)
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Policy: "strict", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	wm.arm()
	if _, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"true"}}); err != nil {
		t.Fatalf("strict exec whose checkpoint commit met a 2 s store error window: %v", err)
	}
	failed := wm.failures()
	if failed == 0 {
		t.Fatal("no commit failed: the exec made no checkpoint, the test proves nothing")
	}
	cks, err := e.ListCheckpoints(ctx, "default", sb.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(cks) == 0 || cks[len(cks)-1].State != meta.CheckpointCommitted {
		t.Fatalf("after %d failed commits the newest checkpoint is not committed: %+v", failed, cks)
	}
}

// createWindowMeta fails the row's move to running (a created sandbox's
// record) for window from its first call once armed.
type createWindowMeta struct{ commitWindowMeta }

func (m *createWindowMeta) CommitCheckpoint(ctx context.Context, c meta.Checkpoint) (meta.Checkpoint, error) {
	return m.Store.CommitCheckpoint(ctx, c)
}

func (m *createWindowMeta) SetState(ctx context.Context, id string, to meta.State, reason string, from ...meta.State) (meta.Sandbox, error) {
	if to == meta.StateRunning && m.hit() {
		return meta.Sandbox{}, errors.New("injected: database is locked")
	}
	return m.Store.SetState(ctx, id, to, reason, from...)
}

// TestCreateRecordRetried: a create whose sandbox runs but whose row's
// move to running meets a 2 s store error window succeeds once the store
// is back, and leaves no other sandbox behind. On main the create failed
// with the sandbox running and its row "creating" — no one's until the
// next start, and the caller (a session) made another.
func TestCreateRecordRetried(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	wm := &createWindowMeta{commitWindowMeta{window: 2 * time.Second}}
	env.WrapMeta = func(s metadata.Store) metadata.Store { wm.Store = s; return wm }
	env.Restart(t)
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	wm.arm()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Policy: "none", Cold: true})
	if err != nil {
		t.Fatalf("create whose record met a 2 s store error window (%d failed): %v", wm.failures(), err)
	}
	if wm.failures() == 0 {
		t.Fatal("no record failed: the test proves nothing")
	}
	if sb.State != meta.StateRunning {
		t.Fatalf("created sandbox is %s, want running", sb.State)
	}
	infos, err := env.Driver.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].ID != sb.ID {
		t.Fatalf("the driver runs %d sandboxes (%+v), want only %s", len(infos), infos, sb.ID)
	}
}

// lostAnswerMeta applies the first CommitCheckpoint once armed and then
// answers with an error (the read after the update failed): a commit
// applied whose answer was lost.
type lostAnswerMeta struct{ commitWindowMeta }

func (m *lostAnswerMeta) CommitCheckpoint(ctx context.Context, c meta.Checkpoint) (meta.Checkpoint, error) {
	m.mu.Lock()
	lose := m.armed && m.failed == 0
	if lose {
		m.failed++
	}
	m.mu.Unlock()
	out, err := m.Store.CommitCheckpoint(ctx, c)
	if lose && err == nil {
		return c, errors.New("injected: meta scan checkpoint: database is locked")
	}
	return out, err
}

// TestCheckpointCommitAppliedAnswerLost: a strict exec's checkpoint whose row
// commit was applied but whose answer was lost is not failed by the retry
// (the second update finds the row committed): the exec succeeds, and the
// checkpoint stays committed and is uploaded. Without the re-read the
// retry met "not pending", the commit was undone, its hot copy dropped,
// and the committed row failed at its upload ("its hot copy was lost"):
// every chaos run's session then needed reconciliation.
func TestCheckpointCommitAppliedAnswerLost(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	wm := &lostAnswerMeta{}
	env.WrapMeta = func(s metadata.Store) metadata.Store { wm.Store = s; return wm }
	env.Restart(t)
	e := env.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Policy: "strict", Cold: true})
	if err != nil {
		t.Fatal(err)
	}
	wm.arm()
	if _, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"true"}}); err != nil {
		t.Fatalf("strict exec whose checkpoint commit's answer was lost: %v", err)
	}
	cks, err := e.ListCheckpoints(ctx, "default", sb.ID, true)
	if err != nil || len(cks) == 0 {
		t.Fatalf("checkpoints: %v %v", cks, err)
	}
	ck := cks[len(cks)-1]
	if wm.failures() != 1 {
		t.Fatalf("%d answers lost, want 1: the test proves nothing", wm.failures())
	}
	deadline := time.Now().Add(time.Minute)
	for {
		cur, err := env.Meta.Checkpoint(ctx, ck.ID)
		if err != nil {
			t.Fatal(err)
		}
		if cur.State != meta.CheckpointCommitted {
			t.Fatalf("checkpoint %s is %s (%s), want committed", ck.ID, cur.State, cur.Reason)
		}
		if !cur.UploadPending {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("checkpoint %s not uploaded within a minute", ck.ID)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
