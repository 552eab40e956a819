// Package eventlog is the contract of Amber's source of truth: an append-only
// log of events, divided into streams.
//
// # Vocabulary
//
// A stream is a named, gap-free sequence of events owned by one tenant. Amber
// keeps one stream per session ("session/<id>"), one per sandbox
// ("sandbox/<id>": lifecycle and checkpoints) and one audit stream per tenant
// ("audit/<tenant>"). Streams come into being with their first append; the
// tenant of the first event owns the stream for ever.
//
// An event's position is its sequence number (Seq): 1 for the first event of a
// stream, then +1 for each event, never reused, never skipped. The head of a
// stream is its last Seq (0 while empty).
//
// # Writing
//
// Append(ctx, stream, epoch, expectedSeq, events…) writes a batch atomically:
// all of it becomes visible or none of it does, and only after it is durable
// (an acknowledged append survives power loss). The caller states the head it
// expects (optimistic concurrency; Any skips the check) and the lease epoch it
// writes under (fencing). Errors:
//
//   - errdefs.ErrConflict: expectedSeq is not the head; or an event id already
//     exists with different content; or a batch mixes new and existing ids.
//   - errdefs.ErrFenced: epoch is older than the stream's lease epoch.
//   - errdefs.ErrInvalidArgument: malformed events, or a tenant that does not
//     own the stream.
//
// Event ids are unique in the store. Re-sending an append whose events all
// exist with the same content (same tenant, stream, type, version, causation,
// checkpoint reference and payload) is a no-op that returns the original
// positions: a client may retry any append whose answer it did not see.
//
// # Reading
//
// Read returns events in order from a position; Subscribe follows a stream
// live. Events below the first retained position (see Truncate) are gone:
// reading them fails with errdefs.ErrCompacted. Stored data that fails its
// checksum or does not decode is reported as errdefs.ErrDataLoss naming the
// stream and position, never returned as an event.
//
// # Leases
//
// A lease gives one holder the right to write a stream. Its epoch is a fencing
// token: every grant increases it, so a holder that lost its lease (it
// expired and someone else acquired it) finds its appends refused with
// ErrFenced. The lease table lives in the same database as the log and is
// checked in the same transaction as each append.
//
// # Bad input
//
// Every method reports malformed input as errdefs.ErrInvalidArgument and
// changes nothing: an invalid stream name (ValidateStreamName), an Append
// without events, with an event ValidateNew rejects, or naming the same id
// twice in one batch; a Read with limit < 1; a lease for an empty holder or
// with ttl <= 0.
package eventlog

import (
	"context"
	"encoding/json"
	"time"
)

// Any, passed as expectedSeq, appends at whatever the head is.
const Any = ^uint64(0)

// Event is the envelope of everything in the log.
type Event struct {
	Tenant string `json:"tenant"`
	Stream string `json:"stream"`
	// Seq is assigned by the store on append.
	Seq uint64 `json:"seq"`
	// ID is unique in the store; it makes appends idempotent.
	ID string `json:"id"`
	// Type and Version name the payload's schema (see Registry).
	Type    string `json:"type"`
	Version int    `json:"version"`
	// Time is set by the store's clock on append when zero.
	Time time.Time `json:"time"`
	// CausationID is the id of the event (or request) that caused this one.
	CausationID string          `json:"causation_id,omitempty"`
	Payload     json.RawMessage `json:"payload"`
	// CheckpointRef, when set, says that the state through this event is in a
	// durable checkpoint with that id; it lets Truncate drop what came before.
	CheckpointRef string `json:"checkpoint_ref,omitempty"`
}

// AppendResult tells where a batch landed.
type AppendResult struct {
	First, Last uint64
	// Duplicate is true when the batch had been appended before and this call
	// changed nothing.
	Duplicate bool
}

// Bounds are the retained positions of a stream: events First..Head are
// readable. An empty stream has First = Head+1.
type Bounds struct {
	First, Head uint64
}

// Lease is a grant to write one stream until Expires.
type Lease struct {
	Stream  string    `json:"stream"`
	Holder  string    `json:"holder"`
	Epoch   uint64    `json:"epoch"`
	Expires time.Time `json:"expires"`
}

// Store is an event log backend. Implementations: stores/sqlite (embedded,
// the default) and stores/postgres. Both pass the suite in
// core/eventlog/logtest. A Store is safe for concurrent use.
type Store interface {
	// Append writes events at the end of stream (see the package comment).
	// Seq of each event is ignored and assigned; Time is set when zero.
	Append(ctx context.Context, stream string, epoch, expectedSeq uint64, events ...Event) (AppendResult, error)
	// Read returns up to limit events with Seq >= from, in order. It returns
	// an empty slice past the head and ErrCompacted below the first retained
	// position.
	Read(ctx context.Context, stream string, from uint64, limit int) ([]Event, error)
	// Bounds returns the readable range of stream.
	Bounds(ctx context.Context, stream string) (Bounds, error)
	// Truncate drops the events with Seq < before. It refuses (ErrFailedPrecondition)
	// unless an event at or after before, at most the head, carries a
	// CheckpointRef: everything dropped must be covered by a durable snapshot
	// that stays referenced.
	Truncate(ctx context.Context, stream string, before uint64) error

	// Acquire grants holder the lease on stream with a new, higher epoch. It
	// fails with ErrConflict while another holder's lease has not expired. A
	// holder re-acquiring its own lease gets a new epoch too, fencing its own
	// earlier incarnation.
	Acquire(ctx context.Context, stream, holder string, ttl time.Duration) (Lease, error)
	// Renew extends l by ttl from now. It fails with ErrFenced when the
	// stream's epoch is no longer l.Epoch.
	Renew(ctx context.Context, l Lease, ttl time.Duration) (Lease, error)
	// Release ends l now, keeping its epoch (the next grant is higher). It
	// fails with ErrFenced when the stream's epoch is no longer l.Epoch.
	Release(ctx context.Context, l Lease) error
	// CurrentLease returns the stream's lease (epoch 0 and no holder if none
	// was ever granted).
	CurrentLease(ctx context.Context, stream string) (Lease, error)

	Close() error
}

// Notifier is an optional power of a Store: Changed returns a channel that is
// closed at the next append to stream made through this Store (or any Store
// sharing its database, where the backend can tell). Subscribe uses it to wake
// without polling.
type Notifier interface {
	Changed(stream string) <-chan struct{}
}
