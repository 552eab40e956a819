package postgres

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// notifier hands out per-stream channels that are closed at the stream's
// next append.
type notifier struct {
	mu      sync.Mutex
	waiting map[string]chan struct{}
}

func (n *notifier) changed(stream string) <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.waiting == nil {
		n.waiting = map[string]chan struct{}{}
	}
	ch, ok := n.waiting[stream]
	if !ok {
		ch = make(chan struct{})
		n.waiting[stream] = ch
	}
	return ch
}

func (n *notifier) wake(stream string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ch, ok := n.waiting[stream]; ok {
		close(ch)
		delete(n.waiting, stream)
	}
}

func (n *notifier) wakeAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for stream, ch := range n.waiting {
		close(ch)
		delete(n.waiting, stream)
	}
}

// Changed returns a channel closed at the next committed append to stream,
// made through this Store (woken right after COMMIT) or through any other
// process on the same database and schema (woken by the NOTIFY that the
// append's transaction sends, delivered only once it committed). While the
// listening connection is down, Subscribe falls back to polling.
func (s *Store) Changed(stream string) <-chan struct{} { return s.notify.changed(stream) }

// startListener opens the dedicated LISTEN connection (synchronously, so no
// append after Open returns goes unheard) and then follows it in the
// background, reconnecting with backoff when it drops.
func (s *Store) startListener(ctx context.Context, cfg *pgx.ConnConfig) error {
	conn, err := s.listen(ctx, cfg)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithCancel(context.Background())
	s.stopListen = cancel
	go func() {
		defer close(s.listenDone)
		backoff := 50 * time.Millisecond
		for {
			if conn != nil {
				backoff = 50 * time.Millisecond
				err := s.follow(lctx, conn)
				conn.Close(context.Background())
				conn = nil
				if lctx.Err() != nil {
					return
				}
				s.log.Warn("event log listener lost its connection; reconnecting", "err", err)
			}
			select {
			case <-lctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			conn, err = s.listen(lctx, cfg)
			if err != nil {
				s.log.Warn("event log listener cannot reconnect", "err", err, "retry_in", backoff)
				continue
			}
			// Appends made while we were deaf were not heard: wake every
			// waiter so it re-reads.
			s.notify.wakeAll()
		}
	}()
	return nil
}

func (s *Store) listen(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
	if err != nil {
		return nil, s.wrap("listen: connect", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		conn.Close(context.Background())
		return nil, s.wrap("listen", err)
	}
	return conn, nil
}

// follow wakes the waiters of each stream named in a notification until the
// connection fails or ctx ends. Notifications sent by this Store's own pool
// connections were already delivered in-process and are skipped.
func (s *Store) follow(ctx context.Context, conn *pgx.Conn) error {
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if _, own := s.ownPIDs.Load(n.PID); own {
			continue
		}
		s.notify.wake(n.Payload)
	}
}
