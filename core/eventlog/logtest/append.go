package logtest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// testRoundTrip: every envelope field comes back as written; Stream, Seq
// and a zero Time are filled by the store.
func testRoundTrip(t *testing.T, e *env) {
	s := e.stream("rt")
	full := eventlog.Event{
		Tenant:        Tenant,
		Stream:        s,  // may be given if it matches
		Seq:           99, // ignored: assigned
		ID:            s + "#full",
		Type:          "logtest.full",
		Version:       7,
		Time:          time.Date(2029, 12, 31, 23, 59, 58, 654321000, time.FixedZone("X", 5*3600+1800)),
		CausationID:   "request-42",
		Payload:       json.RawMessage(`{"text":"héllo \"quoted\" <tag> & \u2028","n":12345678901234,"f":1.5,"list":[1,null,true,{"k":"v"}],"empty":{}}`),
		CheckpointRef: "ckpt-0001",
	}
	bare := ev(s, "bare", []string{"a", "b"}) // Time zero: the store's clock
	res := e.append(t, s, 0, 0, full, bare)
	if res != (eventlog.AppendResult{First: 1, Last: 2}) {
		t.Fatalf("Append = %+v, want {First:1 Last:2 Duplicate:false}", res)
	}
	got := e.readAll(t, s, 1)
	wantSeqs(t, "Read", got, 1, 2)
	wantFull := full
	wantFull.Seq = 1
	if d := sameEvent(got[0], wantFull); d != "" {
		t.Errorf("event 1: %s", d)
	}
	wantBare := bare
	wantBare.Stream, wantBare.Seq, wantBare.Time = s, 2, Epoch
	if d := sameEvent(got[1], wantBare); d != "" {
		t.Errorf("event 2 (time from the store's clock): %s", d)
	}
	// A payload that is a bare JSON value, not an object, is fine too.
	scalar := ev(s, "scalar", "just a string")
	e.append(t, s, 0, 2, scalar)
	if got := e.readAll(t, s, 3); len(got) != 1 || !jsonEqual(got[0].Payload, []byte(`"just a string"`)) {
		t.Fatalf("scalar payload read back as %s", seqList(got))
	}
}

// testGapFree: positions start at 1 and grow by one per event across
// batches of different sizes, each appended at the head it expects.
func testGapFree(t *testing.T, e *env) {
	s := e.stream("seq")
	head := uint64(0)
	for i, n := range []int{1, 3, 1, 5, 2, 10} {
		res := e.append(t, s, 0, head, evs(s, fmt.Sprintf("b%d-", i), n)...)
		if res.First != head+1 || res.Last != head+uint64(n) || res.Duplicate {
			t.Fatalf("batch %d of %d at head %d: %+v", i, n, head, res)
		}
		head = res.Last
		e.wantBounds(t, s, 1, head)
	}
	got := e.readAll(t, s, 1)
	wantSeqs(t, "Read all", got, 1, head)
	for _, ev := range got {
		if ev.Stream != s || ev.Tenant != Tenant {
			t.Fatalf("event %d has stream %q tenant %q", ev.Seq, ev.Stream, ev.Tenant)
		}
	}
}

// testEmptyStream: a stream nobody appended to has Bounds{1, 0} and reads
// empty; so does reading past the head.
func testEmptyStream(t *testing.T, e *env) {
	s := e.stream("empty")
	e.wantBounds(t, s, 1, 0)
	for _, from := range []uint64{1, 2, 1000} {
		got, err := e.store.Read(e.ctx, s, from, 10)
		if err != nil || len(got) != 0 {
			t.Fatalf("Read(empty, %d) = %d events, %v; want none, no error", from, len(got), err)
		}
	}
	if l, err := e.store.CurrentLease(e.ctx, s); err != nil || l.Epoch != 0 || l.Holder != "" {
		t.Fatalf("CurrentLease(empty) = %+v, %v; want epoch 0, no holder", l, err)
	}
	e.append(t, s, 0, 0, ev(s, "one", 1))
	got, err := e.store.Read(e.ctx, s, 2, 10)
	if err != nil || len(got) != 0 {
		t.Fatalf("Read past head = %d events, %v; want none", len(got), err)
	}
}

// testReadLimit: Read returns at most limit events, starting at from.
func testReadLimit(t *testing.T, e *env) {
	s := e.stream("limit")
	e.append(t, s, 0, 0, evs(s, "e", 10)...)
	for _, c := range []struct {
		from        uint64
		limit       int
		first, last uint64
	}{
		{1, 1, 1, 1}, {3, 4, 3, 6}, {1, 10, 1, 10}, {1, 1000, 1, 10},
		{10, 100, 10, 10}, {11, 5, 11, 10}, {5, 6, 5, 10}, {6, 5, 6, 10},
	} {
		got, err := e.store.Read(e.ctx, s, c.from, c.limit)
		if err != nil {
			t.Fatalf("Read(%d, %d): %v", c.from, c.limit, err)
		}
		wantSeqs(t, fmt.Sprintf("Read(%d, %d)", c.from, c.limit), got, c.first, c.last)
		for _, ev := range got {
			if !jsonEqual(ev.Payload, fmt.Appendf(nil, `{"i":%d}`, ev.Seq-1)) {
				t.Fatalf("event %d has payload %s", ev.Seq, ev.Payload)
			}
		}
	}
}

