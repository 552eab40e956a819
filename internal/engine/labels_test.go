package engine_test

import (
	"context"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// labelsAtLogLog records, at a sandbox's first append to its stream (its
// created events: a step after it runs that may fail for a while), the
// labels its row has then.
type labelsAtLogLog struct {
	eventlog.Store
	meta   metadata.Store
	mu     sync.Mutex
	labels map[string]map[string]string
}

func (l *labelsAtLogLog) Append(ctx context.Context, stream string, epoch, expectedSeq uint64, evs ...eventlog.Event) (eventlog.AppendResult, error) {
	if id, ok := strings.CutPrefix(stream, "sandbox/"); ok {
		l.mu.Lock()
		if _, seen := l.labels[id]; !seen {
			if sb, err := l.meta.Get(ctx, id); err == nil {
				l.labels[id] = maps.Clone(sb.Metadata)
			}
		}
		l.mu.Unlock()
	}
	return l.Store.Append(ctx, stream, epoch, expectedSeq, evs...)
}

// TestCreateLabelsBeforeRunning: a sandbox's labels are in its row before
// any step of its create that may fail after it runs (its events, its
// egress run), made cold or claimed from the pool. A caller that gets an
// error then, or dies, finds it by them (the session harness does, and so
// never makes a second sandbox for the same place). On main they were set
// last, so such a sandbox ran unlabeled: no one's.
func TestCreateLabelsBeforeRunning(t *testing.T) {
	env := enginetest.New(t, engine.Options{Pool: map[string]int{"minimal": 1}})
	wm := &labelsAtLogLog{labels: map[string]map[string]string{}}
	env.WrapLog = func(s eventlog.Store) eventlog.Store { wm.Store, wm.meta = s, env.Meta; return wm }
	env.Restart(t)
	e, ctx := env.Engine, ctxT(t)
	waitPool(t, e, "minimal", 1)
	for _, cold := range []bool{false, true} {
		md := map[string]string{"amber.session": "ses-1", "cold": map[bool]string{false: "no", true: "yes"}[cold]}
		sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: cold, Metadata: md})
		if err != nil {
			t.Fatal(err)
		}
		if sb.FromPool == cold {
			t.Fatalf("cold=%v: FromPool=%v: the test does not take the path it means to", cold, sb.FromPool)
		}
		wm.mu.Lock()
		got, seen := wm.labels[sb.ID]
		wm.mu.Unlock()
		if !seen || !maps.Equal(got, md) {
			t.Fatalf("cold=%v: labels at its first event: %v (seen %v), want %v", cold, got, seen, md)
		}
		if !maps.Equal(sb.Metadata, md) {
			t.Fatalf("cold=%v: created sandbox's labels %v, want %v", cold, sb.Metadata, md)
		}
	}
}
