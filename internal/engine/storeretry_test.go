package engine_test

import (
	"context"
	"errors"
	"sync"
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

func (m *commitWindowMeta) CommitCheckpoint(ctx context.Context, c meta.Checkpoint) (meta.Checkpoint, error) {
	m.mu.Lock()
	if m.armed && m.until.IsZero() {
		m.until = time.Now().Add(m.window)
	}
	fail := m.armed && time.Now().Before(m.until)
	if fail {
		m.failed++
	}
	m.mu.Unlock()
	if fail {
		return c, errors.New("injected: database is locked")
	}
	return m.Store.CommitCheckpoint(ctx, c)
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
	wm.mu.Lock()
	wm.armed = true
	wm.mu.Unlock()
	if _, err := e.Exec(ctx, "default", sb.ID, sandbox.ExecSpec{Args: []string{"true"}}); err != nil {
		t.Fatalf("strict exec whose checkpoint commit met a 2 s store error window: %v", err)
	}
	wm.mu.Lock()
	failed := wm.failed
	wm.mu.Unlock()
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
