package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/lib/failpoint"
)

// fullLog fails the next n appends of events of type typ with ENOSPC, as
// the event log did in the chaos run (a full disk for a while).
type fullLog struct {
	eventlog.Store
	typ   string
	n     atomic.Int32
	fails atomic.Int32
}

func failAppends(s eventlog.Store, typ string, n int32) *fullLog {
	l := &fullLog{Store: s, typ: typ}
	l.n.Store(n)
	return l
}

func (l *fullLog) Append(ctx context.Context, stream string, epoch, expectedSeq uint64, events ...eventlog.Event) (eventlog.AppendResult, error) {
	if len(events) > 0 && events[0].Type == l.typ && l.n.Add(-1) >= 0 {
		l.fails.Add(1)
		return eventlog.AppendResult{}, fmt.Errorf("append: write events.db-wal: %w", syscall.ENOSPC)
	}
	return l.Store.Append(ctx, stream, epoch, expectedSeq, events...)
}

// TestWakeReusesSandboxWhoseRecordFailed: the append of
// session.sandbox_created fails (the log full, twice); the Manager's
// retried Wakes take the sandbox the first one made instead of making
// another, and the session ends as an uninterrupted run does with one
// sandbox. On main every retried Wake made a new sandbox and the earlier
// ones kept running (the chaos replay of seed 152339).
func TestWakeReusesSandboxWhoseRecordFailed(t *testing.T) {
	for _, policy := range []string{PolicyStrict, PolicyFast} {
		t.Run(policy, func(t *testing.T) {
			wantConv, wantBox := baseline(t, policy)
			e := newTestEnv(t, script)
			id := e.create(Definition{Model: ModelConfig{Adapter: "scripted"}, Policy: policy})
			h := e.harness(nil)
			fl := failAppends(e.log, EventSandboxCreated, 2)
			h.Log = fl
			m := NewManager(h)
			m.backoff = 10 * time.Millisecond
			defer m.Close()
			ctx := context.Background()
			if _, err := m.Post(ctx, "acme", id, EventUserMessage, json.RawMessage(`{"text":"go"}`), "go"); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(15 * time.Second)
			for e.state(id).Status != StatusIdle || e.state(id).Calls < scriptCalls {
				if time.Now().After(deadline) {
					t.Fatalf("the session did not finish within 15 s (status %s, %d model calls)", e.state(id).Status, e.state(id).Calls)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if fl.fails.Load() != 2 {
				t.Fatalf("%d sandbox_created appends failed, want 2: the fault is not on the session's path", fl.fails.Load())
			}
			if live := e.boxes.live(); len(live) != 1 || live[0] != e.state(id).Sandbox {
				t.Fatalf("sandboxes left %v, want only the session's %s", live, e.state(id).Sandbox)
			}
			if got := conversation(t, e.state(id)); got != wantConv {
				t.Fatalf("conversation differs from the uninterrupted run:\n%s\nwant\n%s", got, wantConv)
			}
			if got := e.sandboxState(id); got != wantBox {
				t.Fatalf("sandbox differs from the uninterrupted run:\n%s\nwant\n%s", got, wantBox)
			}
		})
	}
}

// TestWakeReusesSandboxAfterCrash: the daemon dies after the session's
// sandbox was made and before the log named it; the next daemon's Wake
// finds it by its labels and takes it (one sandbox, the run as an
// uninterrupted one). If it was lost meanwhile, it is destroyed and a new
// one made: still one left.
func TestWakeReusesSandboxAfterCrash(t *testing.T) {
	for _, lost := range []bool{false, true} {
		t.Run(fmt.Sprintf("lost=%v", lost), func(t *testing.T) {
			wantConv, wantBox := baseline(t, PolicyStrict)
			e := newTestEnv(t, script)
			id := e.create(Definition{Model: ModelConfig{Adapter: "scripted"}, Policy: PolicyStrict})
			e.post(id, EventUserMessage, UserMessage{Text: "go"})
			fp := failpoint.New()
			fp.Arm(FPSandboxBeforeRecord, 1, failpoint.ErrCrash)
			if _, err := e.harness(fp).Wake(context.Background(), id); !errors.Is(err, failpoint.ErrCrash) {
				t.Fatalf("first harness: %v, want the crash", err)
			}
			made := e.boxes.live()
			if len(made) != 1 || e.state(id).Sandbox != "" {
				t.Fatalf("after the crash: sandboxes %v, the log names %q; want one, unnamed", made, e.state(id).Sandbox)
			}
			if lost {
				e.boxes.lose()
			}
			if st, err := e.harness(nil).Wake(context.Background(), id); err != nil || st != StatusIdle {
				t.Fatalf("next harness: %v %v", st, err)
			}
			sbx := e.state(id).Sandbox
			if live := e.boxes.live(); len(live) != 1 || live[0] != sbx {
				t.Fatalf("sandboxes left %v, want only the session's %s", live, sbx)
			}
			if reused := sbx == made[0]; reused == lost {
				t.Fatalf("the session's sandbox is %s, the crashed Wake made %s (lost: %v)", sbx, made[0], lost)
			}
			if got := conversation(t, e.state(id)); got != wantConv {
				t.Fatalf("conversation differs from the uninterrupted run:\n%s\nwant\n%s", got, wantConv)
			}
			if got := e.sandboxState(id); got != wantBox {
				t.Fatalf("sandbox differs from the uninterrupted run:\n%s\nwant\n%s", got, wantBox)
			}
		})
	}
}

// TestRecoverReusesReplacementWhoseRecordFailed: a strict session's
// sandbox is lost before its first cut (the cut failed), so the next Wake
// replaces it with a new one; the record of the replacement
// (session.sandbox_restored) fails, and the Wake after takes that
// replacement instead of making a third sandbox. The failed record fails
// the Wake (retried): before, an error of the log while recovering was
// taken for a sandbox that could not be brought back, and the session
// waited for a person (needs-reconciliation).
func TestRecoverReusesReplacementWhoseRecordFailed(t *testing.T) {
	wantConv, wantBox := baseline(t, PolicyStrict)
	e := newTestEnv(t, script)
	id := e.create(Definition{Model: ModelConfig{Adapter: "scripted"}, Policy: PolicyStrict})
	e.post(id, EventUserMessage, UserMessage{Text: "go"})
	h := e.harness(nil)
	h.Boxes = &failingCutBoxes{fakeBoxes: e.boxes, n: 1}
	if _, err := h.Wake(context.Background(), id); err == nil {
		t.Fatal("the Wake whose first cut failed succeeded")
	}
	first := e.state(id).Sandbox
	e.boxes.lose()
	h = e.harness(nil)
	fl := failAppends(e.log, EventSandboxRestored, 1)
	h.Log = fl
	if _, err := h.Wake(context.Background(), id); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("the Wake whose replacement was not recorded: %v, want ENOSPC", err)
	}
	if st, err := h.Wake(context.Background(), id); err != nil || st != StatusIdle {
		t.Fatalf("next Wake: %v %v", st, err)
	}
	sbx := e.state(id).Sandbox
	if live := e.boxes.live(); len(live) != 1 || live[0] != sbx || sbx == first {
		t.Fatalf("sandboxes left %v, the session's %s (the lost one %s): want only the session's replacement", live, sbx, first)
	}
	if e.boxes.n != 2 {
		t.Fatalf("%d sandboxes made, want 2 (the lost one and one replacement)", e.boxes.n)
	}
	if got := conversation(t, e.state(id)); got != wantConv {
		t.Fatalf("conversation differs from the uninterrupted run:\n%s\nwant\n%s", got, wantConv)
	}
	if got := e.sandboxState(id); got != wantBox {
		t.Fatalf("sandbox differs from the uninterrupted run:\n%s\nwant\n%s", got, wantBox)
	}
}

// TestTerminateDestroysUnrecordedSandbox: a session terminated after a
// crash left a sandbox the log does not name leaves no sandbox behind.
func TestTerminateDestroysUnrecordedSandbox(t *testing.T) {
	e := newTestEnv(t, script)
	id := e.create(Definition{Model: ModelConfig{Adapter: "scripted"}, Policy: PolicyStrict})
	e.post(id, EventUserMessage, UserMessage{Text: "go"})
	fp := failpoint.New()
	fp.Arm(FPSandboxBeforeRecord, 1, failpoint.ErrCrash)
	if _, err := e.harness(fp).Wake(context.Background(), id); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatalf("first harness: %v, want the crash", err)
	}
	e.post(id, EventTerminate, Terminate{Reason: "done with it"})
	if st, err := e.harness(nil).Wake(context.Background(), id); err != nil || st != StatusTerminated {
		t.Fatalf("terminated: %v %v", st, err)
	}
	if live := e.boxes.live(); len(live) != 0 {
		t.Fatalf("sandboxes left after termination: %v", live)
	}
}
