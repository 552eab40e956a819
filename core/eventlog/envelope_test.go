package eventlog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

func sampleEvents() []Event {
	return []Event{
		{Tenant: "t", Stream: "session/1", Seq: 1, ID: "e1", Type: "session.started", Version: 1,
			Time: time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC), Payload: json.RawMessage(`{}`)},
		{Tenant: "acme", Stream: "sandbox/x", Seq: 1 << 40, ID: "e-ü-\u2028", Type: "sandbox.checkpointed", Version: 12,
			Time: time.Date(2001, 2, 3, 4, 5, 6, 0, time.FixedZone("", -7*3600)), CausationID: "req-9",
			Payload: json.RawMessage(`{"text":"<b>&amp;</b>","n":[1,2.5,-3e7,null,true],"deep":{"a":{"b":{}}}}`), CheckpointRef: "ck-1"},
		{Tenant: "t", Stream: "audit/t", Seq: 3, ID: "x", Type: "y", Version: 1, Payload: json.RawMessage(`"scalar"`)},
	}
}

// diffEvents compares two events field by field (Time by instant, payload
// by JSON value).
func diffEvents(got, want Event) string {
	g, w := got, want
	g.Time, w.Time, g.Payload, w.Payload = time.Time{}, time.Time{}, nil, nil
	var d []string
	if !reflect.DeepEqual(g, w) {
		d = append(d, fmt.Sprintf("envelope %+v, want %+v", g, w))
	}
	if !got.Time.Equal(want.Time) {
		d = append(d, fmt.Sprintf("time %v, want %v", got.Time, want.Time))
	}
	if !jsonSame(got.Payload, want.Payload) {
		d = append(d, fmt.Sprintf("payload %s, want %s", got.Payload, want.Payload))
	}
	return strings.Join(d, "; ")
}

func jsonSame(a, b []byte) bool {
	var va, vb any
	da, db := json.NewDecoder(bytes.NewReader(a)), json.NewDecoder(bytes.NewReader(b))
	da.UseNumber()
	db.UseNumber()
	return da.Decode(&va) == nil && db.Decode(&vb) == nil && reflect.DeepEqual(va, vb)
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, ev := range sampleEvents() {
		enc, err := Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(enc, []byte("AEV1{")) {
			t.Fatalf("envelope starts %q", enc[:8])
		}
		got, err := Decode(enc)
		if err != nil {
			t.Fatalf("Decode(Encode(%s)): %v", ev.ID, err)
		}
		if d := diffEvents(got, ev); d != "" {
			t.Fatalf("%s: %s", ev.ID, d)
		}
	}
}

// Every single-bit flip and every truncation of an envelope is caught.
func TestDecodeDetectsDamage(t *testing.T) {
	enc, err := Encode(sampleEvents()[1])
	if err != nil {
		t.Fatal(err)
	}
	for i := range enc {
		for bit := range 8 {
			b := bytes.Clone(enc)
			b[i] ^= 1 << bit
			if _, err := Decode(b); !errdefs.IsDataLoss(err) {
				t.Fatalf("flip of bit %d of byte %d: %v, want DataLoss", bit, i, err)
			}
		}
	}
	for n := range len(enc) {
		if _, err := Decode(enc[:n]); !errdefs.IsDataLoss(err) {
			t.Fatalf("truncated to %d bytes: %v, want DataLoss", n, err)
		}
	}
	if _, err := Decode(append(bytes.Clone(enc), 0)); !errdefs.IsDataLoss(err) {
		t.Fatalf("extra byte: %v, want DataLoss", err)
	}
}

// A correctly checksummed body that is not a valid stored event is DataLoss.
func TestDecodeRejectsBadBodies(t *testing.T) {
	valid := `"tenant":"t","stream":"s","seq":1,"id":"i","type":"x","version":1,"payload":{}`
	for name, body := range map[string]string{
		"not JSON":      `{"tenant":`,
		"not an object": `[1,2]`,
		"unknown field": `{` + valid + `,"extra":1}`,
		"trailing data": `{` + valid + `} {}`,
		"seq 0":         strings.Replace(`{`+valid+`}`, `"seq":1`, `"seq":0`, 1),
		"no tenant":     strings.Replace(`{`+valid+`}`, `"tenant":"t"`, `"tenant":""`, 1),
		"no stream":     strings.Replace(`{`+valid+`}`, `"stream":"s"`, `"stream":""`, 1),
		"no id":         strings.Replace(`{`+valid+`}`, `"id":"i"`, `"id":""`, 1),
		"no type":       strings.Replace(`{`+valid+`}`, `"type":"x"`, `"type":""`, 1),
		"version 0":     strings.Replace(`{`+valid+`}`, `"version":1`, `"version":0`, 1),
		"no payload":    strings.Replace(`{`+valid+`}`, `,"payload":{}`, ``, 1),
		"negative seq":  strings.Replace(`{`+valid+`}`, `"seq":1`, `"seq":-1`, 1),
		"bad time":      `{` + valid + `,"time":"yesterday"}`,
	} {
		if _, err := Decode(seal([]byte(body))); !errdefs.IsDataLoss(err) {
			t.Errorf("%s: %v, want DataLoss", name, err)
		}
	}
	if _, err := Decode(seal([]byte(`{` + valid + `}`))); err != nil {
		t.Fatalf("the valid body itself: %v", err)
	}
	if _, err := Decode(append([]byte("AEV1"), make([]byte, MaxEnvelope)...)); !errdefs.IsDataLoss(err) {
		t.Fatalf("oversize envelope: %v", err)
	}
}

