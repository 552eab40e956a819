package eventlog

import (
	"encoding/json"
	"fmt"
	"sync"

	"github.com/amber-run/amber/core/errdefs"
)

// Upcaster lifts a payload from version v to v+1 of its type.
type Upcaster func(payload json.RawMessage) (json.RawMessage, error)

// Registry knows every event type this binary understands, its current
// version, and the upcasters that lift older versions to it. Events are
// stored in the version they were written with and lifted on read, so a
// changed schema never makes old events unreadable ("a model upgrade changed
// the event structure; old events no longer deserialize").
type Registry struct {
	mu      sync.RWMutex
	current map[string]int
	up      map[upKey]Upcaster
}

type upKey struct {
	typ  string
	from int
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{current: map[string]int{}, up: map[upKey]Upcaster{}}
}

// Register declares typ with its current version. Every version from 1 to
// current-1 needs an upcaster (AddUpcaster) before events of it can be read.
func (r *Registry) Register(typ string, current int) {
	if current < 1 {
		panic(fmt.Sprintf("eventlog: type %s registered with version %d", typ, current))
	}
	r.mu.Lock()
	r.current[typ] = current
	r.mu.Unlock()
}

// AddUpcaster registers fn to lift typ from version from to from+1.
func (r *Registry) AddUpcaster(typ string, from int, fn Upcaster) {
	r.mu.Lock()
	r.up[upKey{typ, from}] = fn
	r.mu.Unlock()
}

// Current returns the current version of typ, or false when typ is unknown.
func (r *Registry) Current(typ string) (int, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	v, ok := r.current[typ]
	return v, ok
}

// Upcast returns ev lifted to its type's current version. An unknown type, a
// version newer than this binary knows, a missing upcaster or an upcaster
// error is an ErrFailedPrecondition naming the event — never a silent drop.
func (r *Registry) Upcast(ev Event) (Event, error) {
	cur, ok := r.Current(ev.Type)
	if !ok {
		return ev, errdefs.FailedPreconditionf("event %s/%d: type %q is unknown to this binary", ev.Stream, ev.Seq, ev.Type)
	}
	if ev.Version > cur {
		return ev, errdefs.FailedPreconditionf("event %s/%d: %s version %d is newer than this binary's %d; upgrade amber", ev.Stream, ev.Seq, ev.Type, ev.Version, cur)
	}
	for ev.Version < cur {
		r.mu.RLock()
		fn := r.up[upKey{ev.Type, ev.Version}]
		r.mu.RUnlock()
		if fn == nil {
			return ev, errdefs.FailedPreconditionf("event %s/%d: no upcaster for %s from version %d", ev.Stream, ev.Seq, ev.Type, ev.Version)
		}
		p, err := fn(ev.Payload)
		if err != nil {
			return ev, errdefs.FailedPreconditionf("event %s/%d: upcast %s v%d: %v", ev.Stream, ev.Seq, ev.Type, ev.Version, err)
		}
		if !json.Valid(p) {
			return ev, errdefs.FailedPreconditionf("event %s/%d: upcast %s v%d produced invalid JSON", ev.Stream, ev.Seq, ev.Type, ev.Version)
		}
		ev.Payload = p
		ev.Version++
	}
	return ev, nil
}
