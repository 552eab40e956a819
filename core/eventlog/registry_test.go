package eventlog

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
)

func testRegistry() *Registry {
	r := NewRegistry()
	r.Register("note", 3)
	r.AddUpcaster("note", 1, func(p json.RawMessage) (json.RawMessage, error) { // {"t":x} → {"text":x}
		var v struct{ T string }
		if err := json.Unmarshal(p, &v); err != nil {
			return nil, err
		}
		return json.Marshal(map[string]string{"text": v.T})
	})
	r.AddUpcaster("note", 2, func(p json.RawMessage) (json.RawMessage, error) { // adds "lang"
		var v map[string]any
		if err := json.Unmarshal(p, &v); err != nil {
			return nil, err
		}
		v["lang"] = "en"
		return json.Marshal(v)
	})
	return r
}

func TestUpcastChain(t *testing.T) {
	r := testRegistry()
	for _, c := range []struct {
		version int
		in, out string
	}{
		{1, `{"t":"hi"}`, `{"text":"hi","lang":"en"}`},
		{2, `{"text":"hi"}`, `{"text":"hi","lang":"en"}`},
		{3, `{"text":"hi","lang":"fr"}`, `{"text":"hi","lang":"fr"}`}, // current: untouched
	} {
		ev := Event{Stream: "s", Seq: 4, ID: "i", Type: "note", Version: c.version, Payload: json.RawMessage(c.in)}
		got, err := r.Upcast(ev)
		if err != nil {
			t.Fatalf("v%d: %v", c.version, err)
		}
		if got.Version != 3 || !jsonSame(got.Payload, []byte(c.out)) || got.ID != "i" || got.Seq != 4 {
			t.Fatalf("v%d lifted to %+v, want v3 %s", c.version, got, c.out)
		}
		if string(ev.Payload) != c.in {
			t.Fatalf("Upcast modified its argument")
		}
	}
	if v, ok := r.Current("note"); !ok || v != 3 {
		t.Fatalf("Current(note) = %d, %v", v, ok)
	}
	if _, ok := r.Current("nope"); ok {
		t.Fatal("Current of an unknown type")
	}
}

func TestUpcastErrors(t *testing.T) {
	r := testRegistry()
	r.Register("gappy", 3) // no upcaster from 1
	r.AddUpcaster("gappy", 2, func(p json.RawMessage) (json.RawMessage, error) { return p, nil })
	r.Register("failing", 2)
	r.AddUpcaster("failing", 1, func(json.RawMessage) (json.RawMessage, error) { return nil, errors.New("boom") })
	r.Register("garbage", 2)
	r.AddUpcaster("garbage", 1, func(json.RawMessage) (json.RawMessage, error) { return json.RawMessage("{nope"), nil })
	for _, c := range []struct {
		typ     string
		version int
		says    string
	}{
		{"unknown", 1, "unknown"},
		{"note", 4, "newer"},
		{"gappy", 1, "no upcaster"},
		{"failing", 1, "boom"},
		{"garbage", 1, "invalid JSON"},
	} {
		ev := Event{Stream: "session/9", Seq: 17, ID: "i", Type: c.typ, Version: c.version, Payload: json.RawMessage(`{}`)}
		_, err := r.Upcast(ev)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("%s v%d: %v, want FailedPrecondition", c.typ, c.version, err)
		}
		if msg := err.Error(); !strings.Contains(msg, c.says) || !strings.Contains(msg, "session/9/17") {
			t.Fatalf("%s v%d: %q should say %q and name session/9/17", c.typ, c.version, msg, c.says)
		}
	}
}

func TestRegisterRejectsVersionZero(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Register(x, 0) did not panic")
		}
	}()
	NewRegistry().Register("x", 0)
}

// The registry is safe for concurrent registration and use (run with -race).
func TestRegistryConcurrent(t *testing.T) {
	r := testRegistry()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 200 {
				if i%2 == 0 {
					r.Register("other", 1+j%3)
					r.AddUpcaster("other", 1, func(p json.RawMessage) (json.RawMessage, error) { return p, nil })
					continue
				}
				if _, err := r.Upcast(Event{Type: "note", Version: 1, Payload: json.RawMessage(`{"t":"x"}`)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
