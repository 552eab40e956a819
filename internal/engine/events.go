package engine

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/meta"
)

// Lifecycle event types, appended to the stream "sandbox/<id>" under the
// sandbox's tenant. A pooled sandbox has no tenant and no events: its stream
// begins when it is claimed, with sandbox.created (from_pool true) and
// sandbox.started in one batch.
const (
	EventCreated   = "sandbox.created"   // CreatedPayload
	EventStarted   = "sandbox.started"   // StatePayload
	EventKilled    = "sandbox.killed"    // StatePayload: killed on request
	EventExited    = "sandbox.exited"    // StatePayload: its init died while the daemon watched
	EventCrashed   = "sandbox.crashed"   // StatePayload: found lost when the daemon started
	EventDestroyed = "sandbox.destroyed" // StatePayload
)

// CreatedPayload is the payload of sandbox.created, version 1.
type CreatedPayload struct {
	Template        string         `json:"template"`
	TemplateVersion string         `json:"template_version"`
	Driver          string         `json:"driver"`
	Limits          sandbox.Limits `json:"limits"`
	FromPool        bool           `json:"from_pool"`
}

// StatePayload is the payload of the other lifecycle events, version 1.
type StatePayload struct {
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// RegisterEvents declares the lifecycle event types, all at version 1.
func RegisterEvents(r *eventlog.Registry) {
	for _, t := range []string{EventCreated, EventStarted, EventKilled, EventExited, EventCrashed, EventDestroyed} {
		r.Register(t, 1)
	}
}

// Stream is the event-log stream of sandbox id.
func Stream(id string) string { return "sandbox/" + id }

// lifecycleEvent builds an event of sb's stream. Its id is derived from the
// sandbox id and the type (each lifecycle event happens at most once per
// sandbox) and its payload holds no time, so a retried append is a no-op.
func lifecycleEvent(sb meta.Sandbox, typ string, payload any) eventlog.Event {
	p, err := json.Marshal(payload)
	if err != nil {
		panic(fmt.Sprintf("engine: marshal %s payload: %v", typ, err))
	}
	return eventlog.Event{
		Tenant:  sb.Tenant,
		Stream:  Stream(sb.ID),
		ID:      sb.ID + "." + typ,
		Type:    typ,
		Version: 1,
		Payload: p,
	}
}

func createdEvents(sb meta.Sandbox) []eventlog.Event {
	return []eventlog.Event{
		lifecycleEvent(sb, EventCreated, CreatedPayload{
			Template: sb.Template, TemplateVersion: sb.TemplateVersion, Driver: sb.Driver,
			Limits: sb.Limits, FromPool: sb.FromPool,
		}),
		lifecycleEvent(sb, EventStarted, StatePayload{State: string(meta.StateRunning)}),
	}
}

// appendEvents writes events to sb's stream. Pooled sandboxes (no tenant)
// have no stream and nothing is written.
func (e *Engine) appendEvents(ctx context.Context, sb meta.Sandbox, evs ...eventlog.Event) error {
	if sb.Tenant == "" || len(evs) == 0 {
		return nil
	}
	if _, err := e.log.Append(ctx, Stream(sb.ID), 0, eventlog.Any, evs...); err != nil {
		return fmt.Errorf("append %s to %s: %w", evs[0].Type, Stream(sb.ID), err)
	}
	return nil
}

// Events returns up to limit events of sandbox id's stream from position
// from, lifted to their current versions.
func (e *Engine) Events(ctx context.Context, tenant, id string, from uint64, limit int) ([]eventlog.Event, error) {
	if _, err := e.Get(ctx, tenant, id); err != nil {
		return nil, err
	}
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	evs, err := e.log.Read(ctx, Stream(id), from, limit)
	if err != nil {
		return nil, fmt.Errorf("read events of %s: %w", id, err)
	}
	for i := range evs {
		if evs[i], err = e.reg.Upcast(evs[i]); err != nil {
			return nil, err
		}
	}
	return evs, nil
}

// Subscribe follows sandbox id's stream from position from.
func (e *Engine) Subscribe(ctx context.Context, tenant, id string, from uint64) (*eventlog.Subscription, error) {
	if _, err := e.Get(ctx, tenant, id); err != nil {
		return nil, err
	}
	return eventlog.Subscribe(e.log, Stream(id), from), nil
}

// Upcast lifts ev to its type's current version.
func (e *Engine) Upcast(ev eventlog.Event) (eventlog.Event, error) { return e.reg.Upcast(ev) }
