package engine_test

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
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
		sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "default", Template: "minimal", Cold: cold, Metadata: md, ReservedLabels: true})
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

// reservedLookalikes are keys a caller might try for Amber's own labels:
// the exact ones, and ones that read as them.
var reservedLookalikes = []string{
	"amber.session",
	"amber.session.sandbox",
	"amber.",
	"amber.anything",
	"Amber.Session",
	"AMBER.SESSION",
	" amber.session",       // a leading space
	"amber.session ",       // a trailing space
	"\tamber.session",      // a leading tab
	"\u200bamber.session",  // a zero-width space first
	"am\u200dber.session",  // a zero-width joiner inside
	"\ufeffamber.session",  // a byte-order mark first
	"\u00a0amber.session",  // a no-break space first
	"ａｍｂｅｒ．session",        // fullwidth
	"amber\uff0esession",   // a fullwidth full stop
	"amber \u2060.session", // a space and a word joiner before the dot
}

// TestReservedLabel: the keys of Amber's own labels, in any case and
// with invisible characters or compatibility forms, are reserved; keys
// that only contain the word, or are Amber's "amber/" switches, are not.
func TestReservedLabel(t *testing.T) {
	for _, k := range reservedLookalikes {
		if !engine.ReservedLabel(k) {
			t.Errorf("ReservedLabel(%q) = false, want true", k)
		}
	}
	for _, k := range []string{"amber", "amberx.session", "amber_session", "my.amber.session", "team", "amber/public-ports", "ambe.r", "", "\u0430mber.session" /* a Cyrillic а */} {
		if engine.ReservedLabel(k) {
			t.Errorf("ReservedLabel(%q) = true, want false", k)
		}
	}
}

// TestCreateRefusesReservedLabels: a create with a key of Amber's own
// labels (amber.session: a session's Wake takes a running sandbox so
// labeled as its own), or one that reads as one, is InvalidArgument
// naming the key, and nothing is made — from the pool or cold. Amber's
// own create (ReservedLabels, the session harness's) sets them, and any
// caller may select by them (reading is open).
func TestCreateRefusesReservedLabels(t *testing.T) {
	env := enginetest.New(t, engine.Options{Pool: map[string]int{"minimal": 1}})
	e, ctx := env.Engine, ctxT(t)
	waitPool(t, e, "minimal", 1)
	for _, cold := range []bool{false, true} {
		for _, k := range reservedLookalikes {
			_, err := e.Create(ctx, engine.CreateRequest{Tenant: "acme", Template: "minimal", Cold: cold, Metadata: map[string]string{"team": "red", k: "ses-1"}})
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), strconv.Quote(k)) || !strings.Contains(err.Error(), "reserved") {
				t.Errorf("cold=%v: create with metadata key %q: %v, want InvalidArgument naming it as reserved", cold, k, err)
			}
		}
	}
	if err := engine.ValidateMetadata(map[string]string{"AMBER.session": "x"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("ValidateMetadata of a reserved key: %v", err)
	}
	if rows, err := e.List(ctx, "acme"); err != nil || len(rows) != 0 {
		t.Fatalf("refused creates made sandboxes: %d %v", len(rows), err)
	}
	md := map[string]string{"amber.session": "ses-1", "amber.session.sandbox": "1"}
	sb, err := e.Create(ctx, engine.CreateRequest{Tenant: "acme", Template: "minimal", Metadata: md, ReservedLabels: true})
	if err != nil || !maps.Equal(sb.Metadata, md) {
		t.Fatalf("Amber's own create with its labels: %+v %v", sb.Metadata, err)
	}
	rows, err := e.Find(ctx, "acme", engine.ListFilter{Metadata: map[string]string{"amber.session": "ses-1"}})
	if err != nil || len(rows) != 1 || rows[0].ID != sb.ID {
		t.Fatalf("find by amber.session: %d rows %v", len(rows), err)
	}
}
