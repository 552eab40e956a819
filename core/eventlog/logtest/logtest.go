// Package logtest is the conformance suite of eventlog.Store: every backend
// runs the same Run from its own tests, against a real database.
//
//	func TestConformance(t *testing.T) {
//		logtest.Run(t, func(t *testing.T, clk clock.Clock) eventlog.Store {
//			s, err := mybackend.Open(..., clk)
//			if err != nil {
//				t.Fatal(err)
//			}
//			t.Cleanup(func() { s.Close() })
//			return s
//		}, logtest.Options{Corrupt: corruptRow})
//	}
//
// Each subtest asks newStore for a store driven by its own clock.Fake (lease
// expiry is tested by moving it, never by sleeping). newStore may hand out
// stores sharing one database: subtests only touch streams and event ids
// with a random per-Run prefix. newStore owns cleanup (t.Cleanup); the suite
// closes a store itself only in the Closed subtest, so Close must tolerate a
// second call.
//
// The package also has RunBench, the backend-agnostic benchmark behind
// docs/benchmarks.md.
package logtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/eventlog"
)

// Options carry a backend's hooks and sizes. The zero value runs every
// subtest that needs no hook, at full size.
type Options struct {
	// Corrupt damages the stored bytes of the event at stream/seq in the
	// backend (flip a byte of the stored envelope, say), so that reading it
	// must fail with ErrDataLoss naming stream and seq. Nil skips Corruption.
	Corrupt func(t *testing.T, store eventlog.Store, stream string, seq uint64)
	// Reopen closes store and opens the same database again. Nil skips
	// Reopen (persistence across a restart).
	Reopen func(t *testing.T, store eventlog.Store, clk clock.Clock) eventlog.Store
	// Writers and AppendsPerWriter size Concurrency: that many goroutines
	// each own a stream and append that many times (default 64 and 20).
	Writers, AppendsPerWriter int
}

// Tenant is the tenant the suite writes as; OtherTenant is a second one.
const (
	Tenant      = "tenant-a"
	OtherTenant = "tenant-b"
)

// Epoch is a fake-clock start with whole microseconds, so backends that
// store times at microsecond precision compare equal.
var Epoch = time.Date(2030, 1, 2, 3, 4, 5, 123456000, time.UTC)

type subtest struct {
	name string
	fn   func(t *testing.T, e *env)
}

var subtests = []subtest{
	{"RoundTrip", testRoundTrip},
	{"GapFreeSequence", testGapFree},
	{"EmptyStream", testEmptyStream},
	{"ReadLimit", testReadLimit},
	{"ExpectedSeq", testExpectedSeq},
	{"BatchAtomicity", testBatchAtomicity},
	{"Idempotency", testIdempotency},
	{"IdempotencyConflicts", testIdempotencyConflicts},
	{"Tenancy", testTenancy},
	{"BadInput", testBadInput},
	{"LargeEvent", testLargeEvent},
	{"Leases", testLeases},
	{"LeaseFencing", testLeaseFencing},
	{"LeaseBadInput", testLeaseBadInput},
	{"Concurrency", testConcurrency},
	{"SubscribeLive", testSubscribeLive},
	{"SubscribeReconnect", testSubscribeReconnect},
	{"SubscribeWakes", testSubscribeWakes},
	{"Upcasting", testUpcasting},
	{"Truncate", testTruncate},
	{"TruncateRefused", testTruncateRefused},
	{"Corruption", testCorruption},
	{"Reopen", testReopen},
	{"Closed", testClosed},
}

// Run runs the suite. newStore returns a fresh Store whose clock is clk.
func Run(t *testing.T, newStore func(t *testing.T, clk clock.Clock) eventlog.Store, opts Options) {
	if opts.Writers <= 0 {
		opts.Writers = 64
	}
	if opts.AppendsPerWriter <= 0 {
		opts.AppendsPerWriter = 20
	}
	runID := randHex(4)
	for _, st := range subtests {
		t.Run(st.name, func(t *testing.T) {
			clk := clock.NewFake(Epoch)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			e := &env{
				ctx: ctx, clk: clk, opts: opts, newStore: newStore,
				prefix: fmt.Sprintf("logtest-%s/%s", runID, st.name),
			}
			e.store = newStore(t, clk)
			st.fn(t, e)
		})
	}
}

// env is one subtest's world.
type env struct {
	ctx      context.Context
	store    eventlog.Store
	clk      *clock.Fake
	opts     Options
	newStore func(t *testing.T, clk clock.Clock) eventlog.Store
	prefix   string
	n        atomic.Int64
}

// stream returns a stream name no other subtest or run uses.
func (e *env) stream(name string) string {
	return fmt.Sprintf("%s/%s-%d", e.prefix, name, e.n.Add(1))
}

// ev builds a valid event for stream with a unique id ending in name.
func ev(stream, name string, payload any) eventlog.Event {
	p, err := json.Marshal(payload)
	if err != nil {
		panic(err)
	}
	return eventlog.Event{
		Tenant: Tenant, ID: stream + "#" + name, Type: "logtest.note", Version: 1, Payload: p,
	}
}

