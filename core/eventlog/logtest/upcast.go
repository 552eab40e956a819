package logtest

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// thingRegistry knows logtest.thing at version 3:
//
//	v1 {"name": N}  →  v2 {"title": N}  →  v3 {"title": N, "tags": []}
func thingRegistry() *eventlog.Registry {
	r := eventlog.NewRegistry()
	r.Register("logtest.thing", 3)
	r.AddUpcaster("logtest.thing", 1, func(p json.RawMessage) (json.RawMessage, error) {
		var v1 struct{ Name *string }
		if err := json.Unmarshal(p, &v1); err != nil || v1.Name == nil {
			return nil, errors.New("v1 payload without a name")
		}
		return json.Marshal(map[string]string{"title": *v1.Name})
	})
	r.AddUpcaster("logtest.thing", 2, func(p json.RawMessage) (json.RawMessage, error) {
		var v2 map[string]any
		if err := json.Unmarshal(p, &v2); err != nil {
			return nil, err
		}
		if _, ok := v2["tags"]; !ok {
			v2["tags"] = []string{}
		}
		return json.Marshal(v2)
	})
	return r
}

// testUpcasting: events written in versions 1, 2 and 3 come back from the
// store as written and lift to version 3; an unknown type or a version newer
// than the registry's is an error, not a panic and not a silent drop.
func testUpcasting(t *testing.T, e *env) {
	s := e.stream("upcast")
	thing := func(name string, version int, payload string) eventlog.Event {
		x := ev(s, name, nil)
		x.Type, x.Version, x.Payload = "logtest.thing", version, json.RawMessage(payload)
		return x
	}
	e.append(t, s, 0, 0,
		thing("v1", 1, `{"name":"a"}`),
		thing("v2", 2, `{"title":"b"}`),
		thing("v3", 3, `{"title":"c","tags":["t"]}`),
	)
	stored := e.readAll(t, s, 1)
	want := []string{`{"title":"a","tags":[]}`, `{"title":"b","tags":[]}`, `{"title":"c","tags":["t"]}`}
	reg := thingRegistry()
	for i, x := range stored {
		if x.Version != i+1 {
			t.Fatalf("event %d stored as version %d, want %d (stores keep the written version)", x.Seq, x.Version, i+1)
		}
		up, err := reg.Upcast(x)
		if err != nil {
			t.Fatalf("Upcast(event %d v%d): %v", x.Seq, x.Version, err)
		}
		if up.Version != 3 || !jsonEqual(up.Payload, []byte(want[i])) {
			t.Fatalf("event %d lifted to v%d %s, want v3 %s", x.Seq, up.Version, up.Payload, want[i])
		}
		if up.ID != x.ID || up.Seq != x.Seq || up.Stream != x.Stream {
			t.Fatalf("Upcast changed the envelope: %+v → %+v", x, up)
		}
	}
	// Lifting did not touch the stored events.
	again := e.readAll(t, s, 1)
	for i := range again {
		if again[i].Version != i+1 || !jsonEqual(again[i].Payload, stored[i].Payload) {
			t.Fatalf("event %d changed in the store after Upcast", again[i].Seq)
		}
	}

	unknown := ev(s, "unknown", 1)
	unknown.Type = "logtest.unknown"
	e.append(t, s, 0, 3, unknown, thing("v4", 4, `{"title":"d","tags":[],"colour":"red"}`), thing("bad-v1", 1, `{"nom":"x"}`))
	later := e.readAll(t, s, 4)
	for _, c := range []struct {
		x    eventlog.Event
		says string
	}{{later[0], "unknown"}, {later[1], "newer"}, {later[2], "upcast"}} {
		_, err := reg.Upcast(c.x)
		wantErr(t, err, errdefs.ErrFailedPrecondition, "Upcast of %s (%s v%d)", c.x.ID, c.x.Type, c.x.Version)
		if !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), s) {
			t.Fatalf("Upcast error %q should say %q and name the stream", err, c.says)
		}
	}
}
