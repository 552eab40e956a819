package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"strings"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// appendOp is one Append call on its way through the writer.
type appendOp struct {
	stream      string
	tenant      string
	epoch       uint64
	expectedSeq uint64
	events      []eventlog.Event // Stream and Time filled, Seq assigned by apply
	digests     [][]byte         // eventlog.ContentDigest, decoded
	// dedupe is set when an id turned out to exist: the retry only checks
	// whether the batch is a re-send.
	dedupe bool
	res    eventlog.AppendResult
}

// Append implements eventlog.Store. It returns after the group commit that
// holds the batch is durable (see the package comment).
func (s *Store) Append(ctx context.Context, stream string, epoch, expectedSeq uint64, events ...eventlog.Event) (eventlog.AppendResult, error) {
	a, err := s.newAppend(stream, epoch, expectedSeq, events)
	if err != nil {
		return eventlog.AppendResult{}, err
	}
	if err := s.w.submit(ctx, &op{apply: a.apply, notify: stream}); err != nil {
		return eventlog.AppendResult{}, err
	}
	return a.res, nil
}

// newAppend validates a batch and prepares everything that does not need
// the database, off the writer goroutine.
func (s *Store) newAppend(stream string, epoch, expectedSeq uint64, events []eventlog.Event) (*appendOp, error) {
	if err := eventlog.ValidateStreamName(stream); err != nil {
		return nil, err
	}
	if len(events) == 0 {
		return nil, errdefs.InvalidArgumentf("append to %s: no events", stream)
	}
	a := &appendOp{
		stream: stream, tenant: events[0].Tenant, epoch: epoch, expectedSeq: expectedSeq,
		events:  make([]eventlog.Event, len(events)),
		digests: make([][]byte, len(events)),
	}
	seen := make(map[string]struct{}, len(events))
	now := s.clk.Now()
	for i, ev := range events {
		if err := eventlog.ValidateNew(stream, ev); err != nil {
			return nil, err
		}
		if ev.Tenant != a.tenant {
			return nil, errdefs.InvalidArgumentf("append to %s: batch mixes tenants %q and %q", stream, a.tenant, ev.Tenant)
		}
		if _, dup := seen[ev.ID]; dup {
			return nil, errdefs.InvalidArgumentf("append to %s: id %s appears twice in the batch", stream, ev.ID)
		}
		seen[ev.ID] = struct{}{}
		ev.Stream, ev.Seq = stream, 0
		if ev.Time.IsZero() {
			ev.Time = now
		}
		a.events[i] = ev
		a.digests[i], _ = hex.DecodeString(eventlog.ContentDigest(stream, ev))
	}
	return a, nil
}

// apply runs on the writer goroutine inside the op's savepoint. The order
// of checks is the contract's: a re-sent batch is a Duplicate even when its
// expectedSeq or epoch is stale; otherwise a stale epoch is Fenced before a
// wrong expectedSeq is a Conflict.
func (a *appendOp) apply(w *writer) error {
	var (
		sid        sql.NullInt64
		tenant     sql.NullString
		head       sql.NullInt64
		leaseEpoch int64
	)
	if err := w.st.lookup.QueryRow(a.stream).Scan(&sid, &tenant, &head, &leaseEpoch); err != nil {
		return err
	}
	if sid.Valid && tenant.String != a.tenant {
		return errdefs.InvalidArgumentf("append to %s: the stream belongs to tenant %q, not %q", a.stream, tenant.String, a.tenant)
	}
	if a.dedupe {
		found, err := a.checkDuplicate(w)
		if err == nil && !found {
			err = errdefs.Conflictf("append to %s: ids changed while appending", a.stream)
		}
		return err
	}
	stale := a.epoch < uint64(leaseEpoch)
	if stale || (a.expectedSeq != eventlog.Any && a.expectedSeq != uint64(head.Int64)) {
		found, err := a.checkDuplicate(w)
		switch {
		case err != nil || found:
			return err
		case stale:
			return errdefs.Fencedf("append to %s with epoch %d: the lease epoch is %d", a.stream, a.epoch, leaseEpoch)
		default:
			return errdefs.Conflictf("append to %s: expected head %d, head is %d", a.stream, a.expectedSeq, head.Int64)
		}
	}
	if !sid.Valid {
		if err := w.st.newStream.QueryRow(a.stream, a.tenant).Scan(&sid); err != nil {
			return err
		}
	}
	first := uint64(head.Int64) + 1
	for i := range a.events {
		ev := &a.events[i]
		ev.Seq = first + uint64(i)
		r, err := w.st.insID.Exec(ev.ID, sid.Int64, int64(ev.Seq), a.digests[i])
		if err != nil {
			return err
		}
		if n, err := r.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			a.dedupe = true
			return errRetry
		}
		env, err := eventlog.Encode(*ev)
		if err != nil {
			return err
		}
		ckpt := 0
		if ev.CheckpointRef != "" {
			ckpt = 1
		}
		if _, err := w.st.insEvent.Exec(sid.Int64, int64(ev.Seq), ckpt, env); err != nil {
			return err
		}
	}
	last := first + uint64(len(a.events)) - 1
	if _, err := w.st.setHead.Exec(int64(last), sid.Int64); err != nil {
		return err
	}
	a.res = eventlog.AppendResult{First: first, Last: last}
	return nil
}

// checkDuplicate reports whether the batch was appended before, exactly as
// it is now (found, a.res set to the original positions). Some ids known and
// others not, or a known id with other content, is a Conflict.
func (a *appendOp) checkDuplicate(w *writer) (found bool, err error) {
	var known, unknown []string
	var first, prev int64
	for i, ev := range a.events {
		var seq int64
		var digest []byte
		switch err := w.st.getID.QueryRow(ev.ID).Scan(&seq, &digest); err {
		case nil:
		case sql.ErrNoRows:
			unknown = append(unknown, ev.ID)
			continue
		default:
			return false, err
		}
		known = append(known, ev.ID)
		if !bytes.Equal(digest, a.digests[i]) {
			return false, errdefs.Conflictf("append to %s: event id %s was appended before with different content", a.stream, ev.ID)
		}
		if len(known) == 1 {
			first = seq
		} else if seq != prev+1 {
			return false, errdefs.Conflictf("append to %s: ids %s were appended before, but not as this batch", a.stream, strings.Join(known, ", "))
		}
		prev = seq
	}
	switch {
	case len(known) == 0:
		return false, nil
	case len(unknown) > 0:
		return false, errdefs.Conflictf("append to %s: batch mixes ids appended before (%s) with new ones (%s)",
			a.stream, abbrev(known), abbrev(unknown))
	}
	a.res = eventlog.AppendResult{First: uint64(first), Last: uint64(prev), Duplicate: true}
	return true, nil
}

func abbrev(ids []string) string {
	if len(ids) > 3 {
		return strings.Join(ids[:3], ", ") + ", …"
	}
	return strings.Join(ids, ", ")
}
