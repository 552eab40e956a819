package session

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/eventlog"
)

// Message is one item of the conversation as the model sees it.
type Message struct {
	// Role: "user", "assistant" or "tool" (a tool result).
	Role      string     `json:"role"`
	Text      string     `json:"text,omitempty"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// Tool results: the call answered and whether it failed.
	ToolCallID string `json:"tool_call_id,omitempty"`
	ToolName   string `json:"tool_name,omitempty"`
	IsError    bool   `json:"is_error,omitempty"`
}

// State is a session as its log says it is: everything the harness knows,
// rebuilt by folding the events in order (Apply). It is a pure function of
// the log; the harness holds nothing else.
type State struct {
	ID, Tenant string
	Def        Definition
	Created    time.Time
	Head       uint64

	Status       Status
	StatusReason string
	StatusSeq    uint64 // position of the latest status event
	Limits       Limits // Def.Limits, raised by resume events

	// Messages is the whole conversation (the context is built from it).
	Messages []Message
	// deferred holds user messages that arrived while tool calls were
	// pending: they join the conversation after the last tool result (a
	// tool result must follow its call).
	deferred []Message

	// Calls is the number of completed model calls; Open is a call whose
	// start is recorded and whose end is not (cut off, or interrupted).
	Calls int
	Open  *ModelRequestStarted
	Usage Usage

	// Pending are the tool calls of the latest assistant message that have
	// no result yet, in order.
	Pending      []ToolCall
	ToolAttempts map[string]int // tool call id → attempts started
	Results      map[string]ToolResult
	ResultSeq    map[string]uint64
	Confirmed    map[string]ToolConfirmation
	Custom       map[string]CustomToolResult

	Sandbox string
	// SandboxesNamed counts the sandboxes the log has named for the
	// session (sandbox_created, and each sandbox_restored that names
	// another): the next one made is the SandboxesNamed+1-th (its labels,
	// sandboxLabels, say so).
	SandboxesNamed int
	// Cut is the newest checkpoint tied to a step boundary (strict: from
	// a tool result; fast: a checkpointed event) and the log position of
	// the last tool result it covers; ChangedSinceCut counts the
	// sandbox-changing results after it, ChangedAfterCut lists their calls.
	Cut             Checkpointed
	ChangedSinceCut int
	ChangedAfterCut []string

	// Interrupted: an interrupt not yet answered by a status event.
	Interrupted bool
	Terminated  bool
	// LastInput is the position of the newest client event.
	LastInput uint64
}

// NewState returns the empty state of session id.
func NewState(id string) *State {
	return &State{ID: id, ToolAttempts: map[string]int{}, Results: map[string]ToolResult{},
		ResultSeq: map[string]uint64{}, Confirmed: map[string]ToolConfirmation{}, Custom: map[string]CustomToolResult{}}
}

// Apply folds ev (already upcast) into s. Events must come in order.
func (s *State) Apply(ev eventlog.Event) error {
	if ev.Seq != s.Head+1 {
		return errdefs.DataLossf("session %s: event %d follows %d", s.ID, ev.Seq, s.Head)
	}
	s.Head = ev.Seq
	dec := func(v any) error {
		if err := json.Unmarshal(ev.Payload, v); err != nil {
			return errdefs.DataLossf("session %s: event %d (%s) does not decode: %v", s.ID, ev.Seq, ev.Type, err)
		}
		return nil
	}
	if InputTypes[ev.Type] {
		s.LastInput = ev.Seq
	}
	switch ev.Type {
	case EventCreated:
		if err := dec(&s.Def); err != nil {
			return err
		}
		s.Tenant, s.Created, s.Limits, s.Status = ev.Tenant, ev.Time, s.Def.Limits, StatusIdle
	case EventUserMessage:
		var p UserMessage
		if err := dec(&p); err != nil {
			return err
		}
		m := Message{Role: "user", Text: p.Text}
		if len(s.Pending) > 0 {
			s.deferred = append(s.deferred, m)
		} else {
			s.Messages = append(s.Messages, m)
		}
	case EventInterrupt:
		s.Interrupted = true
	case EventToolConfirmation:
		var p ToolConfirmation
		if err := dec(&p); err != nil {
			return err
		}
		if _, ok := s.Confirmed[p.ToolCallID]; !ok {
			s.Confirmed[p.ToolCallID] = p
		}
	case EventCustomToolResult:
		var p CustomToolResult
		if err := dec(&p); err != nil {
			return err
		}
		if _, ok := s.Custom[p.ToolCallID]; !ok {
			s.Custom[p.ToolCallID] = p
		}
	case EventResume:
		var p Resume
		if err := dec(&p); err != nil {
			return err
		}
		s.Limits = p.Limits
	case EventTerminate:
		s.Terminated = true
	case EventStatus:
		var p StatusChange
		if err := dec(&p); err != nil {
			return err
		}
		s.Status, s.StatusReason, s.StatusSeq = p.Status, p.Reason, ev.Seq
		s.Interrupted = false
	case EventModelRequestStarted:
		var p ModelRequestStarted
		if err := dec(&p); err != nil {
			return err
		}
		s.Open = &p
	case EventModelRequestEnded:
		var p ModelRequestEnded
		if err := dec(&p); err != nil {
			return err
		}
		s.Open = nil
		s.Calls = p.Call
		s.Usage.InputTokens += p.Usage.InputTokens
		s.Usage.OutputTokens += p.Usage.OutputTokens
	case EventAssistantMessage:
		var p AssistantMessage
		if err := dec(&p); err != nil {
			return err
		}
		s.Messages = append(s.Messages, Message{Role: "assistant", Text: p.Text, ToolCalls: p.ToolCalls})
		s.Pending = append([]ToolCall(nil), p.ToolCalls...)
	case EventToolCall:
		// The calls are in the assistant message; this event is for clients.
	case EventToolStarted:
		var p ToolStarted
		if err := dec(&p); err != nil {
			return err
		}
		s.ToolAttempts[p.ToolCallID] = p.Attempt
	case EventToolResult:
		var p ToolResult
		if err := dec(&p); err != nil {
			return err
		}
		if err := s.applyToolResult(p, ev.Seq); err != nil {
			return err
		}
	case EventSandboxCreated:
		var p SandboxCreated
		if err := dec(&p); err != nil {
			return err
		}
		s.nameSandbox(p.Sandbox)
		s.Cut, s.ChangedSinceCut, s.ChangedAfterCut = Checkpointed{}, 0, nil
	case EventCheckpointed:
		var p Checkpointed
		if err := dec(&p); err != nil {
			return err
		}
		s.Cut = p
		// Results after p.AfterSeq are not covered.
		var after []string
		for _, id := range s.ChangedAfterCut {
			if s.ResultSeq[id] > p.AfterSeq {
				after = append(after, id)
			}
		}
		s.ChangedAfterCut, s.ChangedSinceCut = after, len(after)
	case EventSandboxRestored:
		var p SandboxRestored
		if err := dec(&p); err != nil {
			return err
		}
		s.nameSandbox(p.Sandbox)
	case EventDivergence, EventError:
	default:
		return errdefs.DataLossf("session %s: event %d has unknown type %s", s.ID, ev.Seq, ev.Type)
	}
	return nil
}

// nameSandbox makes id the session's sandbox (counted when it is another).
func (s *State) nameSandbox(id string) {
	if id != s.Sandbox {
		s.SandboxesNamed++
	}
	s.Sandbox = id
}

// applyToolResult applies the result p of a tool call, the event at seq:
// a second result for a call is DataLoss. The call is no longer pending;
// messages deferred while calls were pending follow the last result; the
// result's checkpoint (or its change) moves the cut.
func (s *State) applyToolResult(p ToolResult, seq uint64) error {
	if _, dup := s.Results[p.ToolCallID]; dup {
		return errdefs.DataLossf("session %s: second result for tool call %s at %d", s.ID, p.ToolCallID, seq)
	}
	s.Results[p.ToolCallID] = p
	s.ResultSeq[p.ToolCallID] = seq
	s.Messages = append(s.Messages, Message{Role: "tool", Text: p.Output, ToolCallID: p.ToolCallID, ToolName: p.Name, IsError: p.IsError})
	for i, c := range s.Pending {
		if c.ID == p.ToolCallID {
			s.Pending = append(s.Pending[:i:i], s.Pending[i+1:]...)
			break
		}
	}
	if len(s.Pending) == 0 && len(s.deferred) > 0 {
		s.Messages = append(s.Messages, s.deferred...)
		s.deferred = nil
	}
	if p.Checkpoint != "" {
		s.Cut = Checkpointed{Checkpoint: p.Checkpoint, Sandbox: s.Sandbox, AfterSeq: seq}
		s.ChangedSinceCut, s.ChangedAfterCut = 0, nil
	} else if p.Changed {
		s.ChangedSinceCut++
		s.ChangedAfterCut = append(s.ChangedAfterCut, p.ToolCallID)
	}
	return nil
}

// NeedsModel says the conversation waits for the model: its last item is
// a user message or a tool result, and no tool call is pending.
func (s *State) NeedsModel() bool {
	if len(s.Pending) > 0 || len(s.Messages) == 0 {
		return false
	}
	r := s.Messages[len(s.Messages)-1].Role
	return r == "user" || r == "tool"
}

// OverBudget names the budget the session has reached, or "".
func (s *State) OverBudget(now time.Time) string {
	l := s.Limits
	switch {
	case l.MaxTurns > 0 && s.Calls >= l.MaxTurns:
		return fmt.Sprintf("max turns %d reached", l.MaxTurns)
	case l.MaxTokens > 0 && s.Usage.InputTokens+s.Usage.OutputTokens >= l.MaxTokens:
		return fmt.Sprintf("max tokens %d reached (%d used)", l.MaxTokens, s.Usage.InputTokens+s.Usage.OutputTokens)
	case l.MaxWall > 0 && now.Sub(s.Created) >= l.MaxWall:
		return fmt.Sprintf("max wall time %v reached", l.MaxWall)
	}
	return ""
}
