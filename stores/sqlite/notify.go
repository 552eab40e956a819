package sqlite

import "sync"

// notifier wakes Subscriptions in this process after a commit.
type notifier struct {
	mu   sync.Mutex
	wait map[string]chan struct{}
}

// Changed implements eventlog.Notifier: the channel is closed after the next
// commit that appended to stream through this Store. Appends by other
// processes are not seen; Subscribe's polling covers them.
func (s *Store) Changed(stream string) <-chan struct{} {
	n := &s.notify
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.wait == nil {
		n.wait = map[string]chan struct{}{}
	}
	ch, ok := n.wait[stream]
	if !ok {
		ch = make(chan struct{})
		n.wait[stream] = ch
	}
	return ch
}

func (n *notifier) wake(stream string) {
	n.mu.Lock()
	ch, ok := n.wait[stream]
	if ok {
		delete(n.wait, stream)
	}
	n.mu.Unlock()
	if ok {
		close(ch)
	}
}
