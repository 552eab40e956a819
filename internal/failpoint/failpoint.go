// Package failpoint names crash points in code paths whose durability order
// matters, so tests inject a crash exactly there instead of hoping a timing
// guess lands on it.
//
// Code calls Eval at each named point; a nil *Set (production) costs a nil
// check. A test arms a point with the error it should return, runs the code,
// and asserts with Hits that the point was reached:
//
//	fp := failpoint.New()
//	fp.Arm("gateway.before-send", 2, failpoint.ErrCrash) // fire at the 2nd hit
//	... run ...
//	if fp.Hits("gateway.before-send") < 2 { t.Fatal("crash point never reached") }
//
// Every evaluation is counted, armed or not.
package failpoint

import (
	"errors"
	"sync"
)

// ErrCrash is the conventional error of an armed point: the caller behaves as
// if the process died there (drops what it holds, writes nothing more).
var ErrCrash = errors.New("failpoint: simulated crash")

// Set is a collection of named points. The zero value is not usable; use New.
// A nil *Set is valid and never fires.
type Set struct {
	mu    sync.Mutex
	hits  map[string]int
	armed map[string]arm
}

type arm struct {
	at  int // fire from this hit on (1-based)
	err error
}

// New returns an empty Set.
func New() *Set { return &Set{hits: map[string]int{}, armed: map[string]arm{}} }

// Arm makes point name return err from its at-th evaluation on (at < 1 means
// the first).
func (s *Set) Arm(name string, at int, err error) {
	if at < 1 {
		at = 1
	}
	s.mu.Lock()
	s.armed[name] = arm{at: at, err: err}
	s.mu.Unlock()
}

// Disarm stops point name from firing; its hit count stays.
func (s *Set) Disarm(name string) {
	s.mu.Lock()
	delete(s.armed, name)
	s.mu.Unlock()
}

// Eval counts a hit of point name and returns the armed error when it fires.
func (s *Set) Eval(name string) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hits[name]++
	if a, ok := s.armed[name]; ok && s.hits[name] >= a.at {
		return a.err
	}
	return nil
}

// Hits returns how many times point name was evaluated.
func (s *Set) Hits(name string) int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[name]
}
