package session

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/state/meta"
)

// Manager is the daemon's side of sessions: it creates them, takes client
// events, serves their logs, and runs a harness for each session that has
// work (one goroutine per session at a time, woken by client events and at
// start).
type Manager struct {
	h *Harness

	mu      sync.Mutex
	runners map[string]*runner
	deltas  map[string]map[chan string]struct{} // session → live listeners
	retries int                                 // Wake attempts after a lasting error (3)
	// retryFor is how long a Wake failing for another reason (a store
	// down, full or slow; a model unreachable) is retried (10 min).
	retryFor time.Duration
	backoff  time.Duration // the first retry's delay (500 ms); every later one is twice it (retryDelay)
	bg       context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

type runner struct{ kick chan struct{} }

// NewManager returns a Manager driving sessions with h (h.Meta is required).
func NewManager(h *Harness) *Manager {
	h.defaults()
	RegisterEvents(h.Registry)
	bg, cancel := context.WithCancel(context.Background())
	m := &Manager{h: h, retries: 3, retryFor: 10 * time.Minute, backoff: 500 * time.Millisecond, runners: map[string]*runner{}, deltas: map[string]map[chan string]struct{}{}, bg: bg, cancel: cancel}
	if h.OnDelta == nil {
		h.OnDelta = m.publish
	}
	return m
}

// Deltas returns a channel of the live text deltas of session id's model
// answers (not durable: a listener that is slow or absent misses them; the
// complete message is in the log) and a function to stop listening.
func (m *Manager) Deltas(id string) (<-chan string, func()) {
	ch := make(chan string, 256)
	m.mu.Lock()
	if m.deltas[id] == nil {
		m.deltas[id] = map[chan string]struct{}{}
	}
	m.deltas[id][ch] = struct{}{}
	m.mu.Unlock()
	return ch, func() {
		m.mu.Lock()
		delete(m.deltas[id], ch)
		if len(m.deltas[id]) == 0 {
			delete(m.deltas, id)
		}
		m.mu.Unlock()
	}
}

func (m *Manager) publish(id, text string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for ch := range m.deltas[id] {
		select {
		case ch <- text:
		default:
		}
	}
}

// Start wakes every session that is not terminated: those that were
// running when the daemon stopped go on where their log says; the others
// find nothing to do (or input that arrived just before the stop).
func (m *Manager) Start(ctx context.Context) error {
	ss, err := m.h.Meta.ListSessions(ctx, "", string(StatusRunning), string(StatusRecovering), string(StatusIdle), string(StatusWaiting))
	if err != nil {
		return err
	}
	for _, s := range ss {
		if m.h.Owns == nil || m.h.Owns(ctx, s) {
			m.kick(s.ID)
		}
	}
	return nil
}

// Adopt wakes session id here: its node died and this node took its
// sandbox and the lease of its stream over (internal/cluster). The session
// goes on where its log says, as after a restart.
func (m *Manager) Adopt(id string) { m.kick(id) }

// Close stops the runners (their sessions stay as the log says; the next
// start wakes them) and waits for them.
func (m *Manager) Close() {
	m.cancel()
	m.wg.Wait()
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func newID(prefix string) string {
	b := make([]byte, 10)
	rand.Read(b)
	return prefix + idEncoding.EncodeToString(b)
}

// Create makes a session for tenant. Order: the session.created event
// (the truth) is appended first, then the metadata row that lists it; a
// crash between leaves a stream nobody lists, never a row without a log.
func (m *Manager) Create(ctx context.Context, tenant string, def Definition) (meta.Session, error) {
	if def.Model.Provider != "" && def.Model.Adapter == "" {
		p, err := providerFor(m.h.Providers, tenant, def.Model.Provider)
		if err != nil {
			return meta.Session{}, err
		}
		def.Model.Adapter = p.Adapter // the provider's wire format
	}
	def, err := def.Normalize()
	if err != nil {
		return meta.Session{}, err
	}
	// The model settings are checked as the harness will (a provider this
	// tenant may use; never the daemon's environment); a secret is looked
	// up when the model is first called.
	if _, err := modelEndpoint(m.h.Providers, tenant, def.Model); err != nil {
		return meta.Session{}, err
	}
	id := newID("ses-")
	p := mustJSON(def)
	ev := eventlog.Event{Tenant: tenant, ID: id + ".created", Type: EventCreated, Version: 1, Payload: p}
	if _, err := m.h.Log.Append(ctx, Stream(id), 0, 0, ev); err != nil {
		return meta.Session{}, fmt.Errorf("create session: %w", err)
	}
	return m.h.Meta.InsertSession(ctx, meta.Session{ID: id, Tenant: tenant, Definition: string(p), Status: string(StatusIdle)})
}

// Get returns session id if tenant owns it (NotFound otherwise).
func (m *Manager) Get(ctx context.Context, tenant, id string) (meta.Session, error) {
	if id == "" || len(id) > 48 || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
		return meta.Session{}, errdefs.InvalidArgumentf("session id %.60q is malformed", id)
	}
	s, err := m.h.Meta.GetSession(ctx, id)
	if err != nil {
		return s, err
	}
	if s.Tenant != tenant {
		return meta.Session{}, errdefs.NotFoundf("session %s", id)
	}
	return s, nil
}

// List returns tenant's sessions, oldest first.
func (m *Manager) List(ctx context.Context, tenant string) ([]meta.Session, error) {
	return m.h.Meta.ListSessions(ctx, tenant)
}

// Post appends a client event (one of InputTypes) to session id and wakes
// its harness. clientID, when set, makes the post idempotent: the same
// clientID with the same content is appended once.
func (m *Manager) Post(ctx context.Context, tenant, id, typ string, payload json.RawMessage, clientID string) (eventlog.Event, error) {
	if _, err := m.Get(ctx, tenant, id); err != nil {
		return eventlog.Event{}, err
	}
	if !InputTypes[typ] {
		return eventlog.Event{}, errdefs.InvalidArgumentf("event type %q is not one a client may send (user_message, interrupt, tool_confirmation, custom_tool_result, resume, terminate)", typ)
	}
	if len(payload) == 0 {
		payload = json.RawMessage(`{}`)
	}
	if err := checkInput(typ, payload); err != nil {
		return eventlog.Event{}, err
	}
	if clientID == "" {
		clientID = newID("")
	} else if len(clientID) > 64 || strings.ContainsAny(clientID, "\x00\n") {
		return eventlog.Event{}, errdefs.InvalidArgumentf("event id %.70q: at most 64 characters", clientID)
	}
	ev := eventlog.Event{Tenant: tenant, ID: id + ".in." + clientID, Type: typ, Version: 1, Payload: payload}
	stream := Stream(id)
	// Client events are not the harness's to fence: they go in under the
	// stream's current epoch (retried once if a harness took the lease
	// meanwhile).
	var res eventlog.AppendResult
	var err error
	for i := 0; i < 3; i++ {
		var l eventlog.Lease
		if l, err = m.h.Log.CurrentLease(ctx, stream); err != nil {
			return eventlog.Event{}, err
		}
		if res, err = m.h.Log.Append(ctx, stream, l.Epoch, eventlog.Any, ev); !errdefs.IsFenced(err) {
			break
		}
	}
	if err != nil {
		return eventlog.Event{}, err
	}
	ev.Seq, ev.Stream = res.First, stream
	m.kick(id)
	return ev, nil
}

func checkInput(typ string, payload json.RawMessage) error {
	var v any
	switch typ {
	case EventUserMessage:
		var p UserMessage
		if err := json.Unmarshal(payload, &p); err != nil || p.Text == "" {
			return errdefs.InvalidArgumentf("user_message needs {\"text\": \"…\"}")
		}
		return nil
	case EventToolConfirmation:
		var p ToolConfirmation
		if err := json.Unmarshal(payload, &p); err != nil || p.ToolCallID == "" {
			return errdefs.InvalidArgumentf("tool_confirmation needs {\"tool_call_id\": \"…\", \"allow\": true|false}")
		}
		return nil
	case EventCustomToolResult:
		var p CustomToolResult
		if err := json.Unmarshal(payload, &p); err != nil || p.ToolCallID == "" {
			return errdefs.InvalidArgumentf("custom_tool_result needs {\"tool_call_id\": \"…\", \"output\": \"…\"}")
		}
		return nil
	case EventResume:
		var p Resume
		if err := json.Unmarshal(payload, &p); err != nil {
			return errdefs.InvalidArgumentf("resume: %v", err)
		}
		return nil
	}
	if err := json.Unmarshal(payload, &v); err != nil {
		return errdefs.InvalidArgumentf("%s: payload: %v", typ, err)
	}
	return nil
}

// Events returns up to limit events of session id from position from.
func (m *Manager) Events(ctx context.Context, tenant, id string, from uint64, limit int) ([]eventlog.Event, error) {
	if _, err := m.Get(ctx, tenant, id); err != nil {
		return nil, err
	}
	evs, err := m.h.Log.Read(ctx, Stream(id), max(from, 1), limit)
	if err != nil {
		return nil, err
	}
	for i := range evs {
		if evs[i], err = m.h.Registry.Upcast(evs[i]); err != nil {
			return nil, err
		}
	}
	return evs, nil
}

// Subscribe follows session id's log from position from.
func (m *Manager) Subscribe(ctx context.Context, tenant, id string, from uint64) (*eventlog.Subscription, error) {
	if _, err := m.Get(ctx, tenant, id); err != nil {
		return nil, err
	}
	return eventlog.Subscribe(m.h.Log, Stream(id), from), nil
}

// Upcast lifts a stored event to this binary's version.
func (m *Manager) Upcast(ev eventlog.Event) (eventlog.Event, error) { return m.h.Registry.Upcast(ev) }

// kick makes sure a runner works on session id (again, if one is running).
func (m *Manager) kick(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bg.Err() != nil {
		return
	}
	r := m.runners[id]
	if r == nil {
		r = &runner{kick: make(chan struct{}, 1)}
		m.runners[id] = r
		m.wg.Add(1)
		go m.run(id, r)
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// run wakes the session while there are kicks, then exits.
func (m *Manager) run(id string, r *runner) {
	defer m.wg.Done()
	for {
		m.mu.Lock()
		select {
		case <-r.kick:
			m.mu.Unlock()
		default:
			delete(m.runners, id)
			m.mu.Unlock()
			return
		}
		// A failed Wake (a model, sandbox or store error; it is in the
		// log) is tried again after 500 ms, then every second (retryDelay;
		// every 15 s once it has failed for a minute): the
		// next Wake recovers what the failure cut off, and a store error
		// window of a few seconds costs a session a second at most, not
		// a doubling backoff's 16 s (the chaos runs' stacked windows: each
		// window's end waited up to a whole retry interval). An error that will not pass by
		// itself (refused, fenced, invalid) gets m.retries attempts —
		// counted apart from the transient failures before it, so a
		// store window does not use up a lasting error's tries; any
		// other (the blob store or the log down, full or slow, a model
		// unreachable) is retried for m.retryFor, so a session goes on
		// by itself once its stores are back. A client event cuts a
		// wait short. Then the session waits for a client event or the
		// next start.
		first, lastingN := time.Now(), 0
		for attempt := 0; ; attempt++ {
			st, err := m.h.Wake(m.bg, id)
			if err == nil || m.bg.Err() != nil || errdefs.IsNotFound(err) {
				break
			}
			if lasting(err) {
				lastingN++
			}
			m.h.Logger.Warn("session harness stopped", "session", id, "status", st, "attempt", attempt+1, "err", err)
			if lastingN >= m.retries || time.Since(first) >= m.retryFor {
				m.h.Logger.Warn("session waits for a client event", "session", id, "attempts", attempt+1, "err", err)
				break
			}
			select {
			case <-m.bg.Done():
				return
			case <-r.kick: // a client event: try now
			case <-time.After(retryDelay(attempt, m.backoff, time.Since(first))):
			}
		}
		if m.bg.Err() != nil {
			return
		}
	}
}

// retryDelay is the wait before a failed Wake's next attempt (attempt
// from 0, failing for failingFor): base, then 2×base for every later one
// — bounded, so the session is back within 2 s of a store's recovery
// however many attempts an error window took. A failure that lasts past a
// minute (a model down, not a store window) is tried every 30×base: each
// failed Wake appends a session.error event, and a 2 s rhythm for ten
// minutes would append 300.
func retryDelay(attempt int, base, failingFor time.Duration) time.Duration {
	switch {
	case attempt == 0:
		return base
	case failingFor >= time.Minute:
		return 30 * base
	}
	return 2 * base
}

// lasting tells an error that retrying will not cure.
func lasting(err error) bool {
	return errdefs.IsInvalidArgument(err) || errdefs.IsFenced(err) || errors.Is(err, errdefs.ErrPermissionDenied) ||
		errors.Is(err, errdefs.ErrFailedPrecondition) || errdefs.IsDataLoss(err)
}
