package session

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/host/faults"
	"github.com/amber-run/amber/lib/failpoint"
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

// seqModel fails its calls with errs in turn, then answers as m.
type seqModel struct {
	m     Model
	errs  []error
	calls atomic.Int32
}

func (f *seqModel) Complete(ctx context.Context, req Request, onDelta func(string)) (Response, error) {
	if n := int(f.calls.Add(1)); n <= len(f.errs) {
		return Response{}, f.errs[n-1]
	}
	return f.m.Complete(ctx, req, onDelta)
}

// runSeq posts a user message to a new session whose model fails with errs
// in turn (the Manager's first retry after base), and returns the model and
// how long the session took to answer (0: no answer within limit).
func runSeq(t *testing.T, errs []error, base, limit time.Duration) (*seqModel, time.Duration) {
	t.Helper()
	e := newTestEnv(t, []ScriptTurn{{Text: "done"}})
	fm := &seqModel{m: e.model, errs: errs}
	h := e.harness(nil)
	h.Models = func(ModelConfig) (Model, error) { return fm, nil }
	m := NewManager(h)
	m.backoff = base
	defer m.Close()
	ctx := context.Background()
	s, err := m.Create(ctx, "acme", Definition{Model: ModelConfig{Adapter: "scripted"}, Template: "minimal", Policy: PolicyStrict})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := m.Post(ctx, "acme", s.ID, EventUserMessage, json.RawMessage(`{"text":"go"}`), "go"); err != nil {
		t.Fatal(err)
	}
	for time.Since(start) < limit {
		if len(e.events(s.ID, EventAssistantMessage)) > 0 {
			return fm, time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fm, 0
}

// TestWakeLastingTriesCountedApart: the m.retries tries a lasting error
// gets are counted from the lasting errors alone — on main the attempt
// counter also counted the transient failures before them (a store error
// window), so a session whose store came back with one refused call left
// (2 transient + 1 lasting) stopped retrying and waited for a client.
func TestWakeLastingTriesCountedApart(t *testing.T) {
	tr := errors.New("dial tcp: connection refused")
	la := errdefs.InvalidArgumentf("the model refused the request")
	fm, took := runSeq(t, []error{tr, tr, la, la}, 10*time.Millisecond, 5*time.Second)
	if took == 0 {
		t.Fatalf("2 transient then 2 lasting errors (under the %d lasting tries): the session did not answer (%d model calls)", 3, fm.calls.Load())
	}
	// And 3 lasting errors still stop it (after 3 lasting calls).
	fm, took = runSeq(t, []error{tr, la, la, la}, 10*time.Millisecond, 2*time.Second)
	if took != 0 || fm.calls.Load() != 4 {
		t.Fatalf("3 lasting errors: answered=%v after %d model calls, want no answer after 4", took != 0, fm.calls.Load())
	}
}

// TestWakeBackoffBounded: a session whose Wake failed six times in a row
// (a store error window) is retried 1×, then every 2× the base, not with
// a doubling backoff (1, 2, 4, 8, 16 s on main: the chaos run's 58.5 s
// p99 and its sessions woken by a daemon restart). With a 100 ms base the
// six retries take 1.1 s here, 6.1 s on main.
func TestWakeBackoffBounded(t *testing.T) {
	tr := errors.New("dial tcp: connection refused")
	errs := []error{tr, tr, tr, tr, tr, tr}
	fm, took := runSeq(t, errs, 100*time.Millisecond, 20*time.Second)
	if took == 0 {
		t.Fatalf("the session did not answer after %d transient errors (%d calls)", len(errs), fm.calls.Load())
	}
	if took > 4*time.Second {
		t.Fatalf("the session answered %v after its first failure (6 retries); want about 1.1 s (1 × 100 ms + 5 × 200 ms)", took.Round(time.Millisecond))
	}
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 2 * time.Second, 2 * time.Second} {
		if got := retryDelay(i, time.Second, time.Duration(i)*2*time.Second); got != want {
			t.Errorf("retryDelay(%d, 1s) = %v, want %v", i, got, want)
		}
	}
	// Past a minute of failures (a model down): every 30 s, not 300
	// error events in ten minutes.
	if got := retryDelay(40, time.Second, 61*time.Second); got != 30*time.Second {
		t.Errorf("retryDelay after a minute of failures = %v, want 30s", got)
	}
}

// TestLeaseRenewalHangRecovered: a session whose lease renewal hangs (the
// eventlog.lease failpoint armed with failpoint.Hang: a log that stopped
// answering) goes on by itself: the renewal ends at its deadline (a third
// of the lease's TTL), the Wake fails, and the Manager's next Wake
// finishes the session — no client event, no restart. On main the renewal
// had no deadline and the session waited for ever.
func TestLeaseRenewalHangRecovered(t *testing.T) {
	e := newTestEnv(t, []ScriptTurn{{Text: "done"}})
	fps := failpoint.New()
	var hung atomic.Int32
	fps.ArmCtx(faults.EventlogLease, 2, false, func(ctx context.Context, subject string) error {
		hung.Add(1)
		return failpoint.Hang(nil)(ctx, subject)
	})
	h := e.harness(nil)
	h.Log = faults.Log(e.log, fps)
	h.LeaseTTL = 600 * time.Millisecond
	m := NewManager(h)
	m.backoff = 50 * time.Millisecond
	defer m.Close()
	ctx := context.Background()
	s, err := m.Create(ctx, "acme", Definition{Model: ModelConfig{Adapter: "scripted"}, Template: "minimal", Policy: PolicyStrict})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Post(ctx, "acme", s.ID, EventUserMessage, json.RawMessage(`{"text":"go"}`), "go"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for len(e.events(s.ID, EventAssistantMessage)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the session did not finish within 15 s of a hung lease call (hung: %d)", hung.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if hung.Load() != 1 {
		t.Fatalf("%d lease calls hung, want 1: the failpoint is not on the session's path", hung.Load())
	}
}
