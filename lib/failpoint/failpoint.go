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
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrCrash is the conventional error of an armed point: the caller behaves as
// if the process died there (drops what it holds, writes nothing more).
var ErrCrash = errors.New("failpoint: simulated crash")

// Set is a collection of named points. The zero value is not usable; use New.
// A nil *Set is valid and never fires.
type Set struct {
	mu    sync.Mutex
	hits  map[string]int
	armed map[string][]arm // several arms of one point all act (ParseActions)
}

type arm struct {
	at  int // fire from this hit on (1-based)
	err error
	// fn, when set, is called at the at-th hit only (ArmFunc), or at
	// every hit from the at-th on when each is set (ArmEach).
	fn   func(subject string) error
	each bool
	// cfn, when set, is fn for a point on a call with a context (ArmCtx,
	// Hang): it gets the call's ctx (context.Background from Eval).
	cfn func(ctx context.Context, subject string) error
}

// New returns an empty Set.
func New() *Set { return &Set{hits: map[string]int{}, armed: map[string][]arm{}} }

// Arm makes point name return err from its at-th evaluation on (at < 1 means
// the first).
func (s *Set) Arm(name string, at int, err error) {
	if at < 1 {
		at = 1
	}
	s.mu.Lock()
	s.armed[name] = []arm{{at: at, err: err}}
	s.mu.Unlock()
}

// Disarm stops point name from firing; its hit count stays.
func (s *Set) Disarm(name string) {
	s.mu.Lock()
	delete(s.armed, name)
	s.mu.Unlock()
}

// Eval counts a hit of point name and returns the armed error when it fires.
func (s *Set) Eval(name string) error { return s.EvalFor(name, "") }

// EvalFor is Eval naming what the point is evaluated for (a sandbox id),
// which an ArmFunc hook receives.
func (s *Set) EvalFor(name, subject string) error {
	return s.EvalCtx(context.Background(), name, subject)
}

// EvalCtx is EvalFor at a point on a call that has a context: an arm made
// with ArmCtx (a Hang) gets ctx, so a hung call ends when its deadline
// does, as a real call that does not answer would.
func (s *Set) EvalCtx(ctx context.Context, name, subject string) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	s.hits[name]++
	arms := s.armed[name]
	n := s.hits[name]
	s.mu.Unlock()
	var first error
	for _, a := range arms {
		var err error
		switch {
		case n < a.at:
		case a.cfn != nil:
			if n == a.at || a.each {
				err = a.cfn(ctx, subject)
			}
		case a.fn != nil:
			if n == a.at || a.each {
				err = a.fn(subject)
			}
		default:
			err = a.err
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// ArmFunc makes point name call fn at its at-th evaluation, once; what fn
// returns is what that evaluation returns (nil: the code goes on, e.g.
// after fn killed something else).
func (s *Set) ArmFunc(name string, at int, fn func(subject string) error) {
	if at < 1 {
		at = 1
	}
	s.mu.Lock()
	s.armed[name] = []arm{{at: at, fn: fn}}
	s.mu.Unlock()
}

// Parse arms a new Set from spec, "point=N:action[,point=N:action…]": point
// calls actions[action] at its N-th evaluation. It is how a test arms the
// points of a daemon it runs as a separate process.
func Parse(spec string, actions map[string]func(point, subject string) error) (*Set, error) {
	return ParseActions(spec, func(point, action, arg string) (Action, error) {
		fn := actions[action]
		if fn == nil || arg != "" {
			return Action{}, fmt.Errorf("want an action among %s (no argument)", strings.Join(sortedKeys(actions), ", "))
		}
		return Action{Fn: func(subject string) error { return fn(point, subject) }}, nil
	})
}

// Action is what an armed point does: Fn is called at its N-th evaluation
// only, or, when Each is set, at every evaluation from the N-th on (a fault
// that lasts, such as an error window; see Window). CtxFn, when set, is
// called instead of Fn with the evaluating call's context (EvalCtx; see
// ArmCtx): a hang that ends with the call's deadline.
type Action struct {
	Fn    func(subject string) error
	CtxFn func(ctx context.Context, subject string) error
	Each  bool
}

// ParseActions arms a new Set from spec, "point=N:action[/ARG][,…]"; build
// makes the Action of each part from its point, action name and argument
// (empty when there is no "/"), or says why it cannot.
func ParseActions(spec string, build func(point, action, arg string) (Action, error)) (*Set, error) {
	s := New()
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, rest, ok1 := strings.Cut(part, "=")
		at, action, ok2 := strings.Cut(rest, ":")
		n, err := strconv.Atoi(at)
		if !ok1 || !ok2 || err != nil || n < 1 || name == "" || action == "" {
			return nil, fmt.Errorf("failpoint spec %q: want point=N:action[/ARG] with N ≥ 1", part)
		}
		action, arg, _ := strings.Cut(action, "/")
		a, err := build(name, action, arg)
		if err != nil {
			return nil, fmt.Errorf("failpoint spec %q: %v", part, err)
		}
		// A point named twice has both arms (each acts at its own hit).
		s.mu.Lock()
		s.armed[name] = append(s.armed[name], arm{at: n, fn: a.Fn, cfn: a.CtxFn, each: a.Each})
		s.mu.Unlock()
	}
	return s, nil
}

// ArmEach makes point name call fn at every evaluation from the at-th on;
// what fn returns is what each evaluation returns.
func (s *Set) ArmEach(name string, at int, fn func(subject string) error) {
	if at < 1 {
		at = 1
	}
	s.mu.Lock()
	s.armed[name] = []arm{{at: at, fn: fn, each: true}}
	s.mu.Unlock()
}

// ArmCtx is ArmFunc (each false) or ArmEach (each true) for a fn that
// gets the evaluating call's context (EvalCtx; context.Background from
// Eval and EvalFor): see Hang.
func (s *Set) ArmCtx(name string, at int, each bool, fn func(ctx context.Context, subject string) error) {
	if at < 1 {
		at = 1
	}
	s.mu.Lock()
	s.armed[name] = []arm{{at: at, cfn: fn, each: each}}
	s.mu.Unlock()
}

// Hang returns the fn of a call that does not answer (for ArmCtx): it
// blocks until the call's ctx ends, and returns ctx's error, or until
// release is closed, and returns nil (the call goes on). A store call
// whose database stopped answering, a lock never given back.
func Hang(release <-chan struct{}) func(ctx context.Context, subject string) error {
	return func(ctx context.Context, _ string) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-release:
			return nil
		}
	}
}

// Window returns the Fn of a fault that lasts d from its first call: every
// call until then runs hit (which returns the fault's error, or sleeps and
// returns nil for a slow device) and returns its result; later calls return
// nil. Armed with ArmEach (Action.Each), the first call is the point's N-th
// evaluation.
func Window(d time.Duration, hit func(subject string) error) func(subject string) error {
	var mu sync.Mutex
	var until time.Time
	return func(subject string) error {
		mu.Lock()
		if until.IsZero() {
			until = time.Now().Add(d)
		}
		over := time.Now().After(until)
		mu.Unlock()
		if over {
			return nil
		}
		return hit(subject)
	}
}

func sortedKeys(m map[string]func(point, subject string) error) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
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

// Counts returns every evaluated point's hit count.
func (s *Set) Counts() map[string]int {
	out := map[string]int{}
	if s == nil {
		return out
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.hits {
		out[k] = v
	}
	return out
}
