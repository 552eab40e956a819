package eventlog

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// memLog is the smallest Store a Subscription needs: Read and Append-like
// add. Other methods are not used.
type memLog struct {
	Store // nil: calling anything else panics
	mu    sync.Mutex
	evs   []Event
	first uint64
	fail  error
	reads int
}

func (m *memLog) add(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for range n {
		seq := uint64(len(m.evs)) + 1
		m.evs = append(m.evs, Event{Seq: seq, ID: fmt.Sprint("e", seq)})
	}
}

func (m *memLog) Read(ctx context.Context, stream string, from uint64, limit int) ([]Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads++
	if m.fail != nil {
		return nil, m.fail
	}
	if from < max(m.first, 1) {
		return nil, errdefs.Compactedf("below %d", m.first)
	}
	if from > uint64(len(m.evs)) {
		return []Event{}, nil
	}
	out := m.evs[from-1:]
	if len(out) > limit {
		out = out[:limit]
	}
	return append([]Event(nil), out...), nil
}

// notifyingLog adds Notifier.
type notifyingLog struct {
	*memLog
	ch chan struct{}
}

func (n *notifyingLog) Changed(string) <-chan struct{} { return n.ch }

func TestSubscriptionDeliversInOrderAcrossPages(t *testing.T) {
	m := &memLog{}
	m.add(1300) // more than two pages of 512
	sub := Subscribe(m, "s", 0)
	if sub.Position() != 1 {
		t.Fatalf("Position() = %d, want 1", sub.Position())
	}
	ctx := context.Background()
	for want := uint64(1); want <= 1300; want++ {
		ev, err := sub.Next(ctx)
		if err != nil || ev.Seq != want {
			t.Fatalf("Next = %d, %v; want %d", ev.Seq, err, want)
		}
	}
	if sub.Position() != 1301 {
		t.Fatalf("Position() = %d", sub.Position())
	}
	if m.reads != 3 {
		t.Fatalf("%d reads for 1300 events in pages of 512", m.reads)
	}
}

func TestSubscriptionFromMiddleAndErrors(t *testing.T) {
	m := &memLog{}
	m.add(10)
	ctx := context.Background()
	if ev, err := Subscribe(m, "s", 7).Next(ctx); err != nil || ev.Seq != 7 {
		t.Fatalf("from 7: %d, %v", ev.Seq, err)
	}
	m.first = 5
	if _, err := Subscribe(m, "s", 2).Next(ctx); !errdefs.IsCompacted(err) {
		t.Fatalf("below first: %v, want Compacted", err)
	}
	m.fail = errdefs.DataLossf("stream s seq 3: broken")
	if _, err := Subscribe(m, "s", 5).Next(ctx); !errdefs.IsDataLoss(err) {
		t.Fatalf("failing read: %v, want DataLoss", err)
	}
}

func TestSubscriptionPollsWithoutNotifier(t *testing.T) {
	defer func(d time.Duration) { PollInterval = d }(PollInterval)
	PollInterval = 5 * time.Millisecond
	m := &memLog{}
	sub := Subscribe(m, "s", 1)
	go func() {
		time.Sleep(30 * time.Millisecond)
		m.add(1)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ev, err := sub.Next(ctx); err != nil || ev.Seq != 1 {
		t.Fatalf("Next = %d, %v", ev.Seq, err)
	}
	// Waiting at the head ends with the context.
	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if _, err := sub.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next at the head: %v, want DeadlineExceeded", err)
	}
}

// With a Notifier, a subscriber wakes on the change, not on the poll timer.
func TestSubscriptionWakesOnNotifier(t *testing.T) {
	defer func(d time.Duration) { PollInterval = d }(PollInterval)
	PollInterval = time.Hour
	n := &notifyingLog{memLog: &memLog{}, ch: make(chan struct{})}
	sub := Subscribe(n, "s", 1)
	go func() {
		time.Sleep(20 * time.Millisecond)
		n.add(2)
		close(n.ch)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for want := uint64(1); want <= 2; want++ {
		if ev, err := sub.Next(ctx); err != nil || ev.Seq != want {
			t.Fatalf("Next = %d, %v; want %d", ev.Seq, err, want)
		}
	}
}