func TestEncodeErrors(t *testing.T) {
	ev := sampleEvents()[0]
	ev.Payload = json.RawMessage(`"` + strings.Repeat("x", MaxEnvelope) + `"`)
	if _, err := Encode(ev); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("oversize: %v, want InvalidArgument", err)
	}
	ev.Payload = json.RawMessage(`{not json`)
	if _, err := Encode(ev); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("invalid payload: %v, want InvalidArgument", err)
	}
}

func TestContentDigest(t *testing.T) {
	base := sampleEvents()[1]
	d := ContentDigest("s", base)
	if len(d) != 64 {
		t.Fatalf("digest %q", d)
	}
	same := map[string]func(*Event){
		"seq":          func(e *Event) { e.Seq = 99 },
		"time":         func(e *Event) { e.Time = time.Now() },
		"stream field": func(e *Event) { e.Stream = "ignored: the stream argument counts" },
		"payload spacing": func(e *Event) {
			e.Payload = json.RawMessage(" {\"text\" : \"<b>&amp;</b>\", \"n\":[1, 2.5, -3e7, null, true], \"deep\":{\"a\":{\"b\":{ }}}}\n")
		},
	}
	for name, f := range same {
		e := base
		f(&e)
		if ContentDigest("s", e) != d {
			t.Errorf("digest changed with %s", name)
		}
	}
	differ := map[string]func(*Event){
		"tenant":     func(e *Event) { e.Tenant += "x" },
		"id":         func(e *Event) { e.ID += "x" },
		"type":       func(e *Event) { e.Type += "x" },
		"version":    func(e *Event) { e.Version++ },
		"causation":  func(e *Event) { e.CausationID = "" },
		"checkpoint": func(e *Event) { e.CheckpointRef = "" },
		"payload":    func(e *Event) { e.Payload = json.RawMessage(`{"text":"other"}`) },
		"key order": func(e *Event) {
			e.Payload = json.RawMessage(`{"n":[1,2.5,-3e7,null,true],"text":"<b>&amp;</b>","deep":{"a":{"b":{}}}}`)
		},
	}
	for name, f := range differ {
		e := base
		f(&e)
		if ContentDigest("s", e) == d {
			t.Errorf("digest did not change with %s", name)
		}
	}
	if ContentDigest("s2", base) == d {
		t.Error("digest did not change with the stream")
	}
	// Fields are length-prefixed: moving a boundary changes the digest.
	a, b := base, base
	a.ID, a.Type = "ab", "c"
	b.ID, b.Type = "a", "bc"
	if ContentDigest("s", a) == ContentDigest("s", b) {
		t.Error("id/type boundary is ambiguous")
	}
	// Invalid JSON does not panic and still hashes its bytes.
	a.Payload, b.Payload = json.RawMessage("{x"), json.RawMessage("{y")
	if ContentDigest("s", a) == ContentDigest("s", b) {
		t.Error("invalid payloads hash alike")
	}
}

func TestValidateNew(t *testing.T) {
	ok := Event{Tenant: "t", ID: "i", Type: "x", Version: 1, Payload: json.RawMessage(`{}`)}
	if err := ValidateNew("s", ok); err != nil {
		t.Fatal(err)
	}
	withStream := ok
	withStream.Stream = "s"
	if err := ValidateNew("s", withStream); err != nil {
		t.Fatalf("event naming its own stream: %v", err)
	}
	bad := map[string]func(*Event){
		"no tenant":      func(e *Event) { e.Tenant = "" },
		"no id":          func(e *Event) { e.ID = "" },
		"no type":        func(e *Event) { e.Type = "" },
		"long id":        func(e *Event) { e.ID = strings.Repeat("a", 257) },
		"NUL in tenant":  func(e *Event) { e.Tenant = "a\x00" },
		"newline in id":  func(e *Event) { e.ID = "a\nb" },
		"other stream":   func(e *Event) { e.Stream = "t" },
		"version 0":      func(e *Event) { e.Version = 0 },
		"no payload":     func(e *Event) { e.Payload = nil },
		"bad payload":    func(e *Event) { e.Payload = json.RawMessage(`{`) },
		"payload spaces": func(e *Event) { e.Payload = json.RawMessage(`   `) },
	}
	for name, f := range bad {
		e := ok
		f(&e)
		if err := ValidateNew("s", e); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if err := ValidateNew("", ok); !errdefs.IsInvalidArgument(err) {
		t.Errorf("empty stream: %v", err)
	}
	long := ok
	long.ID = strings.Repeat("a", 256)
	if err := ValidateNew("s", long); err != nil {
		t.Errorf("256-byte id: %v", err)
	}
}

func TestValidateStreamName(t *testing.T) {
	for _, s := range []string{"s", "session/abc-123", "audit/tenant a", "ü/😀", strings.Repeat("s", 256)} {
		if err := ValidateStreamName(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	for _, s := range []string{"", strings.Repeat("s", 257), "a\x00", "a\tb", "a\x7f", "\n"} {
		if err := ValidateStreamName(s); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v, want InvalidArgument", s, err)
		}
	}
}