// testExpectedSeq: optimistic concurrency on the head, and Any.
func testExpectedSeq(t *testing.T, e *env) {
	s := e.stream("expect")
	e.append(t, s, 0, 0, ev(s, "a", 1))
	for _, exp := range []uint64{0, 2, 5} {
		_, err := e.store.Append(e.ctx, s, 0, exp, ev(s, fmt.Sprintf("bad%d", exp), 1))
		wantErr(t, err, errdefs.ErrConflict, "Append expecting %d at head 1", exp)
	}
	e.wantBounds(t, s, 1, 1)
	e.append(t, s, 0, 1, ev(s, "b", 2))
	res := e.append(t, s, 0, eventlog.Any, ev(s, "c", 3), ev(s, "d", 4))
	if res.First != 3 || res.Last != 4 {
		t.Fatalf("Append(Any) = %+v, want 3..4", res)
	}
	// The refused events were not written: appending them now lands them.
	res = e.append(t, s, 0, 4, ev(s, "bad0", 1))
	if res.First != 5 || res.Duplicate {
		t.Fatalf("re-append of a refused event = %+v, want a fresh append at 5", res)
	}
	// Any on a new stream starts it at 1.
	s2 := e.stream("expect-any")
	if res := e.append(t, s2, 0, eventlog.Any, ev(s2, "x", 1)); res.First != 1 {
		t.Fatalf("Append(Any) on a new stream = %+v", res)
	}
}

// testBatchAtomicity: a batch whose third event is bad leaves nothing.
func testBatchAtomicity(t *testing.T, e *env) {
	other := e.stream("atom-other")
	e.append(t, other, 0, 0, ev(other, "taken", "x"))
	cases := []struct {
		name string
		kind error
		bad  func(s string) eventlog.Event
	}{
		{"invalid payload", errdefs.ErrInvalidArgument, func(s string) eventlog.Event {
			x := ev(s, "e2", 0)
			x.Payload = json.RawMessage(`{"unterminated"`)
			return x
		}},
		{"no type", errdefs.ErrInvalidArgument, func(s string) eventlog.Event { x := ev(s, "e2", 0); x.Type = ""; return x }},
		{"other tenant", errdefs.ErrInvalidArgument, func(s string) eventlog.Event { x := ev(s, "e2", 0); x.Tenant = OtherTenant; return x }},
		{"names another stream", errdefs.ErrInvalidArgument, func(s string) eventlog.Event { x := ev(s, "e2", 0); x.Stream = other; return x }},
		{"repeats an id of the batch", errdefs.ErrInvalidArgument, func(s string) eventlog.Event { return ev(s, "e0", 0) }},
		{"is over MaxEnvelope", errdefs.ErrInvalidArgument, func(s string) eventlog.Event {
			return ev(s, "e2", strings.Repeat("x", eventlog.MaxEnvelope))
		}},
		{"id taken in another stream", errdefs.ErrConflict, func(s string) eventlog.Event {
			x := ev(s, "e2", "x")
			x.ID = other + "#taken"
			return x
		}},
	}
	for _, c := range cases {
		for _, existing := range []bool{false, true} {
			s := e.stream("atom")
			head := uint64(0)
			if existing {
				head = e.append(t, s, 0, 0, ev(s, "pre", 0)).Last
			}
			batch := evs(s, "e", 5)
			batch[2] = c.bad(s)
			_, err := e.store.Append(e.ctx, s, 0, head, batch...)
			wantErr(t, err, c.kind, "batch whose 3rd event %s (stream existed: %v)", c.name, existing)
			e.wantBounds(t, s, 1, head)
			if got := e.readAll(t, s, 1); len(got) != int(head) {
				t.Fatalf("%s: %d events visible after a refused batch, want %d", c.name, len(got), head)
			}
			// Events 0 and 1 of the refused batch were not stored: they
			// append as new events now.
			res := e.append(t, s, 0, head, batch[0], batch[1])
			if res.Duplicate || res.First != head+1 {
				t.Fatalf("%s: first events of a refused batch were stored (re-append: %+v)", c.name, res)
			}
		}
	}
}

