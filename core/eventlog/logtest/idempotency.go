package logtest

import (
	"encoding/json"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// testIdempotency: re-sending an append whose answer was lost returns the
// original positions and changes nothing, whatever expectedSeq it carries.
func testIdempotency(t *testing.T, e *env) {
	s := e.stream("idem")
	batch := evs(s, "b", 3)
	if res := e.append(t, s, 0, 0, batch...); res != (eventlog.AppendResult{First: 1, Last: 3}) {
		t.Fatalf("first append = %+v", res)
	}
	e.append(t, s, 0, 3, ev(s, "later", 1))
	want := eventlog.AppendResult{First: 1, Last: 3, Duplicate: true}
	for _, exp := range []uint64{0, 3, 4, eventlog.Any} { // stale, stale, current, Any
		res, err := e.store.Append(e.ctx, s, 0, exp, batch...)
		if err != nil || res != want {
			t.Fatalf("re-append expecting %s = %+v, %v; want %+v", seqStr(exp), res, err, want)
		}
	}
	// A retry that set Time (say, from the first attempt) is still the
	// same append: Time is not content.
	retimed := append([]eventlog.Event(nil), batch...)
	for i := range retimed {
		retimed[i].Time = Epoch.Add(12345)
	}
	if res, err := e.store.Append(e.ctx, s, 0, 0, retimed...); err != nil || res != want {
		t.Fatalf("re-append with other times = %+v, %v; want %+v", res, err, want)
	}
	// Whitespace inside the payload is not content either.
	spaced := append([]eventlog.Event(nil), batch...)
	spaced[1].Payload = json.RawMessage("{ \"i\" :\n 1 }")
	if res, err := e.store.Append(e.ctx, s, 0, 0, spaced...); err != nil || res != want {
		t.Fatalf("re-append with reformatted payload = %+v, %v; want %+v", res, err, want)
	}
	// A single event of the batch re-sent alone keeps its own position.
	if res, err := e.store.Append(e.ctx, s, 0, 0, batch[1]); err != nil || res != (eventlog.AppendResult{First: 2, Last: 2, Duplicate: true}) {
		t.Fatalf("re-append of event 2 alone = %+v, %v", res, err)
	}
	e.wantBounds(t, s, 1, 4)
	got := e.readAll(t, s, 1)
	wantSeqs(t, "after re-appends", got, 1, 4)
	for i, ev := range got[:3] {
		if ev.ID != batch[i].ID || !ev.Time.Equal(Epoch) {
			t.Fatalf("event %d is %s at %v after re-appends, want %s at %v", ev.Seq, ev.ID, ev.Time, batch[i].ID, Epoch)
		}
	}
}

// testIdempotencyConflicts: an id is bound to its content for ever.
func testIdempotencyConflicts(t *testing.T, e *env) {
	s := e.stream("idem-conflict")
	orig := ev(s, "x", map[string]string{"v": "1"})
	orig.CausationID = "cause"
	orig.CheckpointRef = "ck"
	e.append(t, s, 0, 0, orig, ev(s, "y", 2))
	variants := map[string]func(*eventlog.Event){
		"payload":    func(x *eventlog.Event) { x.Payload = json.RawMessage(`{"v":"2"}`) },
		"type":       func(x *eventlog.Event) { x.Type = "logtest.other" },
		"version":    func(x *eventlog.Event) { x.Version = 2 },
		"causation":  func(x *eventlog.Event) { x.CausationID = "other" },
		"checkpoint": func(x *eventlog.Event) { x.CheckpointRef = "" },
		"tenant":     func(x *eventlog.Event) { x.Tenant = OtherTenant },
	}
	for name, f := range variants {
		x := orig
		f(&x)
		_, err := e.store.Append(e.ctx, s, 0, eventlog.Any, x)
		kind := errdefs.ErrConflict
		if name == "tenant" { // the stream's owner check may come first
			if err != nil && errdefs.IsInvalidArgument(err) {
				continue
			}
		}
		wantErr(t, err, kind, "same id, different %s", name)
	}
	// The same id and content on another stream is another event: Conflict.
	s2 := e.stream("idem-conflict-2")
	_, err := e.store.Append(e.ctx, s2, 0, eventlog.Any, orig)
	wantErr(t, err, errdefs.ErrConflict, "an id of %s appended to %s", s, s2)
	e.wantBounds(t, s2, 1, 0)
	// Mixing an appended id with new ones, in either order, is a Conflict
	// and writes nothing.
	fresh := ev(s, "fresh", 3)
	for _, batch := range [][]eventlog.Event{{orig, fresh}, {fresh, orig}} {
		_, err := e.store.Append(e.ctx, s, 0, eventlog.Any, batch...)
		wantErr(t, err, errdefs.ErrConflict, "batch mixing an existing id and a new one")
	}
	e.wantBounds(t, s, 1, 2)
	if res := e.append(t, s, 0, 2, fresh); res.Duplicate || res.First != 3 {
		t.Fatalf("new id of a refused mixed batch was stored: %+v", res)
	}
}
