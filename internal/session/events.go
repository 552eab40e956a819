package session

import (
	"encoding/json"
	"fmt"

	"github.com/amber-run/amber/core/eventlog"
)

// Event types of a session's stream "session/<id>", all at version 1.
//
// In (appended by clients through the API): user message, interrupt,
// tool confirmation, custom tool result, resume (after a budget pause) and
// terminate. Out (appended by the harness): everything else.
const (
	// EventCreated is the first event: the session's definition.
	EventCreated = "session.created"

	EventUserMessage      = "session.user_message"
	EventInterrupt        = "session.interrupt"
	EventToolConfirmation = "session.tool_confirmation"
	EventCustomToolResult = "session.custom_tool_result"
	EventResume           = "session.resume"
	EventTerminate        = "session.terminate"

	EventStatus              = "session.status"
	EventModelRequestStarted = "session.model_request_started"
	EventModelRequestEnded   = "session.model_request_ended"
	EventAssistantMessage    = "session.assistant_message"
	EventToolCall            = "session.tool_call"
	EventToolStarted         = "session.tool_started"
	EventToolResult          = "session.tool_result"
	EventSandboxCreated      = "session.sandbox_created"
	EventCheckpointed        = "session.checkpointed"
	EventSandboxRestored     = "session.sandbox_restored"
	EventDivergence          = "session.divergence"
	EventError               = "session.error"
	EventAssistantDelta      = "session.assistant_delta" // live only, never stored
)

// InputTypes are the event types a client may append.
var InputTypes = map[string]bool{
	EventUserMessage: true, EventInterrupt: true, EventToolConfirmation: true,
	EventCustomToolResult: true, EventResume: true, EventTerminate: true,
}

// RegisterEvents declares the session event types, all at version 1.
func RegisterEvents(r *eventlog.Registry) {
	for _, t := range []string{EventCreated, EventUserMessage, EventInterrupt, EventToolConfirmation,
		EventCustomToolResult, EventResume, EventTerminate, EventStatus, EventModelRequestStarted,
		EventModelRequestEnded, EventAssistantMessage, EventToolCall, EventToolStarted, EventToolResult,
		EventSandboxCreated, EventCheckpointed, EventSandboxRestored, EventDivergence, EventError} {
		r.Register(t, 1)
	}
}

// Stream is the event-log stream of session id.
func Stream(id string) string { return "session/" + id }

// Status is where a session is.
type Status string

const (
	StatusIdle                Status = "idle"    // waiting for a user message
	StatusRunning             Status = "running" // the harness is working
	StatusRecovering          Status = "recovering"
	StatusWaiting             Status = "waiting" // for a custom tool result or a confirmation
	StatusNeedsReconciliation Status = "needs-reconciliation"
	StatusPausedBudget        Status = "paused-budget"
	StatusTerminated          Status = "terminated"
)

// Payloads.

// UserMessage is a user's turn.
type UserMessage struct {
	Text string `json:"text"`
}

// Interrupt stops the current work at the next step boundary; the session
// becomes idle (its pending tool calls are answered as interrupted).
type Interrupt struct {
	Reason string `json:"reason,omitempty"`
}

// ToolConfirmation allows or denies a tool call that needs confirmation.
type ToolConfirmation struct {
	ToolCallID string `json:"tool_call_id"`
	Allow      bool   `json:"allow"`
	Reason     string `json:"reason,omitempty"`
}

// CustomToolResult answers a call to a custom tool (one the client runs).
type CustomToolResult struct {
	ToolCallID string `json:"tool_call_id"`
	Output     string `json:"output"`
	IsError    bool   `json:"is_error,omitempty"`
}

// Resume continues a session paused by a budget, with the limits raised.
type Resume struct {
	Limits Limits `json:"limits"`
}

// Terminate ends the session for good.
type Terminate struct {
	Reason string `json:"reason,omitempty"`
}

// StatusChange is a status event.
type StatusChange struct {
	Status Status `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// ModelRequestStarted is the intent of model call Call (the Call-th of the
// session, from 1), attempt Attempt (a call cut off by a crash is re-issued
// with the next attempt).
type ModelRequestStarted struct {
	Call    int    `json:"call"`
	Attempt int    `json:"attempt"`
	Model   string `json:"model"`
	// ContextMessages is how many messages were sent (after compaction).
	ContextMessages int `json:"context_messages"`
	Compacted       int `json:"compacted,omitempty"`
}

// Usage is what a model call cost.
type Usage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// ModelRequestEnded closes a model call; it is appended in one batch with
// the assistant message and its tool calls.
type ModelRequestEnded struct {
	Call       int    `json:"call"`
	Attempt    int    `json:"attempt"`
	Usage      Usage  `json:"usage"`
	StopReason string `json:"stop_reason,omitempty"`
}

// ToolCall is a tool the model asked for.
type ToolCall struct {
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

// AssistantMessage is a complete model answer (the durable event; deltas
// are live only).
type AssistantMessage struct {
	Call      int        `json:"call"`
	Text      string     `json:"text"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// ToolStarted is the intent to run a tool call (attempt from 1).
type ToolStarted struct {
	ToolCallID string `json:"tool_call_id"`
	Attempt    int    `json:"attempt"`
}

// ToolResult is a tool call's outcome, acknowledged to the agent.
type ToolResult struct {
	ToolCallID string `json:"tool_call_id"`
	Name       string `json:"name"`
	Output     string `json:"output"`
	IsError    bool   `json:"is_error,omitempty"`
	// Checkpoint (strict policy) is the committed checkpoint that covers
	// the sandbox as this tool left it; it was durable before this event.
	Checkpoint string `json:"checkpoint,omitempty"`
	// Changed says the tool may have changed the sandbox.
	Changed bool `json:"changed,omitempty"`
}

// SandboxCreated names the session's sandbox.
type SandboxCreated struct {
	Sandbox  string `json:"sandbox"`
	Template string `json:"template"`
}

// Checkpointed is a sandbox checkpoint cut at a step boundary: the
// sandbox as every tool result up to AfterSeq left it.
type Checkpointed struct {
	Checkpoint string `json:"checkpoint"`
	Sandbox    string `json:"sandbox"`
	AfterSeq   uint64 `json:"after_seq"`
}

// SandboxRestored says the sandbox was brought back to Checkpoint (or made
// anew from the template when Checkpoint is empty) before work went on.
type SandboxRestored struct {
	Sandbox    string `json:"sandbox"`
	Checkpoint string `json:"checkpoint,omitempty"`
	Reason     string `json:"reason"`
	// Rerun lists the recorded tool calls re-run in the restored sandbox
	// (fast policy) to bring it back to the log's position.
	Rerun []string `json:"rerun,omitempty"`
}

// Divergence is a re-run (fast policy) whose output differs from the one
// recorded: reported, never hidden. The recorded result stays the truth
// the agent saw.
type Divergence struct {
	ToolCallID string `json:"tool_call_id"`
	Recorded   string `json:"recorded"`
	Rerun      string `json:"rerun"`
}

// ErrorInfo is an error the harness met.
type ErrorInfo struct {
	During  string `json:"during"`
	Kind    string `json:"kind,omitempty"`
	Message string `json:"message"`
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("session: marshal %T: %v", v, err))
	}
	return b
}
