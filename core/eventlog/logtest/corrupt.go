package logtest

import (
	"regexp"
	"strings"
	"testing"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// wantDataLoss fails unless err is an ErrDataLoss whose message names
// stream and seq.
func wantDataLoss(t *testing.T, err error, stream string, seq uint64, what string) {
	t.Helper()
	wantErr(t, err, errdefs.ErrDataLoss, "%s", what)
	msg := err.Error()
	if !strings.Contains(msg, stream) {
		t.Fatalf("%s: DataLoss %q does not name stream %s", what, msg, stream)
	}
	rest := strings.ReplaceAll(msg, stream, "")
	if !regexp.MustCompile(`\b` + regexp.QuoteMeta(seqStr(seq)) + `\b`).MatchString(rest) {
		t.Fatalf("%s: DataLoss %q does not name position %d", what, msg, seq)
	}
}

// testCorruption: a damaged event is reported as ErrDataLoss naming the
// stream and position, never handed out; its neighbours stay readable.
func testCorruption(t *testing.T, e *env) {
	if e.opts.Corrupt == nil {
		t.Skip("backend has no Corrupt hook")
	}
	s := e.stream("corrupt")
	e.append(t, s, 0, 0, evs(s, "e", 8)...)
	e.opts.Corrupt(t, e.store, s, 5)
	for _, r := range []struct {
		from  uint64
		limit int
	}{{1, 100}, {5, 1}, {4, 2}, {3, 7}} {
		evs, err := e.store.Read(e.ctx, s, r.from, r.limit)
		if len(evs) != 0 {
			t.Fatalf("Read(%d, %d) returned %d events with a damaged one in range", r.from, r.limit, len(evs))
		}
		wantDataLoss(t, err, s, 5, "Read over the damaged event")
	}
	wantSeqs(t, "Read before the damage", mustRead(t, e, s, 1, 4), 1, 4)
	wantSeqs(t, "Read after the damage", mustRead(t, e, s, 6, 100), 6, 8)

	// A subscription delivers at most what precedes the damage, then stops
	// with the same error.
	sub := eventlog.Subscribe(e.store, s, 1)
	for i := 1; ; i++ {
		x, err := sub.Next(e.ctx)
		if err != nil {
			wantDataLoss(t, err, s, 5, "subscription reaching the damaged event")
			break
		}
		if x.Seq != uint64(i) || x.Seq >= 5 {
			t.Fatalf("subscription delivered %d as event number %d", x.Seq, i)
		}
	}
}

func mustRead(t *testing.T, e *env, s string, from uint64, limit int) []eventlog.Event {
	t.Helper()
	evs, err := e.store.Read(e.ctx, s, from, limit)
	if err != nil {
		t.Fatalf("Read(%s, %d, %d): %v", s, from, limit, err)
	}
	return evs
}
