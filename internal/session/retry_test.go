package session

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// flakyModel fails its first n calls with err, then answers as m.
type flakyModel struct {
	m     Model
	n     int32
	calls atomic.Int32
	err   error
}

func (f *flakyModel) Complete(ctx context.Context, req Request, onDelta func(string)) (Response, error) {
	if f.calls.Add(1) <= f.n {
		return Response{}, f.err
	}
	return f.m.Complete(ctx, req, onDelta)
}

// TestWakeRetriedWhileTransient: a session whose harness fails for longer
// than the three quick retries (a store or a model unreachable for a while)
// goes on by itself once the failure passes — no client event, no restart
// (the chaos harness had to restart the daemon for that: issue 8, defect
// 5). An error that retrying cannot cure is tried m.retries times only.
func TestWakeRetriedWhileTransient(t *testing.T) {
	for _, c := range []struct {
		name      string
		err       error
		wantCalls int32 // model calls when the session stops retrying (0: it finishes)
	}{
		{"transient", errors.New("dial tcp: connection refused"), 0},
		{"lasting", errdefs.InvalidArgumentf("the model refused the request"), 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newTestEnv(t, []ScriptTurn{{Text: "done"}})
			fm := &flakyModel{m: e.model, n: 6, err: c.err}
			h := e.harness(nil)
			h.Models = func(ModelConfig) (Model, error) { return fm, nil }
			m := NewManager(h)
			m.backoff = 10 * time.Millisecond
			defer m.Close()
			ctx := context.Background()
			s, err := m.Create(ctx, "acme", Definition{Model: ModelConfig{Adapter: "scripted"}, Template: "minimal", Policy: PolicyStrict})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.Post(ctx, "acme", s.ID, EventUserMessage, json.RawMessage(`{"text":"go"}`), "go"); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				if len(e.events(s.ID, EventAssistantMessage)) > 0 || c.wantCalls > 0 && fm.calls.Load() >= c.wantCalls {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			done := len(e.events(s.ID, EventAssistantMessage)) > 0
			if c.wantCalls == 0 {
				if !done {
					t.Fatalf("the session did not finish after %d failed model calls (%d calls)", fm.n, fm.calls.Load())
				}
				return
			}
			time.Sleep(500 * time.Millisecond) // long past the last backoff
			if done || fm.calls.Load() != c.wantCalls {
				t.Fatalf("a lasting error: finished=%v after %d calls, want %d calls and no answer", done, fm.calls.Load(), c.wantCalls)
			}
		})
	}
}
