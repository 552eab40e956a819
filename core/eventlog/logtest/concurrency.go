package logtest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// ack is one acknowledged append.
type ack struct {
	first, last uint64
	ids         []string
}

// refusal is one refused append.
type refusal struct {
	ids []string
	err error
}

// testConcurrency: opts.Writers goroutines each append to their own stream
// at the head they expect, while two racers fight over one stream by taking
// its lease from each other, so that each of them keeps writing with an
// epoch that has gone stale. Afterwards every stream is gap-free, every
// acknowledged append is there exactly once at its positions, nothing
// refused is there, and along the raced stream the writers' epochs never go
// down (a stale-epoch append that slipped through would break that).
func testConcurrency(t *testing.T, e *env) {
	writers, perWriter := e.opts.Writers, e.opts.AppendsPerWriter
	var wg, writersWG sync.WaitGroup
	errs := make(chan error, writers+2)
	streams := make([]string, writers)
	acks := make([][]ack, writers)
	for w := range writers {
		streams[w] = e.stream(fmt.Sprintf("w%02d", w))
		writersWG.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			s, head := streams[w], uint64(0)
			for i := range perWriter {
				batch := evs(s, fmt.Sprintf("a%d-", i), 1+rng.IntN(3))
				res, err := e.store.Append(e.ctx, s, 0, head, batch...)
				if err != nil {
					errs <- fmt.Errorf("writer %d append %d at head %d: %w", w, i, head, err)
					return
				}
				if res.Duplicate || res.First != head+1 || res.Last != head+uint64(len(batch)) {
					errs <- fmt.Errorf("writer %d append %d at head %d: %+v", w, i, head, res)
					return
				}
				acks[w] = append(acks[w], ack{res.First, res.Last, ids(batch)})
				head = res.Last
			}
		})
	}

	// The racers. Each loops: make sure it holds a lease (taking it from
	// the other when that one's lease expired, which it forces by moving
	// the clock), append one event carrying its epoch, and now and then
	// re-take the lease on purpose. A racer whose append is fenced drops
	// its lease and tries again.
	raced := e.stream("raced")
	var (
		writersDone atomic.Bool
		fenced      atomic.Int64
		mu          sync.Mutex
		racedAcks   []ack
		refused     []refusal
	)
	const minFenced, minAcked, maxIters = 4, 40, 5000
	for r := range 2 {
		holder := fmt.Sprintf("racer-%d", r)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 2))
			var l eventlog.Lease
			for i := 0; i < maxIters; i++ {
				mu.Lock()
				acked := len(racedAcks)
				mu.Unlock()
				if writersDone.Load() && fenced.Load() >= minFenced && acked >= minAcked {
					return
				}
				if l.Epoch == 0 || rng.IntN(4) == 0 {
					got, err := e.store.Acquire(e.ctx, raced, holder, time.Minute)
					if errdefs.IsConflict(err) {
						e.clk.Advance(time.Minute + time.Millisecond)
						got, err = e.store.Acquire(e.ctx, raced, holder, time.Minute)
					}
					if errdefs.IsConflict(err) {
						continue // the other one got there first
					}
					if err != nil {
						errs <- fmt.Errorf("%s acquire: %w", holder, err)
						return
					}
					l = got
				}
				x := ev(raced, fmt.Sprintf("%s-%d", holder, i), map[string]any{"epoch": l.Epoch, "holder": holder})
				res, err := e.store.Append(e.ctx, raced, l.Epoch, eventlog.Any, x)
				mu.Lock()
				switch {
				case err == nil:
					racedAcks = append(racedAcks, ack{res.First, res.Last, []string{x.ID}})
				case errdefs.IsFenced(err):
					refused = append(refused, refusal{[]string{x.ID}, err})
					fenced.Add(1)
					l = eventlog.Lease{}
				default:
					mu.Unlock()
					errs <- fmt.Errorf("%s append with epoch %d: %w", holder, l.Epoch, err)
					return
				}
				mu.Unlock()
			}
			errs <- fmt.Errorf("%s: %d iterations without %d fenced and %d acknowledged appends (got %d fenced)", holder, maxIters, minFenced, minAcked, fenced.Load())
		})
	}
	writersWG.Wait()
	writersDone.Store(true)
	wg.Wait()
	close(errs)
	var failed bool
	for err := range errs {
		t.Error(err)
		failed = true
	}
	if failed {
		t.FailNow()
	}

	for w, s := range streams {
		checkAcked(t, e, s, acks[w], nil)
	}
	all := checkAcked(t, e, raced, racedAcks, refused)
	if len(refused) < minFenced {
		t.Fatalf("only %d fenced appends on the raced stream; the race did not happen", len(refused))
	}
	var prev uint64
	for _, x := range all {
		var p struct{ Epoch uint64 }
		if err := json.Unmarshal(x.Payload, &p); err != nil {
			t.Fatal(err)
		}
		if p.Epoch < prev {
			t.Fatalf("raced stream: event %d (%s) was written with epoch %d after an event with epoch %d: a stale epoch got through", x.Seq, x.ID, p.Epoch, prev)
		}
		prev = p.Epoch
	}
	t.Logf("raced stream: %d appends acknowledged, %d fenced", len(racedAcks), len(refused))
}

// checkAcked reads stream and checks it is gap-free from 1, holds every
// acknowledged append at its positions exactly once, and none of the
// refused ids. It returns the events.
func checkAcked(t *testing.T, e *env, stream string, acks []ack, refused []refusal) []eventlog.Event {
	t.Helper()
	all := e.readAll(t, stream, 1)
	wantSeqs(t, stream, all, 1, uint64(len(all)))
	e.wantBounds(t, stream, 1, uint64(len(all)))
	pos := map[string]uint64{}
	for _, x := range all {
		if p, dup := pos[x.ID]; dup {
			t.Fatalf("%s: id %s at %d and %d", stream, x.ID, p, x.Seq)
		}
		pos[x.ID] = x.Seq
	}
	n := 0
	for _, a := range acks {
		for i, id := range a.ids {
			if got, ok := pos[id]; !ok || got != a.first+uint64(i) {
				t.Fatalf("%s: acknowledged %s at %d is at %d (present: %v)", stream, id, a.first+uint64(i), got, ok)
			}
			n++
		}
	}
	if n != len(all) {
		t.Fatalf("%s: %d events stored, %d acknowledged", stream, len(all), n)
	}
	for _, r := range refused {
		for _, id := range r.ids {
			if p, ok := pos[id]; ok {
				t.Fatalf("%s: refused append (%v) is stored at %d", stream, r.err, p)
			}
		}
	}
	return all
}

func ids(evs []eventlog.Event) []string {
	out := make([]string, len(evs))
	for i, x := range evs {
		out[i] = x.ID
	}
	return out
}
