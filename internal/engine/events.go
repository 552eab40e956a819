package engine

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/state/meta"
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
	// EventCheckpointed carries the checkpoint's id as its CheckpointRef:
	// the log may be truncated below it once older checkpoints are gone.
	EventCheckpointed = "sandbox.checkpointed" // CheckpointedPayload
	// EventRestored is the fidelity report of a restore.
	EventRestored = "sandbox.restored" // RestoredPayload
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

// CheckpointedPayload is the payload of sandbox.checkpointed, version 1.
type CheckpointedPayload struct {
	Checkpoint string `json:"checkpoint"`
	// Seq is the last event of the stream before the cut.
	Seq            uint64 `json:"seq"`
	ManifestDigest string `json:"manifest_digest"`
	FrozenNS       int64  `json:"frozen_ns"`
	MemoryBytes    int64  `json:"memory_bytes"`
	LayerBytes     int64  `json:"layer_bytes"`
	Stopped        bool   `json:"stopped,omitempty"`
}

// RestoredPayload is the payload of sandbox.restored, version 1: what a
// restore brought back (the fidelity report).
type RestoredPayload struct {
	Checkpoint string `json:"checkpoint"`
	// From is the sandbox the checkpoint was cut from (another one for a
	// fork); Seq the log position of the cut in From's stream.
	From       string `json:"from"`
	Seq        uint64 `json:"seq"`
	Generation int    `json:"generation"`
	// ImageDigest was verified chunk by chunk before the driver ran, or,
	// from the node's hot copy (Hot), by its recorded files before and
	// by their bytes after (internal/engine/hottier.go).
	ImageDigest string `json:"image_digest"`
	Hot         bool   `json:"hot,omitempty"`
	// The driver's account of what it restored.
	Processes           int   `json:"processes"`
	MemoryBytes         int64 `json:"memory_bytes"`
	Files               int   `json:"files"`
	ConnectionsRestored int   `json:"connections_restored"`
	ConnectionsReset    int   `json:"connections_reset"`
	Lazy                bool  `json:"lazy"`
	// Times: fetching and verifying the image, then the driver.
	FetchNS   int64 `json:"fetch_ns"`
	RunningNS int64 `json:"running_ns"`
	// Replaced says a running incarnation was killed to make room.
	Replaced bool `json:"replaced,omitempty"`
	// LostCheckpoints are the sandbox's checkpoints cut after this one
	// whose image was lost before their upload (upload.go): the restore
	// fell back past them.
	LostCheckpoints []string `json:"lost_checkpoints,omitempty"`
	// NotRestored lists every kind of state the restore did not bring
	// back: the driver's account (sandbox.RestoreStats.NotRestored) and
	// the lost checkpoints. Empty when everything checked came back.
	NotRestored []sandbox.Loss `json:"not_restored,omitempty"`
}

// RegisterEvents declares the lifecycle event types, all at version 1.
func RegisterEvents(r *eventlog.Registry) {
	for _, t := range []string{EventCreated, EventStarted, EventKilled, EventExited, EventCrashed, EventDestroyed,
		EventCheckpointed, EventRestored, EventUpgraded, EventUsageRecorded} {
		r.Register(t, 1)
	}
}

// Stream is the event-log stream of sandbox id.
func Stream(id string) string { return "sandbox/" + id }

// lifecycleEvent builds an event of sb's stream. Its id is derived from the
// sandbox id, its generation and the type (each lifecycle event happens at
// most once per incarnation of a sandbox; a restore in place begins the
// next) and its payload holds no time, so a retried append is a no-op.
func lifecycleEvent(sb meta.Sandbox, typ string, payload any) eventlog.Event {
	id := sb.ID + "." + typ
	if sb.Generation > 0 {
		id = fmt.Sprintf("%s.g%d.%s", sb.ID, sb.Generation, typ)
	}
	return eventWithID(sb, id, typ, payload)
}

func eventWithID(sb meta.Sandbox, id, typ string, payload any) eventlog.Event {
	p, err := json.Marshal(payload)
	if err != nil {
		panic(fmt.Sprintf("engine: marshal %s payload: %v", typ, err))
	}
	return eventlog.Event{
		Tenant:  sb.Tenant,
		Stream:  Stream(sb.ID),
		ID:      id,
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
func (e *core) appendEvents(ctx context.Context, sb meta.Sandbox, evs ...eventlog.Event) error {
	if sb.Tenant == "" || len(evs) == 0 {
		return nil
	}
	// Once a sandbox was checkpointed its stream has a lease (see
	// holdLease): append under this engine's epoch, taking the lease again
	// after a restart; a stream another node holds stays fenced.
	e.lease.mu.Lock()
	epoch := e.lease.held[sb.ID].Epoch
	e.lease.mu.Unlock()
	_, err := e.log.Append(ctx, Stream(sb.ID), epoch, eventlog.Any, evs...)
	if errdefs.IsFenced(err) && epoch == 0 {
		var l eventlog.Lease
		if l, err = e.holdLease(ctx, sb.ID); err == nil {
			_, err = e.log.Append(ctx, Stream(sb.ID), l.Epoch, eventlog.Any, evs...)
		}
	}
	if err != nil {
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
	// Retention may have truncated the stream: reading starts at its first
	// retained event.
	if b, err := e.log.Bounds(ctx, Stream(id)); err == nil && from < b.First {
		from = b.First
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
	if b, err := e.log.Bounds(ctx, Stream(id)); err == nil && from < b.First {
		from = b.First // retention truncated the stream below from
	}
	return eventlog.Subscribe(e.log, Stream(id), from), nil
}

// Upcast lifts ev to its type's current version.
func (e *Engine) Upcast(ev eventlog.Event) (eventlog.Event, error) { return e.reg.Upcast(ev) }

// Ping checks that the event log answers.
func (e *Engine) Ping(ctx context.Context) error {
	if _, err := e.log.Bounds(ctx, "sandbox/ping"); err != nil {
		return fmt.Errorf("event log: %w", err)
	}
	return nil
}
