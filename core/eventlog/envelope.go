package eventlog

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"hash/crc32"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
)

// Stored envelope format, version 1:
//
//	magic "AEV1" | JSON of Event | CRC-32C (big endian) of everything before it
//
// Backends store this blob next to their own index columns and decode it on
// every read, so a flipped bit or a torn write is reported as ErrDataLoss
// instead of being handed out as an event.
var envelopeMagic = []byte("AEV1")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MaxEnvelope bounds one encoded event (payload included).
const MaxEnvelope = 4 << 20

// Encode returns the stored form of ev.
func Encode(ev Event) ([]byte, error) {
	body, err := json.Marshal(ev)
	if err != nil {
		return nil, errdefs.InvalidArgumentf("encode event %s: %v", ev.ID, err)
	}
	out := make([]byte, 0, len(envelopeMagic)+len(body)+4)
	out = append(out, envelopeMagic...)
	out = append(out, body...)
	out = binary.BigEndian.AppendUint32(out, crc32.Checksum(out, castagnoli))
	if len(out) > MaxEnvelope {
		return nil, errdefs.InvalidArgumentf("event %s is %d bytes encoded, more than the %d allowed", ev.ID, len(out), MaxEnvelope)
	}
	return out, nil
}

// Decode parses a stored envelope. Any damage — wrong length, magic or
// checksum, undecodable JSON, missing fields — is an ErrDataLoss.
func Decode(b []byte) (Event, error) {
	var ev Event
	if len(b) < len(envelopeMagic)+4+2 {
		return ev, errdefs.DataLossf("envelope truncated (%d bytes)", len(b))
	}
	if len(b) > MaxEnvelope {
		return ev, errdefs.DataLossf("envelope of %d bytes exceeds the %d limit", len(b), MaxEnvelope)
	}
	if !bytes.Equal(b[:len(envelopeMagic)], envelopeMagic) {
		return ev, errdefs.DataLossf("envelope has unknown format %q", b[:len(envelopeMagic)])
	}
	n := len(b) - 4
	if got, want := crc32.Checksum(b[:n], castagnoli), binary.BigEndian.Uint32(b[n:]); got != want {
		return ev, errdefs.DataLossf("envelope checksum mismatch (crc %08x, stored %08x)", got, want)
	}
	body := b[len(envelopeMagic):n]
	if ev, ok := decodeCanonical(body); ok {
		if err := validateStored(ev); err != nil {
			return Event{}, err
		}
		return ev, nil
	}
	return decodeGeneral(body)
}

// decodeGeneral decodes any JSON body with encoding/json.
func decodeGeneral(body []byte) (Event, error) {
	var ev Event
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		return Event{}, errdefs.DataLossf("envelope does not decode: %v", err)
	}
	if dec.More() {
		return Event{}, errdefs.DataLossf("envelope has trailing data")
	}
	if err := validateStored(ev); err != nil {
		return Event{}, err
	}
	return ev, nil
}

func validateStored(ev Event) error {
	switch {
	case ev.Seq == 0:
		return errdefs.DataLossf("stored event %q has no sequence number", ev.ID)
	case ev.Tenant == "" || ev.Stream == "" || ev.ID == "" || ev.Type == "":
		return errdefs.DataLossf("stored event %s/%d lacks tenant, stream, id or type", ev.Stream, ev.Seq)
	case ev.Version < 1:
		return errdefs.DataLossf("stored event %s/%d has version %d", ev.Stream, ev.Seq, ev.Version)
	case !json.Valid(ev.Payload):
		return errdefs.DataLossf("stored event %s/%d has an invalid payload", ev.Stream, ev.Seq)
	}
	return nil
}

// maxNameLen bounds stream names, ids, types and tenants.
const maxNameLen = 256

// ValidateNew checks an event about to be appended to stream. Backends call
// it before writing.
func ValidateNew(stream string, ev Event) error {
	if err := ValidateStreamName(stream); err != nil {
		return err
	}
	for name, v := range map[string]string{"tenant": ev.Tenant, "id": ev.ID, "type": ev.Type} {
		if v == "" {
			return errdefs.InvalidArgumentf("event for %s: %s is empty", stream, name)
		}
		if len(v) > maxNameLen || strings.ContainsAny(v, "\x00\n") {
			return errdefs.InvalidArgumentf("event for %s: %s %.40q is too long or has control characters", stream, name, v)
		}
	}
	if ev.Stream != "" && ev.Stream != stream {
		return errdefs.InvalidArgumentf("event %s names stream %q but is appended to %q", ev.ID, ev.Stream, stream)
	}
	if ev.Version < 1 {
		return errdefs.InvalidArgumentf("event %s: version must be >= 1, got %d", ev.ID, ev.Version)
	}
	if len(ev.Payload) == 0 || !json.Valid(ev.Payload) {
		return errdefs.InvalidArgumentf("event %s: payload is not valid JSON", ev.ID)
	}
	return nil
}

// ValidateStreamName checks a stream name: non-empty, bounded, printable.
func ValidateStreamName(stream string) error {
	if stream == "" || len(stream) > maxNameLen {
		return errdefs.InvalidArgumentf("stream name %.40q must be 1..%d bytes", stream, maxNameLen)
	}
	for _, r := range stream {
		if r < 0x20 || r == 0x7f {
			return errdefs.InvalidArgumentf("stream name %.40q has control characters", stream)
		}
	}
	return nil
}

// ContentDigest identifies an event's content for idempotent re-append: two
// appends of the same id are the same append exactly when their digests are
// equal. Seq and Time are excluded (a retry does not know them); the payload is
// compared after compacting whitespace.
func ContentDigest(stream string, ev Event) string {
	var payload bytes.Buffer
	if err := json.Compact(&payload, ev.Payload); err != nil {
		payload.Reset()
		payload.Write(ev.Payload)
	}
	h := sha256.New()
	for _, f := range []string{ev.Tenant, stream, ev.ID, ev.Type, ev.CausationID, ev.CheckpointRef} {
		binary.Write(h, binary.BigEndian, uint32(len(f)))
		h.Write([]byte(f))
	}
	binary.Write(h, binary.BigEndian, int64(ev.Version))
	h.Write(payload.Bytes())
	return hex.EncodeToString(h.Sum(nil))
}
