// Package fence is a daemon's lease on its data directory: the one-node
// fencing that keeps a paused daemon (SIGSTOP, a stalled VM) from writing
// after another daemon took its data directory over.
//
// # Vocabulary
//
// The data-dir lease is the event log's lease on the stream Stream
// ("daemon/lease"), held under one holder name per node ("daemon/<host>")
// by every incarnation of the daemon; its epoch grows at every grant, so the
// epoch, not the holder, tells incarnations apart. A daemon that starts
// normally holds the data dir's flock, which proves its predecessor is dead:
// it takes the lease at once (Take). A daemon started with --take-over while
// the flock is still held (the old process is stopped, not dead) waits until
// the old lease has expired before it takes it; then it bumps the epoch of
// every stream the old daemon may hold a lease on (Sweep), so that even a
// write the old daemon had already begun is refused inside the log's
// transaction (errdefs.ErrFenced).
//
// # Validity by the holder's own clock
//
// A lease granted (or renewed) by a request sent at time t is trusted until
// t + TTL·4/5 by this process's clock; the log dates its expiry at the
// commit, after t, so no other daemon can take it over before that. Check
// costs nothing inside that window and renews synchronously outside it: a
// process that was stopped past its window finds out at its next write,
// before the write. A renewal refused with ErrFenced marks the lease fenced
// for good and calls OnFenced (the daemon exits at once, without cleanup:
// its sandboxes are the new daemon's now).
//
// # What is fenced
//
// Log wraps the event log: Append, Truncate, Acquire, Renew and Release call
// Check first, so a fenced daemon cannot append (session steps, sandbox
// lifecycle, effect intents and outcomes, audit), cannot take or renew a
// stream lease, hence cannot commit a checkpoint (the engine's commit hook
// renews the sandbox stream's lease before it writes the pointer). The
// egress gateway calls Check right before a request goes upstream (after
// its intent is durable), so a daemon resumed between intent and send
// forwards nothing. What stays unfenced: the metadata store's rows (copies
// of the log, written after it) and driver calls; a write whose Check passed
// just before the process was stopped proceeds after it resumes — refused
// by the log when its stream was swept (session, sandbox and effect
// streams), not refused otherwise (a stream without a lease, e.g. the audit
// trail). See docs/ARCHITECTURE.md, "Fencing on one node".
package fence

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// Stream is the stream whose lease is the data-dir lease (it holds no
// events).
const Stream = "daemon/lease"

// Lease is this daemon's data-dir lease.
type Lease struct {
	log eventlog.Store
	ttl time.Duration
	// OnFenced is called once, when the lease is found taken over.
	onFenced func(error)

	mu         sync.Mutex
	l          eventlog.Lease
	validUntil time.Time
	fenced     error
}

// Options configure Take.
type Options struct {
	Holder string
	TTL    time.Duration
	// TakeOver waits for the current lease to expire before taking it
	// (the previous daemon may be alive but stopped); without it the
	// lease is taken at once (the caller holds the data dir's flock).
	TakeOver bool
	// Waiting, when set, is called once if TakeOver has to wait.
	Waiting func(cur eventlog.Lease)
	// OnFenced is called once, synchronously, by the call that found out
	// (before that call returns; it must not call back into the Lease).
	OnFenced func(error)
}

// Take acquires the data-dir lease on log (see Options).
func Take(ctx context.Context, log eventlog.Store, o Options) (*Lease, error) {
	if o.TTL <= 0 || o.Holder == "" {
		return nil, errdefs.InvalidArgumentf("fence: a holder and a positive TTL are required")
	}
	if o.TakeOver {
		told := false
		for {
			cur, err := log.CurrentLease(ctx, Stream)
			if err != nil {
				return nil, fmt.Errorf("data-dir lease: %w", err)
			}
			if cur.Holder == "" || time.Now().After(cur.Expires) {
				break
			}
			if !told && o.Waiting != nil {
				o.Waiting(cur)
				told = true
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(min(time.Until(cur.Expires)+10*time.Millisecond, o.TTL/4)):
			}
		}
	}
	sent := time.Now()
	l, err := log.Acquire(ctx, Stream, o.Holder, o.TTL)
	if err != nil {
		return nil, fmt.Errorf("data-dir lease: %w", err)
	}
	return &Lease{log: log, ttl: o.TTL, onFenced: o.OnFenced, l: l, validUntil: sent.Add(o.TTL * 4 / 5)}, nil
}

// Epoch is the epoch this daemon holds.
func (f *Lease) Epoch() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.l.Epoch
}

