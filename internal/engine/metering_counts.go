package engine

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/egress/gateway"
)

// Counting meters from the durable facts (see "Counts come from the durable
// facts" in metering.go).

// cursorsFrom sets m's cursors from rec, the sandbox's newest cpu_seconds
// record. A record written before records carried cursors means the counts
// up to now were kept by the older daemon's memory: counting starts at the
// streams' current heads. Errors leave the cursors unset (tried again at
// the next interval).
func (e *billing) cursorsFrom(ctx context.Context, m *sbxMeter, id string, rec UsageRecord) {
	if rec.Cursors {
		m.sbxSeq, m.effSeq, m.cursors = rec.SandboxSeq, rec.EffectsSeq, true
		return
	}
	sb, err := e.log.Bounds(ctx, Stream(id))
	if err != nil {
		e.lg.Warn("metering: sandbox stream bounds", "sandbox_id", id, "err", err)
		return
	}
	ef, err := e.log.Bounds(ctx, gateway.Stream(id))
	if err != nil {
		e.lg.Warn("metering: effect journal bounds", "sandbox_id", id, "err", err)
		return
	}
	m.sbxSeq, m.effSeq, m.cursors, m.moved = sb.Head, ef.Head, true, true
}

// logCounts is what one sandbox's streams added since the cursors.
type logCounts struct {
	checkpoints, restores  int64
	egressReq, egressBytes int64
	sbxSeq, effSeq         uint64
}

// countLogs reads sandbox id's stream after sbxSeq and its effect journal
// after effSeq (without the metering lock) and counts what they hold.
func (e *billing) countLogs(ctx context.Context, id string, sbxSeq, effSeq uint64) (logCounts, error) {
	c := logCounts{sbxSeq: sbxSeq, effSeq: effSeq}
	err := e.readAfter(ctx, Stream(id), &c.sbxSeq, func(ev eventlog.Event) error {
		switch ev.Type {
		case EventCheckpointed:
			c.checkpoints++
		case EventRestored:
			c.restores++
		}
		return nil
	})
	if err != nil {
		return c, err
	}
	err = e.readAfter(ctx, gateway.Stream(id), &c.effSeq, func(ev eventlog.Event) error {
		if ev.Type != gateway.EventOutcome {
			return nil
		}
		var o gateway.OutcomePayload
		if json.Unmarshal(ev.Payload, &o) != nil || o.Reconciled != "" {
			return nil // an operator's reconciliation reached no upstream
		}
		c.egressReq++
		c.egressBytes += o.RequestBytes + o.ResponseBytes
		return nil
	})
	return c, err
}

// readAfter calls fn for each event of stream after *seq, a page at a time,
// moving *seq to the last one read; an error of fn stops it there. Events
// truncated away are skipped — after a cursor (*seq > 0) that is worth a
// warning: retention waits for metering (meterKeepFrom).
func (e *billing) readAfter(ctx context.Context, stream string, seq *uint64, fn func(eventlog.Event) error) error {
	for {
		evs, err := e.log.Read(ctx, stream, *seq+1, usageReadPage)
		if errors.Is(err, errdefs.ErrCompacted) {
			b, berr := e.log.Bounds(ctx, stream)
			if berr != nil {
				return berr
			}
			if *seq > 0 {
				e.lg.Warn("metering: events truncated before they were read", "stream", stream, "from", *seq+1, "first", b.First)
			}
			*seq = b.First - 1
			continue
		}
		if err != nil {
			return err
		}
		for _, ev := range evs {
			if err := fn(ev); err != nil {
				return err
			}
			*seq = ev.Seq
		}
		if len(evs) < usageReadPage {
			return nil
		}
	}
}

// meterKeepFrom bounds a retention truncation of sandbox id's stream so
// that it never drops an event metering has not counted yet: it returns
// the lowest sequence number that must stay (0: no bound — metering off,
// or the sandbox's counts were kept by a daemon of before the cursors).
func (e *billing) meterKeepFrom(ctx context.Context, tenant, id string) (uint64, error) {
	if e.mtr.every <= 0 {
		return 0, nil
	}
	e.mtr.state.mu.Lock()
	if m := e.mtr.state.sbx[id]; m != nil && m.cursors {
		defer e.mtr.state.mu.Unlock()
		return m.sbxSeq + 1, nil
	}
	e.mtr.state.mu.Unlock()
	// Not tracked now: its cursor is in its newest cpu_seconds record.
	rec, ok, err := e.lastUsage(ctx, tenant, id)
	switch {
	case err != nil:
		return 0, err
	case !ok:
		return 1, nil // nothing counted yet
	case !rec.Cursors:
		return 0, nil
	}
	return rec.SandboxSeq + 1, nil
}

// ensureCursors sets the cursors of m, a sandbox only counted in memory so
// far, from its newest cpu_seconds record. Called with mu held.
func (e *billing) ensureCursors(ctx context.Context, id string, m *sbxMeter) {
	rec, ok, err := e.lastUsage(ctx, m.tenant, id)
	if err != nil {
		e.lg.Warn("metering: read last usage record", "sandbox_id", id, "err", err)
		return
	}
	if !ok {
		rec = UsageRecord{Cursors: true} // never recorded: count from the start
	}
	e.cursorsFrom(ctx, m, id, rec)
}
