package sqlite

import (
	"context"
	"database/sql"
	"sync"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// readQuery reads the stream row and up to ?3 events from ?2 in ONE
// statement, so the bounds and the events come from the same snapshot even
// while Truncate runs.
const readQuery = `
SELECT s.tenant, s.first_seq, s.head_seq, e.seq, e.env
FROM streams s LEFT JOIN events e ON e.sid = s.sid AND e.seq >= ?2
WHERE s.stream = ?1
ORDER BY e.seq
LIMIT ?3`

// Read implements eventlog.Store. Every envelope is decoded and checked
// against its row: a stored stream, seq or tenant that differs from the
// row's, a checksum or decoding failure, or a missing position below the
// head is an ErrDataLoss naming the stream and position.
func (s *Store) Read(ctx context.Context, stream string, from uint64, limit int) ([]eventlog.Event, error) {
	if err := eventlog.ValidateStreamName(stream); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, errdefs.InvalidArgumentf("read %s: limit %d must be positive", stream, limit)
	}
	from = max(from, 1)
	rows, err := s.rdb.QueryContext(ctx, readQuery, stream, int64(from), limit)
	if err != nil {
		return nil, dbErr(s.path, "read "+stream, err)
	}
	defer rows.Close()
	var (
		tenant      string
		first, head int64
		seq         sql.NullInt64
		tenantRaw   sql.RawBytes
		envRaw      sql.RawBytes
		raws        []rawEvent
		arena       []byte
		next        = from
	)
	for rows.Next() {
		if err := rows.Scan(&tenantRaw, &first, &head, &seq, &envRaw); err != nil {
			return nil, dbErr(s.path, "read "+stream, err)
		}
		if from < uint64(first) {
			return nil, errdefs.Compactedf("read %s from %d: events before %d were truncated", stream, from, first)
		}
		if raws == nil {
			tenant = string(tenantRaw)
			n := min(limit, int(max(head-int64(from)+1, 1)))
			raws = make([]rawEvent, 0, n)
			arena = make([]byte, 0, min(n*(len(envRaw)+16), 8<<20))
		}
		if !seq.Valid { // the stream exists, nothing at or after from
			break
		}
		if uint64(seq.Int64) != next {
			return nil, errdefs.DataLossf("stream %s seq %d: event is missing (found %d next)", stream, next, seq.Int64)
		}
		// envRaw is only valid until the next row: keep a copy.
		off := len(arena)
		arena = append(arena, envRaw...)
		raws = append(raws, rawEvent{seq: next, env: arena[off:len(arena):len(arena)]})
		next++
	}
	if err := rows.Err(); err != nil {
		return nil, dbErr(s.path, "read "+stream, err)
	}
	if len(raws) < limit && next <= uint64(head) {
		return nil, errdefs.DataLossf("stream %s seq %d: event is missing (head is %d)", stream, next, head)
	}
	return decodeAll(stream, tenant, raws)
}

type rawEvent struct {
	seq uint64
	env []byte
}

// decodeChunk is how many envelopes one goroutine decodes; a page shorter
// than two chunks is decoded inline.
const decodeChunk = 256

// decodeAll decodes and cross-checks raws, spreading long pages over the
// CPUs (decoding is most of a replay's cost). The error reported is the one
// at the lowest position.
func decodeAll(stream, tenant string, raws []rawEvent) ([]eventlog.Event, error) {
	out := make([]eventlog.Event, len(raws))
	chunks := (len(raws) + decodeChunk - 1) / decodeChunk
	errs := make([]error, chunks)
	var wg sync.WaitGroup
	for c := range chunks {
		lo, hi := c*decodeChunk, min((c+1)*decodeChunk, len(raws))
		work := func() { errs[c] = decodeRange(stream, tenant, raws[lo:hi], out[lo:hi]) }
		if c == chunks-1 {
			work()
		} else {
			wg.Go(work)
		}
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func decodeRange(stream, tenant string, raws []rawEvent, out []eventlog.Event) error {
	for i, r := range raws {
		ev, err := eventlog.Decode(r.env)
		if err != nil {
			return errdefs.DataLossf("stream %s seq %d: %v", stream, r.seq, err)
		}
		if ev.Stream != stream || ev.Seq != r.seq || ev.Tenant != tenant {
			return errdefs.DataLossf("stream %s seq %d: stored envelope is for %s/%d of tenant %q", stream, r.seq, ev.Stream, ev.Seq, ev.Tenant)
		}
		out[i] = ev
	}
	return nil
}

// Bounds implements eventlog.Store.
func (s *Store) Bounds(ctx context.Context, stream string) (eventlog.Bounds, error) {
	if err := eventlog.ValidateStreamName(stream); err != nil {
		return eventlog.Bounds{}, err
	}
	var first, head int64
	err := s.rdb.QueryRowContext(ctx, `SELECT first_seq, head_seq FROM streams WHERE stream = ?`, stream).Scan(&first, &head)
	switch err {
	case nil:
		return eventlog.Bounds{First: uint64(first), Head: uint64(head)}, nil
	case sql.ErrNoRows:
		return eventlog.Bounds{First: 1, Head: 0}, nil
	default:
		return eventlog.Bounds{}, dbErr(s.path, "bounds "+stream, err)
	}
}

// Truncate implements eventlog.Store. Ids of dropped events stay known, so
// re-sending an append that was truncated since is still a no-op. Truncating
// at or below the first retained position drops nothing and succeeds.
func (s *Store) Truncate(ctx context.Context, stream string, before uint64) error {
	if err := eventlog.ValidateStreamName(stream); err != nil {
		return err
	}
	return s.w.submit(ctx, &op{apply: func(w *writer) error {
		var sid, first, head int64
		err := w.conn.QueryRowContext(bg, `SELECT sid, first_seq, head_seq FROM streams WHERE stream = ?`, stream).Scan(&sid, &first, &head)
		if err == sql.ErrNoRows {
			return errdefs.FailedPreconditionf("truncate %s before %d: the stream is empty", stream, before)
		}
		if err != nil {
			return err
		}
		if before <= uint64(first) {
			return nil
		}
		if before > uint64(head) {
			return errdefs.FailedPreconditionf("truncate %s before %d: past the head %d (an event at or after it must carry a checkpoint reference)", stream, before, head)
		}
		var ckpt int64
		err = w.conn.QueryRowContext(bg, `SELECT seq FROM events WHERE sid = ? AND checkpoint = 1 AND seq >= ? ORDER BY seq LIMIT 1`, sid, int64(before)).Scan(&ckpt)
		if err == sql.ErrNoRows {
			return errdefs.FailedPreconditionf("truncate %s before %d: no event in %d..%d carries a checkpoint reference", stream, before, before, head)
		}
		if err != nil {
			return err
		}
		if _, err := w.conn.ExecContext(bg, `DELETE FROM events WHERE sid = ? AND seq < ?`, sid, int64(before)); err != nil {
			return err
		}
		_, err = w.conn.ExecContext(bg, `UPDATE streams SET first_seq = ? WHERE sid = ?`, int64(before), sid)
		return err
	}})
}
