package sqlite

import (
	"context"
	"database/sql"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// Leases are written by the writer goroutine, in the same transactions as
// appends: an append's fencing check and a grant are serialized.

// Acquire implements eventlog.Store.
func (s *Store) Acquire(ctx context.Context, stream, holder string, ttl time.Duration) (eventlog.Lease, error) {
	if err := checkLeaseArgs(stream, holder, ttl); err != nil {
		return eventlog.Lease{}, err
	}
	var out eventlog.Lease
	err := s.w.submit(ctx, &op{apply: func(w *writer) error {
		cur, err := w.lease(stream)
		if err != nil {
			return err
		}
		now := s.clk.Now()
		if cur.Holder != "" && cur.Holder != holder && now.Before(cur.Expires) {
			return errdefs.Conflictf("acquire %s for %s: held by %s (epoch %d) until %s", stream, holder, cur.Holder, cur.Epoch, cur.Expires.Format(time.RFC3339Nano))
		}
		out = eventlog.Lease{Stream: stream, Holder: holder, Epoch: cur.Epoch + 1, Expires: now.Add(ttl)}
		return w.putLease(out)
	}})
	return out, err
}

// Renew implements eventlog.Store.
func (s *Store) Renew(ctx context.Context, l eventlog.Lease, ttl time.Duration) (eventlog.Lease, error) {
	if err := checkLeaseArgs(l.Stream, l.Holder, ttl); err != nil {
		return eventlog.Lease{}, err
	}
	var out eventlog.Lease
	err := s.w.submit(ctx, &op{apply: func(w *writer) error {
		if err := w.checkEpoch("renew", l); err != nil {
			return err
		}
		out = l
		out.Expires = s.clk.Now().Add(ttl)
		return w.putLease(out)
	}})
	return out, err
}

// Release implements eventlog.Store.
func (s *Store) Release(ctx context.Context, l eventlog.Lease) error {
	if err := checkLeaseArgs(l.Stream, l.Holder, time.Nanosecond); err != nil {
		return err
	}
	return s.w.submit(ctx, &op{apply: func(w *writer) error {
		if err := w.checkEpoch("release", l); err != nil {
			return err
		}
		l.Expires = s.clk.Now()
		return w.putLease(l)
	}})
}

// CurrentLease implements eventlog.Store.
func (s *Store) CurrentLease(ctx context.Context, stream string) (eventlog.Lease, error) {
	if err := eventlog.ValidateStreamName(stream); err != nil {
		return eventlog.Lease{}, err
	}
	l, err := scanLease(stream, s.rdb.QueryRowContext(ctx, leaseQuery, stream))
	if err != nil {
		return eventlog.Lease{}, dbErr(s.path, "lease "+stream, err)
	}
	return l, nil
}

func checkLeaseArgs(stream, holder string, ttl time.Duration) error {
	if err := eventlog.ValidateStreamName(stream); err != nil {
		return err
	}
	if holder == "" {
		return errdefs.InvalidArgumentf("lease on %s: empty holder", stream)
	}
	if ttl <= 0 {
		return errdefs.InvalidArgumentf("lease on %s: ttl %v must be positive", stream, ttl)
	}
	return nil
}

const leaseQuery = `SELECT holder, epoch, expires_ns FROM leases WHERE stream = ?`

func scanLease(stream string, row *sql.Row) (eventlog.Lease, error) {
	l := eventlog.Lease{Stream: stream}
	var epoch, expires int64
	switch err := row.Scan(&l.Holder, &epoch, &expires); err {
	case nil:
		l.Epoch, l.Expires = uint64(epoch), time.Unix(0, expires).UTC()
	case sql.ErrNoRows:
	default:
		return l, err
	}
	return l, nil
}

func (w *writer) lease(stream string) (eventlog.Lease, error) {
	return scanLease(stream, w.conn.QueryRowContext(bg, leaseQuery, stream))
}

// checkEpoch fences a renew or release by a holder whose epoch is not the
// stream's current one.
func (w *writer) checkEpoch(what string, l eventlog.Lease) error {
	cur, err := w.lease(l.Stream)
	if err != nil {
		return err
	}
	if cur.Epoch != l.Epoch || cur.Holder != l.Holder {
		return errdefs.Fencedf("%s lease on %s: epoch %d of %s is stale, the lease is at epoch %d (%s)", what, l.Stream, l.Epoch, l.Holder, cur.Epoch, cur.Holder)
	}
	return nil
}

func (w *writer) putLease(l eventlog.Lease) error {
	_, err := w.conn.ExecContext(bg, `INSERT INTO leases (stream, holder, epoch, expires_ns) VALUES (?, ?, ?, ?)
		ON CONFLICT (stream) DO UPDATE SET holder = excluded.holder, epoch = excluded.epoch, expires_ns = excluded.expires_ns`,
		l.Stream, l.Holder, int64(l.Epoch), l.Expires.UnixNano())
	return err
}
