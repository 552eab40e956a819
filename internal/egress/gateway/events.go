package gateway

import (
	"net/http"

	"github.com/amber-run/amber/core/eventlog"
)

// Effect event types, appended to the stream "effects/<sandbox>" (Stream)
// under the sandbox's tenant and the writer's lease epoch. All at version 1.
const (
	// EventIntent is written, durably, before a request is forwarded. A key
	// has one intent per attempt (a re-send after a crash is attempt 2).
	EventIntent = "effect.intent" // IntentPayload
	// EventOutcome is written after the upstream answered (or failed), before
	// the client sees the answer. At most one per key.
	EventOutcome = "effect.outcome" // OutcomePayload
	// EventReconcile marks an at-most-once effect whose intent has no
	// outcome: it may or may not have happened, and was not re-sent.
	EventReconcile = "effect.needs_reconciliation" // ReconcilePayload
	// EventDivergence records a re-run request that differs from the one
	// recorded at the same position, and what the gateway did about it.
	EventDivergence = "effect.divergence" // DivergencePayload
	// EventName records the stand-in address the gateway's DNS gave the
	// sandbox for a name (package egress), before the answer is sent, so a
	// sandbox restored anywhere reaches the same names at the addresses it
	// remembers. The first record of a name wins.
	EventName = "effect.dns_name" // NamePayload
)

// RegisterEvents declares the effect event types in r.
func RegisterEvents(r *eventlog.Registry) {
	for _, t := range []string{EventIntent, EventOutcome, EventReconcile, EventDivergence, EventName} {
		r.Register(t, 1)
	}
}

// Stream is the event-log stream holding sandbox's effect journal.
func Stream(sandbox string) string { return "effects/" + sandbox }

// IntentPayload is the payload of effect.intent, version 1. Headers are
// the ones the sandbox sent: secrets appear only as placeholders.
type IntentPayload struct {
	Key        string      `json:"key"` // Key.ID()
	Run        string      `json:"run"`
	Method     string      `json:"method"`
	URL        string      `json:"url"`
	BodySHA256 string      `json:"body_sha256"`
	BodySize   int64       `json:"body_size"`
	Occurrence int         `json:"occurrence"`
	Slot       int         `json:"slot"` // n-th request to Method+URL since the cut
	Attempt    int         `json:"attempt"`
	Mode       Mode        `json:"mode"`
	IdemKey    string      `json:"idempotency_key,omitempty"`
	Headers    http.Header `json:"headers,omitempty"`
}

// OutcomePayload is the payload of effect.outcome, version 1. Body holds
// the response body when it is at most the journal's body limit; otherwise
// BodyTruncated is set, Body is empty and BodySize is the size the upstream
// announced (-1 if it did not): such an answer cannot be replayed (blob
// references come later).
type OutcomePayload struct {
	Key           string      `json:"key"`
	Run           string      `json:"run"`
	Attempt       int         `json:"attempt"`
	Status        int         `json:"status"`
	Headers       http.Header `json:"headers,omitempty"`
	Body          []byte      `json:"body,omitempty"`
	BodySize      int64       `json:"body_size"`
	BodySHA256    string      `json:"body_sha256,omitempty"`
	BodyTruncated bool        `json:"body_truncated,omitempty"`
	// Error is set when the upstream could not be reached or failed
	// mid-answer; Status is then 502.
	Error      string `json:"error,omitempty"`
	DurationNS int64  `json:"duration_ns"`
	// RequestBytes and ResponseBytes are what usage metering counts for
	// this forward (Decision.BytesOut and BytesIn): the request body, and
	// the response body (over the journal's limit: its announced length,
	// or what was buffered if none). Added within version 1; absent in
	// outcomes recorded before.
	RequestBytes  int64 `json:"request_bytes,omitempty"`
	ResponseBytes int64 `json:"response_bytes,omitempty"`
	// Reconciled is set on an outcome an operator recorded for an effect
	// that needed reconciliation (Gateway.Reconcile): their note on what
	// they found. The upstream was not contacted.
	Reconciled string `json:"reconciled,omitempty"`
}

// ReconcilePayload is the payload of effect.needs_reconciliation, version 1.
type ReconcilePayload struct {
	Key    string `json:"key"`
	Run    string `json:"run"`
	Method string `json:"method"`
	URL    string `json:"url"`
	Reason string `json:"reason"`
}

// DivergencePayload is the payload of effect.divergence, version 1.
type DivergencePayload struct {
	Key         string `json:"key"` // the new request's key
	Run         string `json:"run"`
	Method      string `json:"method"`
	URL         string `json:"url"`
	Slot        int    `json:"slot"`
	RecordedKey string `json:"recorded_key"`
	// RecordedBodySHA256 and BodySHA256 are what differs.
	RecordedBodySHA256 string           `json:"recorded_body_sha256"`
	BodySHA256         string           `json:"body_sha256"`
	Policy             DivergencePolicy `json:"policy"`
}

// NamePayload is the payload of effect.dns_name, version 1.
type NamePayload struct {
	Name string `json:"name"` // lower case, no trailing dot
	Addr string `json:"addr"`
}
