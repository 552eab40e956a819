package api

// A followed event stream (GET …/events?follow=true, NDJSON) is Events,
// and, when it fails, one last Error line. A session's SSE stream (GET
// /v1/sessions/{id}/events/stream) carries each durable Event as the data
// of an SSE event whose id is its seq and whose name is its type; live
// text as "session.assistant_delta" events with an AssistantDelta; a
// failure as an "error" event with an Error, the last.

// AssistantDelta is live text of a model's answer, sent as it comes and
// never stored: the complete text arrives in a session.assistant_message.
type AssistantDelta struct {
	Text string `json:"text"`
}