// Check returns nil while the lease is this daemon's, errdefs.ErrFenced once
// another daemon took it over, or another error when that cannot be told
// (the log is unavailable): a caller writes nothing on any error. Inside the
// validity window it costs a mutex and a clock read.
func (f *Lease) Check(ctx context.Context) error {
	f.mu.Lock()
	fenced, valid := f.fenced, time.Now().Before(f.validUntil)
	f.mu.Unlock()
	switch {
	case fenced != nil:
		return fenced
	case valid:
		return nil
	}
	return f.renew(ctx)
}

// renew renews the lease (without holding the mutex during the round trip,
// so that checks inside the window never wait for it).
func (f *Lease) renew(ctx context.Context) error {
	f.mu.Lock()
	cur := f.l
	f.mu.Unlock()
	sent := time.Now()
	l, err := f.log.Renew(ctx, cur, f.ttl)
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.fenced != nil:
		return f.fenced
	case errdefs.IsFenced(err):
		f.fenced = errdefs.Fencedf("this daemon's lease on its data dir (epoch %d) was taken over: %v", cur.Epoch, err)
		if f.onFenced != nil {
			f.onFenced(f.fenced) // the daemon exits here, before any caller goes on
		}
		return f.fenced
	case err != nil:
		return fmt.Errorf("renew the data-dir lease: %w", err)
	}
	if v := sent.Add(f.ttl * 4 / 5); v.After(f.validUntil) {
		f.l, f.validUntil = l, v
	}
	return nil
}

// Keep renews the lease every TTL/4, each try bounded by TTL/4, until ctx
// ends or it is fenced.
func (f *Lease) Keep(ctx context.Context) {
	t := time.NewTicker(f.ttl / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Each renewal has a deadline: a store that hangs one (a lost
		// connection, a stalled disk) costs that round, not the lease —
		// the next tick tries again while the lease is still valid.
		rctx, cancel := context.WithTimeout(ctx, f.ttl/4)
		err := f.renew(rctx)
		cancel()
		if errdefs.IsFenced(err) {
			return
		}
	}
}

// Sweep gives every stream of streams a new lease epoch under holder and
// releases it at once, so that a lease an earlier daemon held on one is
// stale: its appends, renewals and checkpoint commits are refused in the
// log's transaction. A stream held by another holder (another node) is left
// alone. It returns how many streams it bumped.
func Sweep(ctx context.Context, log eventlog.Store, holder string, streams []string) (int, error) {
	n := 0
	for _, s := range streams {
		l, err := log.Acquire(ctx, s, holder, time.Minute)
		if errdefs.IsConflict(err) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("sweep %s: %w", s, err)
		}
		if err := log.Release(ctx, l); err != nil {
			return n, fmt.Errorf("sweep %s: %w", s, err)
		}
		n++
	}
	return n, nil
}

// Log returns s with Check in front of every write (the result is an
// eventlog.Notifier when s is one).
func (f *Lease) Log(s eventlog.Store) eventlog.Store {
	l := &log{Store: s, f: f}
	if n, ok := s.(eventlog.Notifier); ok {
		return &notifyingLog{log: l, n: n}
	}
	return l
}

type log struct {
	eventlog.Store
	f *Lease
}

func (l *log) Append(ctx context.Context, stream string, epoch, expectedSeq uint64, events ...eventlog.Event) (eventlog.AppendResult, error) {
	if err := l.f.Check(ctx); err != nil {
		return eventlog.AppendResult{}, err
	}
	return l.Store.Append(ctx, stream, epoch, expectedSeq, events...)
}

func (l *log) Truncate(ctx context.Context, stream string, before uint64) error {
	if err := l.f.Check(ctx); err != nil {
		return err
	}
	return l.Store.Truncate(ctx, stream, before)
}

func (l *log) Acquire(ctx context.Context, stream, holder string, ttl time.Duration) (eventlog.Lease, error) {
	if err := l.f.Check(ctx); err != nil {
		return eventlog.Lease{}, err
	}
	return l.Store.Acquire(ctx, stream, holder, ttl)
}

func (l *log) Renew(ctx context.Context, ls eventlog.Lease, ttl time.Duration) (eventlog.Lease, error) {
	if err := l.f.Check(ctx); err != nil {
		return eventlog.Lease{}, err
	}
	return l.Store.Renew(ctx, ls, ttl)
}

func (l *log) Release(ctx context.Context, ls eventlog.Lease) error {
	if err := l.f.Check(ctx); err != nil {
		return err
	}
	return l.Store.Release(ctx, ls)
}

type notifyingLog struct {
	*log
	n eventlog.Notifier
}

func (l *notifyingLog) Changed(stream string) <-chan struct{} { return l.n.Changed(stream) }
