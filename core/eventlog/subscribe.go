package eventlog

import (
	"context"
	"time"
)

// PollInterval is how often a Subscription re-reads a stream when its Store
// cannot notify it (or the append happened in another process).
var PollInterval = 50 * time.Millisecond

// Subscription follows one stream, delivering every event in order exactly
// once. It holds only its position: to survive a reconnect, a client
// remembers the Seq of the last event it processed and subscribes again from
// Seq+1 — it misses nothing and sees nothing twice.
type Subscription struct {
	store  Store
	stream string
	next   uint64
	buf    []Event
	batch  int
}

// Subscribe returns a Subscription on stream starting at position from (1 for
// the beginning). Reading below the retained range fails with ErrCompacted at
// the first Next.
func Subscribe(store Store, stream string, from uint64) *Subscription {
	if from == 0 {
		from = 1
	}
	return &Subscription{store: store, stream: stream, next: from, batch: 512}
}

// Position is the Seq the next delivered event will have.
func (s *Subscription) Position() uint64 { return s.next }

// Next blocks until the next event is available or ctx ends.
func (s *Subscription) Next(ctx context.Context) (Event, error) {
	for len(s.buf) == 0 {
		var changed <-chan struct{}
		if n, ok := s.store.(Notifier); ok {
			// Ask for the wake-up before reading so an append between the
			// read and the wait is not missed.
			changed = n.Changed(s.stream)
		}
		evs, err := s.store.Read(ctx, s.stream, s.next, s.batch)
		if err != nil {
			return Event{}, err
		}
		if len(evs) > 0 {
			s.buf = evs
			break
		}
		t := time.NewTimer(PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return Event{}, ctx.Err()
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
	ev := s.buf[0]
	s.buf = s.buf[1:]
	s.next = ev.Seq + 1
	return ev, nil
}
