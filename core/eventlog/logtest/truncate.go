package logtest

import (
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// checkpointed appends n events to a new stream; those at the positions in
// ckpts carry a CheckpointRef.
func (e *env) checkpointed(t *testing.T, name string, n int, ckpts ...uint64) string {
	t.Helper()
	s := e.stream(name)
	batch := evs(s, "e", n)
	for _, c := range ckpts {
		batch[c-1].CheckpointRef = "ckpt-" + name
	}
	e.append(t, s, 0, 0, batch...)
	return s
}

// testTruncate: dropping what a checkpoint covers, then reading and
// appending around it.
func testTruncate(t *testing.T, e *env) {
	s := e.checkpointed(t, "trunc", 10, 6)
	if err := e.store.Truncate(e.ctx, s, 6); err != nil {
		t.Fatalf("Truncate(6) with a checkpoint at 6: %v", err)
	}
	e.wantBounds(t, s, 6, 10)
	for _, from := range []uint64{1, 2, 5} {
		_, err := e.store.Read(e.ctx, s, from, 10)
		wantErr(t, err, errdefs.ErrCompacted, "Read from %d after Truncate(6)", from)
	}
	wantSeqs(t, "Read from 6", e.readAll(t, s, 6), 6, 10)
	wantSeqs(t, "Read from 8", e.readAll(t, s, 8), 8, 10)

	// Appends continue gap-free at the head.
	res := e.append(t, s, 0, 10, evs(s, "after", 2)...)
	if res.First != 11 || res.Last != 12 {
		t.Fatalf("append after Truncate = %+v, want 11..12", res)
	}
	e.wantBounds(t, s, 6, 12)
	wantSeqs(t, "Read after append", e.readAll(t, s, 6), 6, 12)

	// Again at the same position: nothing more to drop, still fine.
	if err := e.store.Truncate(e.ctx, s, 6); err != nil {
		t.Fatalf("repeated Truncate(6): %v", err)
	}
	e.wantBounds(t, s, 6, 12)

	// A subscription from below the first retained position fails.
	_, err := eventlog.Subscribe(e.store, s, 3).Next(e.ctx)
	wantErr(t, err, errdefs.ErrCompacted, "Subscribe from 3 after Truncate(6)")

	// A second checkpoint lets it move on.
	ck := ev(s, "ck2", "state")
	ck.CheckpointRef = "ckpt-2"
	e.append(t, s, 0, 12, ck)
	if err := e.store.Truncate(e.ctx, s, 13); err != nil {
		t.Fatalf("Truncate(13) with a checkpoint at 13: %v", err)
	}
	e.wantBounds(t, s, 13, 13)
	wantSeqs(t, "Read from 13", e.readAll(t, s, 13), 13, 13)
	_, err = e.store.Read(e.ctx, s, 12, 10)
	wantErr(t, err, errdefs.ErrCompacted, "Read from 12 after Truncate(13)")
}

// testTruncateRefused: nothing is dropped that no checkpoint covers.
func testTruncateRefused(t *testing.T, e *env) {
	s := e.checkpointed(t, "trunc-refused", 10, 6)
	for _, before := range []uint64{7, 10, 11, 1000} {
		err := e.store.Truncate(e.ctx, s, before)
		wantErr(t, err, errdefs.ErrFailedPrecondition, "Truncate(%d) with the only checkpoint at 6", before)
	}
	e.wantBounds(t, s, 1, 10)
	wantSeqs(t, "Read after refused truncations", e.readAll(t, s, 1), 1, 10)

	plain := e.checkpointed(t, "trunc-plain", 5)
	err := e.store.Truncate(e.ctx, plain, 3)
	wantErr(t, err, errdefs.ErrFailedPrecondition, "Truncate(3) of a stream without checkpoints")
	e.wantBounds(t, plain, 1, 5)

	err = e.store.Truncate(e.ctx, e.stream("trunc-empty"), 5)
	wantErr(t, err, errdefs.ErrFailedPrecondition, "Truncate(5) of an empty stream")
	err = e.store.Truncate(e.ctx, "", 5)
	wantErr(t, err, errdefs.ErrInvalidArgument, "Truncate of an invalid stream name")
}