// evs builds n events named prefix0..prefix(n-1) with payload {"i":i}.
func evs(stream, prefix string, n int) []eventlog.Event {
	out := make([]eventlog.Event, n)
	for i := range out {
		out[i] = ev(stream, fmt.Sprintf("%s%d", prefix, i), map[string]int{"i": i})
	}
	return out
}

func (e *env) append(t *testing.T, stream string, epoch, expected uint64, events ...eventlog.Event) eventlog.AppendResult {
	t.Helper()
	res, err := e.store.Append(e.ctx, stream, epoch, expected, events...)
	if err != nil {
		t.Fatalf("Append(%s, epoch %d, expected %s, %d events): %v", stream, epoch, seqStr(expected), len(events), err)
	}
	if want := uint64(len(events)); !res.Duplicate && res.Last-res.First+1 != want {
		t.Fatalf("Append(%s) = %+v for %d events", stream, res, want)
	}
	return res
}

func (e *env) bounds(t *testing.T, stream string) eventlog.Bounds {
	t.Helper()
	b, err := e.store.Bounds(e.ctx, stream)
	if err != nil {
		t.Fatalf("Bounds(%s): %v", stream, err)
	}
	return b
}

func (e *env) wantBounds(t *testing.T, stream string, first, head uint64) {
	t.Helper()
	if b := e.bounds(t, stream); b != (eventlog.Bounds{First: first, Head: head}) {
		t.Fatalf("Bounds(%s) = %+v, want {First:%d Head:%d}", stream, b, first, head)
	}
}

// readAll reads from..head in pages of 7 (a page size that does not divide
// the suite's stream lengths, so page boundaries are exercised).
func (e *env) readAll(t *testing.T, stream string, from uint64) []eventlog.Event {
	t.Helper()
	var out []eventlog.Event
	for {
		page, err := e.store.Read(e.ctx, stream, from, 7)
		if err != nil {
			t.Fatalf("Read(%s, %d, 7): %v", stream, from, err)
		}
		if len(page) > 7 {
			t.Fatalf("Read(%s, %d, 7) returned %d events", stream, from, len(page))
		}
		out = append(out, page...)
		if len(page) < 7 {
			return out
		}
		from = page[len(page)-1].Seq + 1
	}
}

// wantSeqs checks that evs are exactly the positions first..last in order
// (none when last < first).
func wantSeqs(t *testing.T, what string, evs []eventlog.Event, first, last uint64) {
	t.Helper()
	n := 0
	if last >= first {
		n = int(last - first + 1)
	}
	ok := len(evs) == n
	for i := 0; ok && i < n; i++ {
		ok = evs[i].Seq == first+uint64(i)
	}
	if !ok {
		t.Fatalf("%s: got positions %s, want %d..%d", what, seqList(evs), first, last)
	}
}

func seqList(evs []eventlog.Event) string {
	var b strings.Builder
	b.WriteString("[")
	for i, ev := range evs {
		if i == 20 {
			fmt.Fprintf(&b, " … %d more", len(evs)-20)
			break
		}
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprint(&b, ev.Seq)
	}
	b.WriteString("]")
	return b.String()
}

func seqStr(s uint64) string {
	if s == eventlog.Any {
		return "Any"
	}
	return fmt.Sprint(s)
}

// wantErr fails unless err is of kind.
func wantErr(t *testing.T, err, kind error, format string, args ...any) {
	t.Helper()
	what := fmt.Sprintf(format, args...)
	if err == nil {
		t.Fatalf("%s: succeeded, want %v", what, kind)
	}
	if !errors.Is(err, kind) {
		t.Fatalf("%s: got %v, want kind %v", what, err, kind)
	}
}

// jsonEqual compares two JSON documents by value (key order and
// whitespace ignored, numbers compared as written).
func jsonEqual(a, b []byte) bool {
	va, errA := decodeJSON(a)
	vb, errB := decodeJSON(b)
	return errA == nil && errB == nil && reflect.DeepEqual(va, vb)
}

func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// sameEvent reports how got differs from want (Seq, Time compared by
// instant, payload by JSON value), or "".
func sameEvent(got, want eventlog.Event) string {
	var diffs []string
	add := func(field string, g, w any) { diffs = append(diffs, fmt.Sprintf("%s %v, want %v", field, g, w)) }
	if got.Tenant != want.Tenant {
		add("tenant", got.Tenant, want.Tenant)
	}
	if got.Stream != want.Stream {
		add("stream", got.Stream, want.Stream)
	}
	if got.Seq != want.Seq {
		add("seq", got.Seq, want.Seq)
	}
	if got.ID != want.ID {
		add("id", got.ID, want.ID)
	}
	if got.Type != want.Type || got.Version != want.Version {
		add("type", fmt.Sprintf("%s/v%d", got.Type, got.Version), fmt.Sprintf("%s/v%d", want.Type, want.Version))
	}
	if !got.Time.Equal(want.Time) {
		add("time", got.Time, want.Time)
	}
	if got.CausationID != want.CausationID {
		add("causation", got.CausationID, want.CausationID)
	}
	if got.CheckpointRef != want.CheckpointRef {
		add("checkpoint", got.CheckpointRef, want.CheckpointRef)
	}
	if !jsonEqual(got.Payload, want.Payload) {
		add("payload", string(got.Payload), string(want.Payload))
	}
	return strings.Join(diffs, "; ")
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
