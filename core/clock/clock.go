// Package clock injects time. Production code takes a Clock; tests pass a Fake
// and move time explicitly, so TTLs, lease expiry and intervals are tested
// without sleeping.
package clock

import (
	"sync"
	"time"
)

// Clock is the source of time for everything in Amber that reads it.
type Clock interface {
	Now() time.Time
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// Fake is a Clock that moves only when told to. It is safe for concurrent use.
type Fake struct {
	mu  sync.Mutex
	now time.Time
}

// NewFake returns a Fake clock set to t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Advance moves the fake time forward by d.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

// Shifted is the wall clock moved to another date: it reads the time it was
// started at when made and runs on at the wall clock's pace from there, so
// timers, leases and intervals behave as in production while the calendar
// is the test's (a month boundary, a leap day, a DST change).
type Shifted struct {
	at    time.Time
	since time.Time
}

// NewShifted returns a Shifted clock that reads t now.
func NewShifted(t time.Time) *Shifted { return &Shifted{at: t, since: time.Now()} }

// Now returns the shifted time.
func (s *Shifted) Now() time.Time { return s.at.Add(time.Since(s.since)) }
