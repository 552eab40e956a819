package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// maxAttempts bounds how often an append is retried after losing a race
// that the database reports as an error (two first appends creating the
// same stream, the same new id appended to two streams at once, a
// deadlock). Each retry starts after the winner committed, so it sees the
// winner's rows and ends in success, Duplicate or Conflict.
const maxAttempts = 16

// batch is an append prepared outside the transaction.
type batch struct {
	stream  string
	tenant  string
	events  []eventlog.Event // Stream and Time filled in
	digests []string
	ids     []string // sorted: ids are inserted in this order so concurrent batches cannot deadlock
}

// Append writes events at the end of stream in one transaction (see the
// package comment for the durability order and the fencing rule).
func (s *Store) Append(ctx context.Context, stream string, epoch, expectedSeq uint64, events ...eventlog.Event) (eventlog.AppendResult, error) {
	b, err := s.prepare(stream, events)
	if err != nil {
		return eventlog.AppendResult{}, fmt.Errorf("append %s: %w", stream, err)
	}
	for attempt := 1; ; attempt++ {
		res, err := s.appendOnce(ctx, b, epoch, expectedSeq)
		if err == nil {
			if !res.Duplicate {
				s.notify.wake(stream)
				s.publish(stream)
			}
			return res, nil
		}
		if !retryable(err) || attempt == maxAttempts || ctx.Err() != nil {
			if retryable(err) {
				err = errdefs.Conflictf("lost %d races: %v", attempt, err)
			}
			return eventlog.AppendResult{}, s.wrap("append "+stream, err)
		}
		// The winner has committed; a short jitter only spreads out
		// deadlock victims.
		time.Sleep(time.Duration(rand.IntN(attempt*200)) * time.Microsecond)
	}
}

func (s *Store) prepare(stream string, events []eventlog.Event) (*batch, error) {
	if err := eventlog.ValidateStreamName(stream); err != nil {
		return nil, err
	}
	if len(events) == 0 {
		return nil, errdefs.InvalidArgumentf("no events")
	}
	now := s.clk.Now()
	b := &batch{stream: stream, tenant: events[0].Tenant, events: make([]eventlog.Event, len(events))}
	seen := make(map[string]bool, len(events))
	for i, ev := range events {
		if err := eventlog.ValidateNew(stream, ev); err != nil {
			return nil, err
		}
		if ev.Tenant != b.tenant {
			return nil, errdefs.InvalidArgumentf("batch mixes tenants %q and %q", b.tenant, ev.Tenant)
		}
		if seen[ev.ID] {
			return nil, errdefs.InvalidArgumentf("event id %s appears twice in the batch", ev.ID)
		}
		seen[ev.ID] = true
		ev.Stream = stream
		ev.Seq = 0
		if ev.Time.IsZero() {
			ev.Time = now
		}
		b.events[i] = ev
		b.digests = append(b.digests, eventlog.ContentDigest(stream, ev))
		b.ids = append(b.ids, ev.ID)
	}
	slices.Sort(b.ids)
	return b, nil
}

// retryable reports errors that mean "another transaction won a race; try
// again": unique violations, serialization failures and deadlocks.
func retryable(err error) bool {
	switch pgCode(err) {
	case "23505", "40001", "40P01":
		return true
	}
	return false
}

type existingID struct {
	stream string
	seq    uint64
	digest string
}

