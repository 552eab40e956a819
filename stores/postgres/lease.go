package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// Lease rows store expires as Unix nanoseconds taken from the Store's clock,
// compared with the clock's now passed as a parameter. Each operation is one
// statement, atomic on its own; appends hold the row FOR SHARE, so an epoch
// change waits for appends in flight and is seen by every later one.

// Acquire grants holder the lease on stream with epoch one higher than the
// last, unless another holder's lease has not expired (ErrConflict).
func (s *Store) Acquire(ctx context.Context, stream, holder string, ttl time.Duration) (eventlog.Lease, error) {
	op := fmt.Sprintf("acquire %s for %s", stream, holder)
	if err := checkLeaseArgs(stream, holder, ttl); err != nil {
		return eventlog.Lease{}, fmt.Errorf("%s: %w", op, err)
	}
	now := s.clk.Now()
	expires := now.Add(ttl).UnixNano()
	var epoch uint64
	err := s.pool.QueryRow(ctx, `
		INSERT INTO leases AS l (stream, holder, epoch, expires) VALUES ($1, $2, 1, $3)
		ON CONFLICT (stream) DO UPDATE SET holder = EXCLUDED.holder, epoch = l.epoch + 1, expires = EXCLUDED.expires
		WHERE l.holder = '' OR l.holder = EXCLUDED.holder OR l.expires IS NULL OR l.expires <= $4
		RETURNING epoch`, stream, holder, expires, now.UnixNano()).Scan(&epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		cur, err := s.CurrentLease(ctx, stream)
		if err != nil {
			return eventlog.Lease{}, err
		}
		return eventlog.Lease{}, errdefs.Conflictf("%s: held by %s (epoch %d) until %s", op, cur.Holder, cur.Epoch, cur.Expires.Format(time.RFC3339Nano))
	}
	if err != nil {
		return eventlog.Lease{}, s.wrap(op, err)
	}
	return eventlog.Lease{Stream: stream, Holder: holder, Epoch: epoch, Expires: fromNanos(&expires)}, nil
}

// Renew extends l to now+ttl. It fails with ErrFenced when the stream's
// lease is no longer l (another epoch or holder), expired or not.
func (s *Store) Renew(ctx context.Context, l eventlog.Lease, ttl time.Duration) (eventlog.Lease, error) {
	op := fmt.Sprintf("renew %s epoch %d", l.Stream, l.Epoch)
	if err := checkLeaseArgs(l.Stream, l.Holder, ttl); err != nil {
		return eventlog.Lease{}, fmt.Errorf("%s: %w", op, err)
	}
	expires := s.clk.Now().Add(ttl).UnixNano()
	if err := s.updateLease(ctx, op, l, `UPDATE leases SET expires = $4 WHERE stream = $1 AND epoch = $2 AND holder = $3`, expires); err != nil {
		return eventlog.Lease{}, err
	}
	l.Expires = fromNanos(&expires)
	return l, nil
}

// Release ends l now, keeping its epoch. It fails with ErrFenced when the
// stream's lease is no longer l.
func (s *Store) Release(ctx context.Context, l eventlog.Lease) error {
	op := fmt.Sprintf("release %s epoch %d", l.Stream, l.Epoch)
	if err := checkLeaseArgs(l.Stream, l.Holder, time.Second); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return s.updateLease(ctx, op, l, `UPDATE leases SET expires = LEAST(expires, $4) WHERE stream = $1 AND epoch = $2 AND holder = $3`, s.clk.Now().UnixNano())
}

func (s *Store) updateLease(ctx context.Context, op string, l eventlog.Lease, sql string, nanos int64) error {
	if l.Epoch == 0 || l.Epoch > 1<<63-1 {
		return errdefs.Fencedf("%s: epoch %d was never granted", op, l.Epoch)
	}
	tag, err := s.pool.Exec(ctx, sql, l.Stream, int64(l.Epoch), l.Holder, nanos)
	if err != nil {
		return s.wrap(op, err)
	}
	if tag.RowsAffected() == 0 {
		cur, err := s.CurrentLease(ctx, l.Stream)
		if err != nil {
			return err
		}
		return errdefs.Fencedf("%s: the stream's lease is now epoch %d held by %q", op, cur.Epoch, cur.Holder)
	}
	return nil
}

// CurrentLease returns the stream's lease; epoch 0 and no holder if none was
// ever granted.
func (s *Store) CurrentLease(ctx context.Context, stream string) (eventlog.Lease, error) {
	if err := eventlog.ValidateStreamName(stream); err != nil {
		return eventlog.Lease{}, fmt.Errorf("lease of %s: %w", stream, err)
	}
	l := eventlog.Lease{Stream: stream}
	var expires *int64
	err := s.pool.QueryRow(ctx, `SELECT holder, epoch, expires FROM leases WHERE stream = $1`, stream).Scan(&l.Holder, &l.Epoch, &expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, nil
	}
	if err != nil {
		return eventlog.Lease{}, s.wrap("lease of "+stream, err)
	}
	l.Expires = fromNanos(expires)
	return l, nil
}

func checkLeaseArgs(stream, holder string, ttl time.Duration) error {
	if err := eventlog.ValidateStreamName(stream); err != nil {
		return err
	}
	if holder == "" || len(holder) > 256 {
		return errdefs.InvalidArgumentf("holder %.40q must be 1..256 bytes", holder)
	}
	if ttl <= 0 {
		return errdefs.InvalidArgumentf("ttl %s must be positive", ttl)
	}
	return nil
}

func fromNanos(ns *int64) time.Time {
	if ns == nil {
		return time.Time{}
	}
	return time.Unix(0, *ns).UTC()
}

// TakeOver moves stream's lease from holder from to holder to with the next
// epoch, whether or not from's lease has expired: the caller has
// established that from is gone (its node lease expired and the caller won
// the claim on that node, see meta.ClaimDeadNode), so waiting out the
// stream lease would only delay the failover. From the new epoch on, every
// append from's epoch carries is refused (ErrFenced).
//
// Of several callers taking over the same stream from the same holder,
// exactly one succeeds; the others get ErrConflict naming the new holder. A
// caller that already holds the lease (a retry after a lost answer) gets it
// back unchanged (renewed). A stream that never had a lease gets one as by
// Acquire.
func (s *Store) TakeOver(ctx context.Context, stream, from, to string, ttl time.Duration) (eventlog.Lease, error) {
	op := fmt.Sprintf("take over %s from %s for %s", stream, from, to)
	if err := checkLeaseArgs(stream, to, ttl); err != nil {
		return eventlog.Lease{}, fmt.Errorf("%s: %w", op, err)
	}
	expires := s.clk.Now().Add(ttl).UnixNano()
	var epoch uint64
	err := s.pool.QueryRow(ctx, `UPDATE leases SET holder = $3, epoch = epoch + 1, expires = $4
		WHERE stream = $1 AND holder = $2 RETURNING epoch`, stream, from, to, expires).Scan(&epoch)
	if err == nil {
		return eventlog.Lease{Stream: stream, Holder: to, Epoch: epoch, Expires: fromNanos(&expires)}, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return eventlog.Lease{}, s.wrap(op, err)
	}
	cur, err := s.CurrentLease(ctx, stream)
	if err != nil {
		return eventlog.Lease{}, err
	}
	switch {
	case cur.Epoch == 0:
		return s.Acquire(ctx, stream, to, ttl)
	case cur.Holder == to:
		return s.Renew(ctx, cur, ttl)
	}
	return eventlog.Lease{}, errdefs.Conflictf("%s: held by %s (epoch %d)", op, cur.Holder, cur.Epoch)
}
