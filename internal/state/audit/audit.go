// Package audit is Amber's audit trail: one append-only, hash-chained stream
// of records per tenant ("audit/<tenant>" in the event log) saying who did
// what, when, and how it ended — every state-changing API call, and what the
// engine does on its own.
//
// # The chain
//
// Each record carries the hash of the record before it (Prev; the first
// record's is 64 zeros) and its own Hash. A keyed trail (Options.Key, kept
// outside the event log: DATA_DIR/audit.key or --audit-key-file) writes
// version 2 records, whose Hash is HMAC-SHA256(key, Prev || the record's
// canonical JSON without Hash): whoever can write the log's database but
// not read the key cannot forge one. Version 1 records (V absent, written
// before the trail was keyed) carry Hash = SHA-256(Prev || the JSON).
//
// Verify walks the stream from its first retained record and recomputes
// every hash: an edited record breaks its own hash, a deleted one breaks the
// next record's Prev, a reordering breaks both; Verify names the first
// position that does not hold. Version 1 records are checked the old way up
// to the first version 2 record; an unkeyed record after a keyed one is a
// forgery.
//
// # The anchor
//
// Cutting records off the end leaves a valid, shorter chain, so the head is
// anchored outside the log's store (Options.Anchor; DATA_DIR/audit.head):
// after each append the anchor holds the stream's (seq, hash) as this
// process last wrote it. Verify checks that the log still reaches the
// anchored seq and that the record there carries the anchored hash.
//
// Durability order: the record is appended (durable in the log) before the
// anchor is written (temp file, fsync, rename, fsync dir), and the anchor
// only moves forward. A crash between the two leaves the anchor behind the
// log by the last record, which Verify accepts (the log reaches past the
// anchor); the anchor is never ahead of a durable log. Several daemons on
// one shared log each anchor what they appended: each one's anchor is a
// lower bound of the head.
//
// # Concurrency
//
// Append reads the head of the stream and appends with that position as the
// expected one: two daemons (or two goroutines) racing get a Conflict and the
// loser re-reads and retries, so the chain never forks.
package audit

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// EventType is the type of audit events, version 1.
const EventType = "audit.record"

// zero is the Prev of a stream's first record.
var zero = strings.Repeat("0", 64)

// Stream is tenant's audit stream.
func Stream(tenant string) string { return "audit/" + tenant }

