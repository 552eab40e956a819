package engine

import (
	"context"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// cutLocks are the sandboxes' cut locks (core.cutLock) and how long each
// side waits for one.
//
// A cut (or a restore's driver call) waits up to cutWait
// (RecoveryOptions.CutLockTimeout, 1 minute) for the calls into its
// sandbox to end: a call that hangs while it holds the read side (a
// command that never exits, a file streamed to a client that stopped
// reading) must not hold the checkpoint forever, and so every caller
// behind it. The cut then fails Unavailable, naming the sandbox, and
// takes nothing: the loop that owns it tries again (the fast policy at
// its next due time, the idle stop after another idle period, a user's
// retry; the strict policy's exec reports it). A legit long reader — a
// 1 GiB upload, a long command — so delays a checkpoint by at most
// cutWait per attempt, and a waiting cut holds new calls back for that
// long (as it always did, then without end).
//
// A call into the sandbox waits behind a cut up to callWait
// (DriverTimeout + CutLockTimeout: the longest a cut's driver call may
// hold it, and its own wait, so no legit cut fails a call) and then
// answers Unavailable, "retry": a stopping cut holds the lock until its
// upload commits, and a call that gave up finds the sandbox stopped and
// resumes it on the retry.
type cutLocks struct {
	m        sync.Map // sandbox id → *cutMutex
	cutWait  time.Duration
	callWait time.Duration
}

// cut takes sandbox id's cut lock for writing, for what ("checkpoint",
// "restore"), waiting up to cutWait; the caller holds e.lock(id).
func (c *cutLocks) cut(ctx context.Context, id, what string) (func(), error) {
	mu := c.get(id)
	wctx, cancel := context.WithTimeout(ctx, c.cutWait)
	defer cancel()
	if err := mu.lock(wctx); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errdefs.Unavailablef("%s of sandbox %s not started: calls into the sandbox (a command, a file transfer) did not end within %v; retry", what, id, c.cutWait)
	}
	return mu.unlock, nil
}

// call takes sandbox id's cut lock for reading, waiting up to callWait.
func (c *cutLocks) call(ctx context.Context, id string) (func(), error) {
	mu := c.get(id)
	wctx, cancel := context.WithTimeout(ctx, c.callWait)
	defer cancel()
	if err := mu.rlock(wctx); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errdefs.Unavailablef("sandbox %s is being checkpointed or restored: the call waited %v for it; retry", id, c.callWait)
	}
	return mu.runlock, nil
}

func (c *cutLocks) get(id string) *cutMutex {
	if m, ok := c.m.Load(id); ok {
		return m.(*cutMutex)
	}
	m, _ := c.m.LoadOrStore(id, newCutMutex())
	return m.(*cutMutex)
}

// cutMutex is a readers–writer lock whose waits end with a context
// (sync.RWMutex has no timed lock). Like sync.RWMutex it prefers writers:
// once a writer waits, new readers wait behind it (a cut is not starved
// by a stream of short calls), until it gets the lock or gives up.
type cutMutex struct {
	mu      sync.Mutex
	readers int
	writing bool
	wanting int           // writers waiting
	changed chan struct{} // closed, and replaced, at each change a waiter may want
}

func newCutMutex() *cutMutex { return &cutMutex{changed: make(chan struct{})} }

// broadcast wakes every waiter; m.mu is held.
func (m *cutMutex) broadcast() {
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *cutMutex) rlock(ctx context.Context) error {
	m.mu.Lock()
	for m.writing || m.wanting > 0 {
		ch := m.changed
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
		m.mu.Lock()
	}
	m.readers++
	m.mu.Unlock()
	return nil
}

// tryRLock is rlock without waiting.
func (m *cutMutex) tryRLock() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.writing || m.wanting > 0 {
		return false
	}
	m.readers++
	return true
}

func (m *cutMutex) runlock() {
	m.mu.Lock()
	if m.readers--; m.readers == 0 {
		m.broadcast()
	}
	m.mu.Unlock()
}

func (m *cutMutex) lock(ctx context.Context) error {
	m.mu.Lock()
	m.wanting++
	for m.writing || m.readers > 0 {
		ch := m.changed
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			m.mu.Lock()
			m.wanting--
			m.broadcast() // readers held back by this writer go on
			m.mu.Unlock()
			return ctx.Err()
		case <-ch:
		}
		m.mu.Lock()
	}
	m.wanting--
	m.writing = true
	m.mu.Unlock()
	return nil
}

func (m *cutMutex) unlock() {
	m.mu.Lock()
	m.writing = false
	m.broadcast()
	m.mu.Unlock()
}
