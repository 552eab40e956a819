package eventlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"reflect"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// seal wraps body in the envelope framing with a correct checksum, so that
// fuzzed bytes reach the JSON decoding and the field checks instead of
// stopping at the checksum.
func seal(body []byte) []byte {
	out := append(append([]byte{}, envelopeMagic...), body...)
	return binary.BigEndian.AppendUint32(out, crc32.Checksum(out, castagnoli))
}

// FuzzDecodeEnvelope: Decode never panics, fails only with ErrDataLoss,
// and whatever it accepts re-encodes to bytes that decode to the same event
// (and re-encode to the same bytes again: Encode∘Decode is a fixed point).
// Each input is tried as a whole envelope and as the body of a sealed one.
func FuzzDecodeEnvelope(f *testing.F) {
	for _, ev := range sampleEvents() {
		enc, err := Encode(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(enc)
		f.Add(enc[len(envelopeMagic) : len(enc)-4]) // the JSON body
		f.Add(enc[:len(enc)/2])                     // torn
		f.Add(enc[:len(enc)-1])
		flipped := bytes.Clone(enc)
		flipped[len(flipped)/3] ^= 0x10
		f.Add(flipped)
	}
	for _, s := range []string{
		"", "AEV1", "AEV2{}\x00\x00\x00\x00", "{}",
		`{"tenant":"t","stream":"s","seq":1,"id":"i","type":"x","version":1,"time":"0001-01-01T00:00:00Z","payload":null}`,
		`{"tenant":"t","stream":"s","seq":1,"id":"i","type":"x","version":1,"time":"2020-01-01T00:00:00+23:59","payload":"<&>"}`,
		`{"tenant":"t","stream":"s","seq":1,"id":"i","type":"x","version":1,"payload":{"a":1e400}}`,
		`{"TENANT":"t","stream":"s","seq":1,"id":"i","type":"x","version":1,"payload":[]} `,
		`{"tenant":"\ud800","stream":"s","seq":18446744073709551615,"id":"i","type":"x","version":9,"payload":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecode(t, b)
		checkDecode(t, seal(b))
		checkFastPath(t, b)
	})
}

// checkFastPath: whenever decodeCanonical takes a body, encoding/json
// reads the same event from it (or both refuse it).
func checkFastPath(t *testing.T, body []byte) {
	fast, ok := decodeCanonical(body)
	if !ok {
		return
	}
	fastErr := validateStored(fast)
	slow, slowErr := decodeGeneral(body)
	switch {
	case fastErr != nil && slowErr == nil:
		t.Fatalf("fast path refuses (%v) what encoding/json accepts: %q", fastErr, body)
	case fastErr == nil && slowErr != nil:
		t.Fatalf("fast path accepts what encoding/json refuses (%v): %q", slowErr, body)
	case fastErr == nil:
		_, fo := fast.Time.Zone()
		_, so := slow.Time.Zone()
		ft, st := fast.Time, slow.Time
		fast.Time, slow.Time = time.Time{}, time.Time{}
		if !reflect.DeepEqual(fast, slow) || !ft.Equal(st) || fo != so || ft.Location().String() != st.Location().String() {
			t.Fatalf("fast path read %+v at %v, encoding/json %+v at %v", fast, ft, slow, st)
		}
	}
}

func checkDecode(t *testing.T, b []byte) {
	ev, err := Decode(b)
	if err != nil {
		if !errors.Is(err, errdefs.ErrDataLoss) {
			t.Fatalf("Decode error is not DataLoss: %v", err)
		}
		if ev.ID != "" || ev.Payload != nil {
			t.Fatalf("Decode returned an event with its error: %+v", ev)
		}
		return
	}
	enc, err := Encode(ev)
	if err != nil {
		t.Fatalf("decoded event %+v does not re-encode: %v", ev, err)
	}
	ev2, err := Decode(enc)
	if err != nil {
		t.Fatalf("re-encoded event does not decode: %v\n%q", err, enc)
	}
	if d := diffEvents(ev2, ev); d != "" {
		t.Fatalf("round trip changed the event: %s", d)
	}
	enc2, err := Encode(ev2)
	if err != nil || !bytes.Equal(enc2, enc) {
		t.Fatalf("Encode is not stable: %q vs %q (%v)", enc, enc2, err)
	}
}