// testTenancy: the first event's tenant owns the stream.
func testTenancy(t *testing.T, e *env) {
	s := e.stream("tenancy")
	e.append(t, s, 0, 0, ev(s, "a", 1))
	intruder := ev(s, "b", 2)
	intruder.Tenant = OtherTenant
	_, err := e.store.Append(e.ctx, s, 0, 1, intruder)
	wantErr(t, err, errdefs.ErrInvalidArgument, "append by another tenant")
	_, err = e.store.Append(e.ctx, s, 0, eventlog.Any, ev(s, "c", 3), intruder)
	wantErr(t, err, errdefs.ErrInvalidArgument, "batch with another tenant's event")
	e.wantBounds(t, s, 1, 1)
	// A new stream's batch must agree on the tenant too.
	s2 := e.stream("tenancy-new")
	_, err = e.store.Append(e.ctx, s2, 0, 0, ev(s2, "a", 1), func() eventlog.Event { x := ev(s2, "b", 1); x.Tenant = OtherTenant; return x }())
	wantErr(t, err, errdefs.ErrInvalidArgument, "new stream with a mixed-tenant batch")
	e.wantBounds(t, s2, 1, 0)
	// And the other tenant can own its own stream.
	s3 := e.stream("tenancy-b")
	x := ev(s3, "a", 1)
	x.Tenant = OtherTenant
	e.append(t, s3, 0, 0, x)
	if got := e.readAll(t, s3, 1); len(got) != 1 || got[0].Tenant != OtherTenant {
		t.Fatalf("stream of %s reads back %+v", OtherTenant, got)
	}
}

// testBadInput: malformed input is InvalidArgument and changes nothing.
func testBadInput(t *testing.T, e *env) {
	s := e.stream("bad")
	e.append(t, s, 0, 0, ev(s, "ok", 1))
	mod := func(f func(*eventlog.Event)) eventlog.Event { x := ev(s, "x", 1); f(&x); return x }
	badEvents := map[string]eventlog.Event{
		"empty tenant":       mod(func(x *eventlog.Event) { x.Tenant = "" }),
		"empty id":           mod(func(x *eventlog.Event) { x.ID = "" }),
		"empty type":         mod(func(x *eventlog.Event) { x.Type = "" }),
		"version 0":          mod(func(x *eventlog.Event) { x.Version = 0 }),
		"negative version":   mod(func(x *eventlog.Event) { x.Version = -1 }),
		"empty payload":      mod(func(x *eventlog.Event) { x.Payload = nil }),
		"payload not JSON":   mod(func(x *eventlog.Event) { x.Payload = json.RawMessage("not json") }),
		"two JSON values":    mod(func(x *eventlog.Event) { x.Payload = json.RawMessage("{} {}") }),
		"id with newline":    mod(func(x *eventlog.Event) { x.ID = "a\nb" }),
		"id too long":        mod(func(x *eventlog.Event) { x.ID = strings.Repeat("i", 300) }),
		"type with NUL":      mod(func(x *eventlog.Event) { x.Type = "t\x00" }),
		"names other stream": mod(func(x *eventlog.Event) { x.Stream = s + "-other" }),
	}
	for name, bad := range badEvents {
		_, err := e.store.Append(e.ctx, s, 0, eventlog.Any, bad)
		wantErr(t, err, errdefs.ErrInvalidArgument, "append with %s", name)
	}
	for name, stream := range map[string]string{"empty": "", "control char": "a\x01b", "newline": "a\nb", "too long": strings.Repeat("s", 300)} {
		_, err := e.store.Append(e.ctx, stream, 0, eventlog.Any, ev(s, "y", 1))
		wantErr(t, err, errdefs.ErrInvalidArgument, "append to stream name %s", name)
		_, err = e.store.Read(e.ctx, stream, 1, 10)
		wantErr(t, err, errdefs.ErrInvalidArgument, "read of stream name %s", name)
		_, err = e.store.Bounds(e.ctx, stream)
		wantErr(t, err, errdefs.ErrInvalidArgument, "bounds of stream name %s", name)
	}
	_, err := e.store.Append(e.ctx, s, 0, eventlog.Any)
	wantErr(t, err, errdefs.ErrInvalidArgument, "append without events")
	_, err = e.store.Append(e.ctx, s, 0, eventlog.Any, ev(s, "dup", 1), ev(s, "dup", 1))
	wantErr(t, err, errdefs.ErrInvalidArgument, "batch naming one id twice")
	for _, limit := range []int{0, -1} {
		_, err := e.store.Read(e.ctx, s, 1, limit)
		wantErr(t, err, errdefs.ErrInvalidArgument, "read with limit %d", limit)
	}
	e.wantBounds(t, s, 1, 1)
	// None of the refused ids was recorded.
	if res := e.append(t, s, 0, 1, ev(s, "x", 1), ev(s, "dup", 1)); res.Duplicate || res.First != 2 {
		t.Fatalf("ids of refused appends were recorded: %+v", res)
	}
}

// testLargeEvent: a 1 MiB payload round-trips; one whose envelope exceeds
// eventlog.MaxEnvelope is refused.
func testLargeEvent(t *testing.T, e *env) {
	s := e.stream("large")
	big := ev(s, "big", strings.Repeat("0123456789abcdef", 1<<16))
	e.append(t, s, 0, 0, big)
	got := e.readAll(t, s, 1)
	if len(got) != 1 || !jsonEqual(got[0].Payload, big.Payload) {
		t.Fatalf("1 MiB payload did not round-trip")
	}
	huge := ev(s, "huge", strings.Repeat("x", eventlog.MaxEnvelope))
	_, err := e.store.Append(e.ctx, s, 0, 1, huge)
	wantErr(t, err, errdefs.ErrInvalidArgument, "append of an event over MaxEnvelope")
	e.wantBounds(t, s, 1, 1)
}