// Record is one audit record.
type Record struct {
	Time time.Time `json:"time"`
	// Actor is who: "key:<name>" for an API key, "system" for the engine.
	Actor string `json:"actor"`
	// Action is what: "POST /v1/sandboxes/{id}/checkpoints", "sandbox.idle_stop", …
	Action string `json:"action"`
	// Resource is what it was done to (a path or an id).
	Resource string `json:"resource,omitempty"`
	// Outcome is "ok" or the error kind, and Status the HTTP status if any.
	Outcome   string `json:"outcome"`
	Status    int    `json:"status,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	// Detail is free text (an error message, an id created).
	Detail string `json:"detail,omitempty"`
	// V is the record's version: absent (1) for a SHA-256 chained record,
	// Keyed (2) for an HMAC one. It is part of what the hash covers.
	V    int    `json:"v,omitempty"`
	Prev string `json:"prev"`
	Hash string `json:"hash,omitempty"`
}

// Keyed is the version of records chained by HMAC.
const Keyed = 2

// KeySize is the size of an audit key.
const KeySize = 32

// HashOf is the hash an unkeyed (version 1) r must carry: SHA-256 over
// r.Prev and r's JSON without its Hash.
func HashOf(r Record) string { return hash(r) }

// MACOf is the hash a keyed (version 2) r must carry under key.
func MACOf(key []byte, r Record) string { return mac(key, r) }

func hash(r Record) string {
	r.Hash = ""
	b, _ := json.Marshal(r)
	h := sha256.New()
	h.Write([]byte(r.Prev))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

func mac(key []byte, r Record) string {
	r.Hash = ""
	b, _ := json.Marshal(r)
	h := hmac.New(sha256.New, key)
	h.Write([]byte(r.Prev))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// Trail appends and reads audit records.
type Trail struct {
	log    eventlog.Store
	clock  clock.Clock
	key    []byte
	anchor Anchor
	mu     sync.Mutex // serialises this process's appends (others are caught by expectedSeq)
}

// Options configure a Trail.
type Options struct {
	Clock clock.Clock
	// Key keys the chain (KeySize bytes, kept outside the event log). Nil:
	// records are chained by SHA-256 alone, as before keys (tests).
	Key []byte
	// Anchor keeps each stream's head outside the log's store; nil: none
	// (records cut off the end then go unnoticed).
	Anchor Anchor
}

// New returns an unkeyed, unanchored Trail over log.
func New(log eventlog.Store, c clock.Clock) *Trail {
	t, _ := Open(log, Options{Clock: c})
	return t
}

// Open returns a Trail over log with opts.
func Open(log eventlog.Store, opts Options) (*Trail, error) {
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Key != nil && len(opts.Key) != KeySize {
		return nil, errdefs.InvalidArgumentf("audit: the key is %d bytes, want %d", len(opts.Key), KeySize)
	}
	return &Trail{log: log, clock: opts.Clock, key: opts.Key, anchor: opts.Anchor}, nil
}

// RegisterEvents declares the audit event type.
func RegisterEvents(r *eventlog.Registry) { r.Register(EventType, 1) }

// Append chains r after tenant's last record and appends it; it returns the
// record as stored.
func (t *Trail) Append(ctx context.Context, tenant string, r Record) (Record, error) {
	if tenant == "" {
		return r, errdefs.InvalidArgumentf("audit: tenant is empty")
	}
	if r.Time.IsZero() {
		r.Time = t.clock.Now().UTC()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	stream := Stream(tenant)
	for attempt := 0; ; attempt++ {
		head, prev, err := t.last(ctx, stream)
		if err != nil {
			return r, err
		}
		r.Prev, r.Hash, r.V = prev, "", 0
		if t.key != nil {
			r.V = Keyed
			r.Hash = mac(t.key, r)
		} else {
			r.Hash = hash(r)
		}
		p, _ := json.Marshal(r)
		idb := make([]byte, 12)
		rand.Read(idb)
		ev := eventlog.Event{Tenant: tenant, Stream: stream, ID: "audit-" + hex.EncodeToString(idb), Type: EventType, Version: 1, Time: r.Time, Payload: p}
		res, err := t.log.Append(ctx, stream, 0, head, ev)
		if errdefs.IsConflict(err) && attempt < 20 {
			continue // another writer appended first: chain after it
		}
		if err != nil {
			return r, fmt.Errorf("audit: append to %s: %w", stream, err)
		}
		// The record is durable in the log: anchor it (see the package
		// comment for why this order).
		if t.anchor != nil {
			if err := t.anchor.Advance(tenant, Head{Seq: res.Last, Hash: r.Hash}); err != nil {
				return r, fmt.Errorf("audit: record %d of %s appended, its anchor not written: %w", res.Last, stream, err)
			}
		}
		return r, nil
	}
}

// last returns stream's head position and the hash of the record there.
func (t *Trail) last(ctx context.Context, stream string) (uint64, string, error) {
	b, err := t.log.Bounds(ctx, stream)
	if err != nil {
		return 0, "", fmt.Errorf("audit: %w", err)
	}
	if b.Head == 0 {
		return 0, zero, nil
	}
	evs, err := t.log.Read(ctx, stream, b.Head, 1)
	if err != nil {
		return 0, "", fmt.Errorf("audit: read the head of %s: %w", stream, err)
	}
	if len(evs) != 1 {
		return 0, "", errdefs.DataLossf("audit: the head of %s (%d) is unreadable", stream, b.Head)
	}
	var r Record
	if err := json.Unmarshal(evs[0].Payload, &r); err != nil || len(r.Hash) != 64 {
		return 0, "", errdefs.DataLossf("audit: %s at %d is not an audit record", stream, b.Head)
	}
	return b.Head, r.Hash, nil
}

// Entry is a record with its position.
type Entry struct {
	Seq uint64 `json:"seq"`
	Record
}

// List returns up to limit of tenant's records from position from.
func (t *Trail) List(ctx context.Context, tenant string, from uint64, limit int) ([]Entry, error) {
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	evs, err := t.log.Read(ctx, Stream(tenant), max(from, 1), limit)
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(evs))
	for _, ev := range evs {
		var r Record
		if err := json.Unmarshal(ev.Payload, &r); err != nil {
			return out, errdefs.DataLossf("audit: %s at %d does not decode: %v", Stream(tenant), ev.Seq, err)
		}
		out = append(out, Entry{Seq: ev.Seq, Record: r})
	}
	return out, nil
}

// Report is the outcome of Verify.
type Report struct {
	OK bool `json:"ok"`
	// Records were checked, from First to Head.
	Records int    `json:"records"`
	First   uint64 `json:"first"`
	Head    uint64 `json:"head"`
	// BadSeq is the first position that does not hold, and Problem why.
	BadSeq  uint64 `json:"bad_seq,omitempty"`
	Problem string `json:"problem,omitempty"`
	// HeadHash is the hash of the last record: keep it to notice records
	// cut off the end later.
	HeadHash string `json:"head_hash,omitempty"`
}

// Verify checks tenant's whole chain (see the package comment).
func (t *Trail) Verify(ctx context.Context, tenant string) (Report, error) {
	stream := Stream(tenant)
	b, err := t.log.Bounds(ctx, stream)
	if err != nil {
		return Report{}, err
	}
	rep := Report{OK: true, First: b.First, Head: b.Head}
	bad := func(seq uint64, format string, args ...any) (Report, error) {
		rep.OK, rep.BadSeq, rep.Problem = false, seq, fmt.Sprintf(format, args...)
		return rep, nil
	}
	var anchored Head
	if t.anchor != nil {
		if anchored, err = t.anchor.Load(tenant); err != nil {
			return rep, fmt.Errorf("audit: the anchor of %s: %w", stream, err)
		}
	}
	prev, expect := "", b.First
	keyed := false // a version 2 record was seen: no version 1 may follow
	for from := b.First; from <= b.Head; {
		evs, err := t.log.Read(ctx, stream, from, 500)
		if errdefs.IsDataLoss(err) {
			// Find the exact record, one at a time (earlier ones of the
			// batch may be fine and are checked in order).
			evs = nil
			for s := from; s <= b.Head; s++ {
				one, err := t.log.Read(ctx, stream, s, 1)
				if err != nil || len(one) != 1 || one[0].Seq != s {
					if len(evs) == 0 {
						return bad(s, "record %d is missing or damaged: %v", s, err)
					}
					break
				}
				evs = append(evs, one[0])
			}
			err = nil
		}
		if err != nil {
			return rep, err
		}
		if len(evs) == 0 {
			return bad(from, "records %d to %d are missing", from, b.Head)
		}
		for _, ev := range evs {
			if ev.Seq != expect {
				return bad(expect, "record %d is missing (the next is %d)", expect, ev.Seq)
			}
			var r Record
			if err := json.Unmarshal(ev.Payload, &r); err != nil || ev.Type != EventType {
				return bad(ev.Seq, "not an audit record")
			}
			if prev == "" && ev.Seq == 1 {
				prev = zero
			}
			if prev != "" && r.Prev != prev {
				return bad(ev.Seq, "its link to the record before does not match: a record before it was changed, removed or moved")
			}
			switch {
			case r.V == Keyed && t.key == nil:
				return rep, errdefs.FailedPreconditionf("audit: record %d of %s is keyed and this daemon has no audit key", ev.Seq, stream)
			case r.V == Keyed:
				if !hmac.Equal([]byte(mac(t.key, r)), []byte(r.Hash)) {
					return bad(ev.Seq, "its content does not match its MAC: it was edited (or written with another audit key)")
				}
				keyed = true
			case r.V > 1:
				return bad(ev.Seq, "record version %d is unknown", r.V)
			case keyed:
				return bad(ev.Seq, "an unkeyed record after keyed ones: it was forged")
			default:
				if h := hash(r); h != r.Hash {
					return bad(ev.Seq, "its content does not match its hash: it was edited")
				}
			}
			if anchored.Seq != 0 && ev.Seq == anchored.Seq && r.Hash != anchored.Hash {
				return bad(ev.Seq, "it is not the record anchored at %d (hash %.16s…): the trail was replaced from there", anchored.Seq, anchored.Hash)
			}
			prev, expect = r.Hash, ev.Seq+1
			rep.Records++
		}
		from = evs[len(evs)-1].Seq + 1
	}
	if anchored.Seq > b.Head {
		if b.Head < b.First {
			return bad(anchored.Seq, "records 1 to %d are missing: the trail is empty, and its head was at %d when this daemon last appended (DATA_DIR/audit.head)", anchored.Seq, anchored.Seq)
		}
		return bad(b.Head+1, "records %d to %d are missing: the trail ends at %d, and its head was at %d when this daemon last appended (DATA_DIR/audit.head)", b.Head+1, anchored.Seq, b.Head, anchored.Seq)
	}
	rep.HeadHash = prev
	return rep, nil
}
