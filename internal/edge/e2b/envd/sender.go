package envd

import (
	"context"
	"sync"
	"time"
)

// sender serialises a stream's sends (output and keepalives come from two
// goroutines) and remembers when it last sent.
type sender[T any] struct {
	mu   sync.Mutex
	fn   func(T) error
	last time.Time
	err  error
	done chan struct{}
	once sync.Once
}

func newSender[T any](fn func(T) error) *sender[T] {
	return &sender[T]{fn: fn, last: time.Now(), done: make(chan struct{})}
}

func (s *sender[T]) send(v T) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	s.err = s.fn(v)
	s.last = time.Now()
	return s.err
}

// keepalive sends ka() whenever the stream was quiet for every, until stop
// or ctx's end.
func (s *sender[T]) keepalive(ctx context.Context, every time.Duration, ka func() T) {
	go func() {
		t := time.NewTicker(every / 2)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.done:
				return
			case <-t.C:
				s.mu.Lock()
				quiet := time.Since(s.last) >= every
				s.mu.Unlock()
				if quiet && s.send(ka()) != nil {
					return
				}
			}
		}
	}()
}

func (s *sender[T]) stop() { s.once.Do(func() { close(s.done) }) }
