// Package faults wraps the store contracts (core/blob, core/eventlog) with
// failpoints, so a test or the chaos harness (amber chaos) can make the
// storage layer fail, fill up or slow down at a chosen operation — in the
// process under test, without kernel devices.
//
// Every operation evaluates one named point before it reaches the store:
//
//	blob.write      Put, PutIfAbsent, Delete
//	blob.read       Get, Stat, List
//	eventlog.append Append, Truncate
//	eventlog.read   Read, Bounds
//	eventlog.lease  Acquire, Renew, Release, CurrentLease
//
// A point that returns an error fails the operation with it, before the store
// is touched (so a failed write wrote nothing: the same as a store that
// refused it). An action that sleeps and returns nil makes the operation
// slow; one armed with failpoint.Hang hangs it until its context ends (each
// point is evaluated with the operation's ctx: failpoint.Set.EvalCtx). With
// a nil *failpoint.Set (production) the wrappers are not used at all: Blobs
// and Log return the store itself.
package faults

import (
	"context"
	"io"
	"iter"
	"time"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/lib/failpoint"
)

// Point names.
const (
	BlobWrite      = "blob.write"
	BlobRead       = "blob.read"
	EventlogAppend = "eventlog.append"
	EventlogRead   = "eventlog.read"
	EventlogLease  = "eventlog.lease"
)

// Blobs returns s with the blob.* points in front of it (s itself when fps
// is nil).
func Blobs(s blob.Store, fps *failpoint.Set) blob.Store {
	if fps == nil {
		return s
	}
	return &blobs{s: s, fps: fps}
}

type blobs struct {
	s   blob.Store
	fps *failpoint.Set
}

func (b *blobs) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := b.fps.EvalCtx(ctx, BlobWrite, key); err != nil {
		return err
	}
	return b.s.Put(ctx, key, r, size)
}

func (b *blobs) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := b.fps.EvalCtx(ctx, BlobWrite, key); err != nil {
		return err
	}
	return b.s.PutIfAbsent(ctx, key, r, size)
}

func (b *blobs) Delete(ctx context.Context, key string) error {
	if err := b.fps.EvalCtx(ctx, BlobWrite, key); err != nil {
		return err
	}
	return b.s.Delete(ctx, key)
}

func (b *blobs) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := b.fps.EvalCtx(ctx, BlobRead, key); err != nil {
		return nil, err
	}
	return b.s.Get(ctx, key)
}

// GetRange implements blob.RangeGetter, failing where Get would.
func (b *blobs) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := b.fps.EvalCtx(ctx, BlobRead, key); err != nil {
		return nil, err
	}
	return blob.OpenRange(ctx, b.s, key, off, n)
}

func (b *blobs) Stat(ctx context.Context, key string) (blob.Info, error) {
	if err := b.fps.EvalCtx(ctx, BlobRead, key); err != nil {
		return blob.Info{}, err
	}
	return b.s.Stat(ctx, key)
}

func (b *blobs) List(ctx context.Context, prefix string) iter.Seq2[blob.Info, error] {
	if err := b.fps.EvalCtx(ctx, BlobRead, prefix); err != nil {
		return func(yield func(blob.Info, error) bool) { yield(blob.Info{}, err) }
	}
	return b.s.List(ctx, prefix)
}

// Log returns s with the eventlog.* points in front of it (s itself when
// fps is nil). The result is an eventlog.Notifier when s is one.
func Log(s eventlog.Store, fps *failpoint.Set) eventlog.Store {
	if fps == nil {
		return s
	}
	l := &log{s: s, fps: fps}
	if n, ok := s.(eventlog.Notifier); ok {
		return &notifyingLog{log: l, n: n}
	}
	return l
}

type log struct {
	s   eventlog.Store
	fps *failpoint.Set
}

func (l *log) Append(ctx context.Context, stream string, epoch, expectedSeq uint64, events ...eventlog.Event) (eventlog.AppendResult, error) {
	if err := l.fps.EvalCtx(ctx, EventlogAppend, stream); err != nil {
		return eventlog.AppendResult{}, err
	}
	return l.s.Append(ctx, stream, epoch, expectedSeq, events...)
}

func (l *log) Truncate(ctx context.Context, stream string, before uint64) error {
	if err := l.fps.EvalCtx(ctx, EventlogAppend, stream); err != nil {
		return err
	}
	return l.s.Truncate(ctx, stream, before)
}

func (l *log) Read(ctx context.Context, stream string, from uint64, limit int) ([]eventlog.Event, error) {
	if err := l.fps.EvalCtx(ctx, EventlogRead, stream); err != nil {
		return nil, err
	}
	return l.s.Read(ctx, stream, from, limit)
}

func (l *log) Bounds(ctx context.Context, stream string) (eventlog.Bounds, error) {
	if err := l.fps.EvalCtx(ctx, EventlogRead, stream); err != nil {
		return eventlog.Bounds{}, err
	}
	return l.s.Bounds(ctx, stream)
}

func (l *log) Acquire(ctx context.Context, stream, holder string, ttl time.Duration) (eventlog.Lease, error) {
	if err := l.fps.EvalCtx(ctx, EventlogLease, stream); err != nil {
		return eventlog.Lease{}, err
	}
	return l.s.Acquire(ctx, stream, holder, ttl)
}

func (l *log) Renew(ctx context.Context, ls eventlog.Lease, ttl time.Duration) (eventlog.Lease, error) {
	if err := l.fps.EvalCtx(ctx, EventlogLease, ls.Stream); err != nil {
		return eventlog.Lease{}, err
	}
	return l.s.Renew(ctx, ls, ttl)
}

func (l *log) Release(ctx context.Context, ls eventlog.Lease) error {
	if err := l.fps.EvalCtx(ctx, EventlogLease, ls.Stream); err != nil {
		return err
	}
	return l.s.Release(ctx, ls)
}

func (l *log) CurrentLease(ctx context.Context, stream string) (eventlog.Lease, error) {
	if err := l.fps.EvalCtx(ctx, EventlogLease, stream); err != nil {
		return eventlog.Lease{}, err
	}
	return l.s.CurrentLease(ctx, stream)
}

func (l *log) Close() error { return l.s.Close() }

type notifyingLog struct {
	*log
	n eventlog.Notifier
}

func (l *notifyingLog) Changed(stream string) <-chan struct{} { return l.n.Changed(stream) }