// appendOnce runs one attempt in two round trips: BEGIN and the reads that
// lock the stream, then the writes and COMMIT.
func (s *Store) appendOnce(ctx context.Context, b *batch, epoch, expectedSeq uint64) (res eventlog.AppendResult, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return res, err
	}
	defer func() { s.release(conn) }()

	// Round trip 1: lock the stream row, then read its lease (FOR SHARE:
	// an Acquire cannot slip in before COMMIT) and any of the batch's ids
	// that exist. A missing stream or lease row locks nothing; the writes
	// below then INSERT it, and a concurrent creator makes one of the two
	// fail with a unique violation and retry.
	var (
		streamExists      bool
		tenant            string
		firstSeq          uint64
		headSeq           uint64
		leaseExists       bool
		leaseEpoch        uint64
		existing          = map[string]existingID{}
		lockRow, leaseRow pgx.Row
	)
	q := &pgx.Batch{}
	q.Queue("BEGIN")
	q.Queue(`SELECT tenant, first_seq, head_seq FROM streams WHERE stream = $1 FOR UPDATE`, b.stream)
	q.Queue(`SELECT epoch FROM leases WHERE stream = $1 FOR SHARE`, b.stream)
	q.Queue(`SELECT id, stream, seq, digest FROM event_ids WHERE id = ANY($1)`, b.ids)
	br := conn.SendBatch(ctx, q)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return res, err
	}
	lockRow = br.QueryRow()
	switch err := lockRow.Scan(&tenant, &firstSeq, &headSeq); {
	case err == nil:
		streamExists = true
	case !errors.Is(err, pgx.ErrNoRows):
		br.Close()
		return res, err
	}
	leaseRow = br.QueryRow()
	switch err := leaseRow.Scan(&leaseEpoch); {
	case err == nil:
		leaseExists = true
	case !errors.Is(err, pgx.ErrNoRows):
		br.Close()
		return res, err
	}
	rows, err := br.Query()
	if err == nil {
		for rows.Next() {
			var id string
			var e existingID
			if err := rows.Scan(&id, &e.stream, &e.seq, &e.digest); err != nil {
				rows.Close()
				br.Close()
				return res, err
			}
			existing[id] = e
		}
		rows.Close()
		err = rows.Err()
	}
	if err != nil {
		br.Close()
		return res, err
	}
	if err := br.Close(); err != nil {
		return res, err
	}

	// The checks, in order: idempotency (a retry of what already happened
	// answers with the original positions whatever else changed since),
	// ownership, fencing, expected head.
	if len(existing) > 0 {
		return duplicateOf(b, existing)
	}
	if streamExists && tenant != b.tenant {
		return res, errdefs.InvalidArgumentf("stream is owned by tenant %q, not %q", tenant, b.tenant)
	}
	if epoch < leaseEpoch {
		return res, errdefs.Fencedf("epoch %d is older than the stream's lease epoch %d", epoch, leaseEpoch)
	}
	if expectedSeq != eventlog.Any && expectedSeq != headSeq {
		return res, errdefs.Conflictf("expected head %d, stream is at %d", expectedSeq, headSeq)
	}

	// Round trip 2: the writes and COMMIT.
	n := uint64(len(b.events))
	seqs := make([]int64, n)
	envs := make([][]byte, n)
	refs := make([]*string, n)
	seqOf := make(map[string]int64, n)
	digestOf := make(map[string]string, n)
	for i, ev := range b.events {
		ev.Seq = headSeq + 1 + uint64(i)
		env, err := eventlog.Encode(ev)
		if err != nil {
			return res, err
		}
		seqs[i], envs[i] = int64(ev.Seq), env
		if ev.CheckpointRef != "" {
			refs[i] = &b.events[i].CheckpointRef
		}
		seqOf[ev.ID] = int64(ev.Seq)
		digestOf[ev.ID] = b.digests[i]
	}
	idSeqs := make([]int64, n)
	idDigests := make([]string, n)
	for i, id := range b.ids {
		idSeqs[i], idDigests[i] = seqOf[id], digestOf[id]
	}
	newHead := int64(headSeq + n)

	w := &pgx.Batch{}
	if streamExists {
		w.Queue(`UPDATE streams SET head_seq = $2 WHERE stream = $1`, b.stream, newHead)
	} else {
		w.Queue(`INSERT INTO streams (stream, tenant, first_seq, head_seq) VALUES ($1, $2, 1, $3)`, b.stream, b.tenant, newHead)
	}
	if !leaseExists {
		// A placeholder lease row (epoch 0, never granted) that later
		// appends lock FOR SHARE, so Acquire always has a row to wait on.
		w.Queue(`INSERT INTO leases (stream, holder, epoch, expires) VALUES ($1, '', 0, NULL)`, b.stream)
	}
	w.Queue(`INSERT INTO events (stream, seq, envelope, checkpoint_ref)
		SELECT $1, u.seq, u.env, u.ref FROM unnest($2::bigint[], $3::bytea[], $4::text[]) AS u(seq, env, ref)`,
		b.stream, seqs, envs, refs)
	w.Queue(`INSERT INTO event_ids (id, stream, seq, digest)
		SELECT u.id, $1, u.seq, u.digest FROM unnest($2::text[], $3::bigint[], $4::text[]) AS u(id, seq, digest)`,
		b.stream, b.ids, idSeqs, idDigests)
	w.Queue("COMMIT")
	if err := conn.SendBatch(ctx, w).Close(); err != nil {
		return res, err
	}
	return eventlog.AppendResult{First: headSeq + 1, Last: headSeq + n}, nil
}

// duplicateOf decides a batch some of whose ids exist: a no-op returning the
// original positions when all exist with the same content, else a Conflict.
func duplicateOf(b *batch, existing map[string]existingID) (eventlog.AppendResult, error) {
	var res eventlog.AppendResult
	for i, ev := range b.events {
		e, ok := existing[ev.ID]
		switch {
		case !ok:
			return res, errdefs.Conflictf("batch mixes new event %s with events that already exist", ev.ID)
		case e.digest != b.digests[i]:
			return res, errdefs.Conflictf("event id %s already exists (%s/%d) with different content", ev.ID, e.stream, e.seq)
		}
	}
	first, last := existing[b.events[0].ID], existing[b.events[len(b.events)-1].ID]
	return eventlog.AppendResult{First: first.seq, Last: last.seq, Duplicate: true}, nil
}

// release returns conn to the pool, rolling back a transaction an error
// left open. A connection that cannot be rolled back is closed instead.
func (s *Store) release(conn *pgxpool.Conn) {
	if conn.Conn().PgConn().TxStatus() != 'I' && !conn.Conn().IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
			conn.Conn().Close(ctx)
		}
		cancel()
	}
	conn.Release()
}
