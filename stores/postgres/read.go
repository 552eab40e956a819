package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// Read returns up to limit events of stream with Seq >= from, in order.
//
// The stream's bounds and its events are read by one statement (one
// snapshot), so a concurrent Truncate cannot make Read skip silently: either
// from is below the retained range (ErrCompacted) or the rows start at from.
// Every row is decoded and checked: a damaged envelope, a row whose envelope
// names another stream or position, or a missing row inside the bounds is an
// ErrDataLoss naming the stream and position.
func (s *Store) Read(ctx context.Context, stream string, from uint64, limit int) ([]eventlog.Event, error) {
	if err := eventlog.ValidateStreamName(stream); err != nil {
		return nil, fmt.Errorf("read %s: %w", stream, err)
	}
	if limit <= 0 {
		return nil, errdefs.InvalidArgumentf("read %s: limit %d must be positive", stream, limit)
	}
	if from == 0 {
		from = 1
	}
	if from > 1<<63-1 {
		return []eventlog.Event{}, nil
	}
	rows, err := s.pool.Query(ctx, `
		SELECT s.tenant, s.first_seq, s.head_seq, e.seq, e.envelope
		FROM streams s
		LEFT JOIN LATERAL (
			SELECT seq, envelope FROM events
			WHERE stream = s.stream AND seq >= $2
			ORDER BY seq LIMIT $3
		) e ON true
		WHERE s.stream = $1`, stream, int64(from), limit)
	if err != nil {
		return nil, s.wrap("read "+stream, err)
	}
	defer rows.Close()

	out := []eventlog.Event{}
	var (
		tenant      string
		first, head uint64
		seq         *int64
		env         []byte
		sawStream   bool
	)
	want := from
	for rows.Next() {
		if err := rows.Scan(&tenant, &first, &head, &seq, &env); err != nil {
			return nil, s.wrap("read "+stream, err)
		}
		sawStream = true
		if from < first {
			return nil, errdefs.Compactedf("read %s from %d: events before %d were truncated", stream, from, first)
		}
		if seq == nil {
			break
		}
		got := uint64(*seq)
		if got != want {
			return nil, errdefs.DataLossf("read %s: event %s/%d is missing (next stored row is %d)", stream, stream, want, got)
		}
		ev, err := eventlog.Decode(env)
		if err != nil {
			return nil, fmt.Errorf("read %s: event %s/%d: %w", stream, stream, got, err)
		}
		if ev.Stream != stream || ev.Seq != got || ev.Tenant != tenant {
			return nil, errdefs.DataLossf("read %s: row %s/%d holds event %s/%d of tenant %q (stream tenant %q)",
				stream, stream, got, ev.Stream, ev.Seq, ev.Tenant, tenant)
		}
		out = append(out, ev)
		want++
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("read "+stream, err)
	}
	if !sawStream {
		return out, nil // a stream that was never appended to is empty
	}
	// Rows must reach the head or the limit; fewer means rows are gone.
	if from <= head && uint64(len(out)) < min(head-from+1, uint64(limit)) {
		return nil, errdefs.DataLossf("read %s: event %s/%d is missing (head is %d)", stream, stream, want, head)
	}
	return out, nil
}

// Bounds returns the retained range of stream ({1, 0} if it was never
// appended to).
func (s *Store) Bounds(ctx context.Context, stream string) (eventlog.Bounds, error) {
	if err := eventlog.ValidateStreamName(stream); err != nil {
		return eventlog.Bounds{}, fmt.Errorf("bounds %s: %w", stream, err)
	}
	var b eventlog.Bounds
	err := s.pool.QueryRow(ctx, `SELECT first_seq, head_seq FROM streams WHERE stream = $1`, stream).Scan(&b.First, &b.Head)
	if errors.Is(err, pgx.ErrNoRows) {
		return eventlog.Bounds{First: 1, Head: 0}, nil
	}
	if err != nil {
		return eventlog.Bounds{}, s.wrap("bounds "+stream, err)
	}
	return b, nil
}

// Truncate drops the events of stream with Seq < before, in one transaction
// holding the stream row lock. It requires a retained event at or after
// before, at most the head, that carries a CheckpointRef (checked on the
// decoded envelope, not only the index column); otherwise it fails with
// ErrFailedPrecondition. Truncating at or below the first retained position
// drops nothing and succeeds. Event ids of dropped events stay reserved, so a
// late retry of a dropped append still answers Duplicate.
func (s *Store) Truncate(ctx context.Context, stream string, before uint64) error {
	if err := eventlog.ValidateStreamName(stream); err != nil {
		return fmt.Errorf("truncate %s: %w", stream, err)
	}
	op := fmt.Sprintf("truncate %s before %d", stream, before)
	if before > 1<<63-1 {
		return errdefs.FailedPreconditionf("%s: beyond the head", op)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return s.wrap(op, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))

	var first, head uint64
	err = tx.QueryRow(ctx, `SELECT first_seq, head_seq FROM streams WHERE stream = $1 FOR UPDATE`, stream).Scan(&first, &head)
	if errors.Is(err, pgx.ErrNoRows) {
		first, head = 1, 0
	} else if err != nil {
		return s.wrap(op, err)
	}
	if before <= first {
		return nil
	}
	if before > head {
		return errdefs.FailedPreconditionf("%s: no checkpointed event at or after %d (head is %d)", op, before, head)
	}
	var seq uint64
	var env []byte
	err = tx.QueryRow(ctx, `
		SELECT seq, envelope FROM events
		WHERE stream = $1 AND seq >= $2 AND checkpoint_ref IS NOT NULL
		ORDER BY seq LIMIT 1`, stream, int64(before)).Scan(&seq, &env)
	if errors.Is(err, pgx.ErrNoRows) {
		return errdefs.FailedPreconditionf("%s: no event in %d..%d carries a checkpoint reference", op, before, head)
	}
	if err != nil {
		return s.wrap(op, err)
	}
	ev, err := eventlog.Decode(env)
	if err != nil {
		return fmt.Errorf("%s: event %s/%d: %w", op, stream, seq, err)
	}
	if ev.Stream != stream || ev.Seq != seq || ev.CheckpointRef == "" {
		return errdefs.DataLossf("%s: row %s/%d holds event %s/%d with checkpoint reference %q", op, stream, seq, ev.Stream, ev.Seq, ev.CheckpointRef)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM events WHERE stream = $1 AND seq < $2`, stream, int64(before)); err != nil {
		return s.wrap(op, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE streams SET first_seq = $2 WHERE stream = $1`, stream, int64(before)); err != nil {
		return s.wrap(op, err)
	}
	return s.wrap(op, tx.Commit(ctx))
}
