package eventlog

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func benchEnvelope(b *testing.B) (Event, []byte) {
	ev := Event{Tenant: "tenant-a", Stream: "session/0123456789abcdef", Seq: 12345, ID: "session/0123456789abcdef#12345",
		Type: "bench.event", Version: 1, Time: time.Now(), Payload: json.RawMessage(`{"text":"` + strings.Repeat("x", 189) + `"}`)}
	enc, err := Encode(ev)
	if err != nil {
		b.Fatal(err)
	}
	return ev, enc
}

// BenchmarkDecode: the canonical fast path (what every stored event takes).
func BenchmarkDecode(b *testing.B) {
	_, enc := benchEnvelope(b)
	for b.Loop() {
		if _, err := Decode(enc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeGeneral: encoding/json, for comparison.
func BenchmarkDecodeGeneral(b *testing.B) {
	_, enc := benchEnvelope(b)
	for b.Loop() {
		if _, err := decodeGeneral(enc[len(envelopeMagic) : len(enc)-4]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	ev, _ := benchEnvelope(b)
	for b.Loop() {
		if _, err := Encode(ev); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkContentDigest(b *testing.B) {
	ev, _ := benchEnvelope(b)
	for b.Loop() {
		ContentDigest(ev.Stream, ev)
	}
}
