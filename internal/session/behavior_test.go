package session

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/amber-run/amber/lib/failpoint"
)

func wake(t *testing.T, e *testEnv, id string, want Status) {
	t.Helper()
	st, err := e.harness(nil).Wake(context.Background(), id)
	if err != nil || st != want {
		t.Fatalf("wake: %v %v, want %s", st, err, want)
	}
	if s := e.state(id); s.Status != want {
		t.Fatalf("log says %s, want %s", s.Status, want)
	}
}

// TestCustomToolAndConfirmation: a custom tool's call waits for the
// client's result; a tool in Confirm waits for a confirmation, and a denial
// is answered to the model without running the tool.
func TestCustomToolAndConfirmation(t *testing.T) {
	e := newTestEnv(t, []ScriptTurn{
		{ToolCalls: []ScriptToolCall{{Name: "lookup_order", Input: in(`{"order":"A1"}`)}}},
		{ToolCalls: []ScriptToolCall{{Name: "bash", Input: in(`{"command":"rm -rf /data"}`)}}},
		{ToolCalls: []ScriptToolCall{{Name: "bash", Input: in(`{"command":"ls"}`)}}},
		{Text: "ok"},
	})
	id := e.create(Definition{Model: ModelConfig{Adapter: "scripted"}, Confirm: []string{"bash"},
		CustomTools: []ToolSpec{{Name: "lookup_order", Description: "look an order up", InputSchema: in(`{"type":"object"}`)}}})
	e.post(id, EventUserMessage, UserMessage{Text: "check order A1"})
	wake(t, e, id, StatusWaiting)
	if s := e.state(id); !strings.Contains(s.StatusReason, "custom tool call call_1_1") {
		t.Fatalf("waiting for %q", s.StatusReason)
	}
	wake(t, e, id, StatusWaiting) // nothing new: still waiting, nothing re-run
	e.post(id, EventCustomToolResult, CustomToolResult{ToolCallID: "call_1_1", Output: "shipped"})
	wake(t, e, id, StatusWaiting)
	if s := e.state(id); !strings.Contains(s.StatusReason, "confirmation of tool call call_2_1") {
		t.Fatalf("waiting for %q", s.StatusReason)
	}
	e.post(id, EventToolConfirmation, ToolConfirmation{ToolCallID: "call_2_1", Allow: false, Reason: "no deleting"})
	wake(t, e, id, StatusWaiting)
	e.post(id, EventToolConfirmation, ToolConfirmation{ToolCallID: "call_3_1", Allow: true})
	wake(t, e, id, StatusIdle)
	s := e.state(id)
	var tools []string
	for _, m := range s.Messages {
		if m.Role == "tool" {
			tools = append(tools, m.Text)
		}
	}
	if len(tools) != 3 || tools[0] != "shipped" || !strings.Contains(tools[1], "denied") || tools[2] != "exit 0\ncounter=1\n" {
		t.Fatalf("tool results %q", tools)
	}
	if execs, _, _ := e.boxes.counts(); execs != 1 {
		t.Fatalf("%d sandbox operations: the denied call ran?", execs)
	}
}

// TestInterruptAndLateUserMessage: an interrupt answers pending calls as
// interrupted and makes the session idle; a user message sent while calls
// were pending joins the conversation after their results.
func TestInterruptAndLateUserMessage(t *testing.T) {
	e := newTestEnv(t, []ScriptTurn{
		{ToolCalls: []ScriptToolCall{{Name: "q", Input: in(`{}`)}, {Name: "bash", Input: in(`{"command":"x"}`)}}},
		{Text: "noted"},
	})
	id := e.create(Definition{Model: ModelConfig{Adapter: "scripted"}, CustomTools: []ToolSpec{{Name: "q", InputSchema: in(`{"type":"object"}`)}}})
	e.post(id, EventUserMessage, UserMessage{Text: "start"})
	wake(t, e, id, StatusWaiting)
	e.post(id, EventUserMessage, UserMessage{Text: "also this"})
	e.post(id, EventInterrupt, Interrupt{Reason: "stop"})
	wake(t, e, id, StatusIdle)
	s := e.state(id)
	roles := []string{}
	for _, m := range s.Messages {
		roles = append(roles, m.Role+":"+m.Text)
	}
	got := strings.Join(roles, "|")
	want := "user:start|assistant:|tool:interrupted by the user before it ran|tool:interrupted by the user before it ran|user:also this"
	if got != want {
		t.Fatalf("conversation\n got %s\nwant %s", got, want)
	}
	if execs, _, _ := e.boxes.counts(); execs != 0 {
		t.Fatalf("an interrupted call ran")
	}
	// The next wake answers the late message (it is the last user turn).
	e.post(id, EventUserMessage, UserMessage{Text: "go on"})
	wake(t, e, id, StatusIdle)
	if s := e.state(id); s.Messages[len(s.Messages)-1].Text != "noted" {
		t.Fatalf("last message %+v", s.Messages[len(s.Messages)-1])
	}
}

// TestBudgetsPause: max turns pauses the session with a clear status; a
// resume with a higher limit continues it.
func TestBudgetsPause(t *testing.T) {
	e := newTestEnv(t, script)
	id := e.create(Definition{Model: ModelConfig{Adapter: "scripted"}, Limits: Limits{MaxTurns: 2}})
	e.post(id, EventUserMessage, UserMessage{Text: "go"})
	wake(t, e, id, StatusPausedBudget)
	s := e.state(id)
	if s.StatusReason != "max turns 2 reached" || s.Calls != 2 || e.model.Calls() != 2 {
		t.Fatalf("paused: %q after %d calls (%d to the model)", s.StatusReason, s.Calls, e.model.Calls())
	}
	wake(t, e, id, StatusPausedBudget) // still paused: no call
	if e.model.Calls() != 2 {
		t.Fatal("a paused session called the model")
	}
	e.post(id, EventResume, Resume{Limits: Limits{MaxTurns: 10}})
	wake(t, e, id, StatusIdle)
	if s := e.state(id); s.Calls != scriptCalls {
		t.Fatalf("after resume: %d calls", s.Calls)
	}

	e2 := newTestEnv(t, script)
	id2 := e2.create(Definition{Model: ModelConfig{Adapter: "scripted"}, Limits: Limits{MaxTokens: 5}})
	e2.post(id2, EventUserMessage, UserMessage{Text: "go"})
	wake(t, e2, id2, StatusPausedBudget)
	if s := e2.state(id2); !strings.HasPrefix(s.StatusReason, "max tokens 5 reached") || s.Calls != 1 {
		t.Fatalf("token budget: %q after %d calls", s.StatusReason, s.Calls)
	}
	e3 := newTestEnv(t, script)
	id3 := e3.create(Definition{Model: ModelConfig{Adapter: "scripted"}, Limits: Limits{MaxWall: time.Nanosecond}})
	e3.post(id3, EventUserMessage, UserMessage{Text: "go"})
	wake(t, e3, id3, StatusPausedBudget)
	if e3.model.Calls() != 0 {
		t.Fatal("wall budget: the model was called")
	}
}

// recordingModel keeps the requests it was sent.
type recordingModel struct {
	*Scripted
	reqs []Request
}

func (m *recordingModel) Complete(ctx context.Context, req Request, f func(string)) (Response, error) {
	m.reqs = append(m.reqs, req)
	return m.Scripted.Complete(ctx, req, f)
}

// TestCompaction: past the context budget the oldest turns leave the
// request (with a note), the latest turn stays whole, and the log keeps
// everything.
func TestCompaction(t *testing.T) {
	e := newTestEnv(t, nil)
	rm := &recordingModel{Scripted: NewScripted(nil)}
	id := e.create(Definition{Model: ModelConfig{Adapter: "scripted"}, ContextBudget: 300})
	h := e.harness(nil)
	h.Models = func(ModelConfig) (Model, error) { return rm, nil }
	for i := 0; i < 6; i++ {
		e.post(id, EventUserMessage, UserMessage{Text: strings.Repeat(string(rune('a'+i)), 100)})
		if _, err := h.Wake(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	last := rm.reqs[len(rm.reqs)-1]
	if !strings.Contains(last.Messages[0].Text, "compacted") || last.Messages[len(last.Messages)-1].Text != strings.Repeat("f", 100) {
		t.Fatalf("last request: %+v", last.Messages)
	}
	size := 0
	for _, m := range last.Messages[1:] {
		size += len(m.Text)
	}
	if size > 300 {
		t.Fatalf("context of %d characters past the budget", size)
	}
	if s := e.state(id); len(s.Messages) != 12 || s.Messages[0].Text != strings.Repeat("a", 100) {
		t.Fatalf("the log lost messages: %d", len(s.Messages))
	}
	starts := e.events(id, EventModelRequestStarted)
	if !strings.Contains(string(starts[len(starts)-1].Payload), `"compacted":`) {
		t.Fatalf("compaction not recorded in the request event: %s", starts[len(starts)-1].Payload)
	}
}

// TestInterruptAfterCutOffCall: a crash cut a changing call off, then the
// user interrupted. The call is answered as interrupted before it
// completed, and the sandbox is first brought back to before it (strict).
func TestInterruptAfterCutOffCall(t *testing.T) {
	e := newTestEnv(t, script)
	id := e.create(Definition{Model: ModelConfig{Adapter: "scripted"}, Policy: PolicyStrict})
	e.post(id, EventUserMessage, UserMessage{Text: "go"})
	fp := failpoint.New()
	fp.Arm(FPToolBeforeRecord, 3, failpoint.ErrCrash) // call_2_1 (bash) ran, not recorded
	if _, err := e.harness(fp).Wake(context.Background(), id); !errors.Is(err, failpoint.ErrCrash) {
		t.Fatal(err)
	}
	if got := e.sandboxState(id); !strings.Contains(got, "counter=2") {
		t.Fatalf("before the interrupt the sandbox shows the cut-off call: %s", got)
	}
	e.post(id, EventInterrupt, Interrupt{})
	wake(t, e, id, StatusIdle)
	s := e.state(id)
	if r := s.Results["call_2_1"]; r.Output != "interrupted by the user before it completed" || !r.IsError {
		t.Fatalf("cut-off call answered %+v", r)
	}
	if r := s.Results["call_2_2"]; r.Output != "interrupted by the user before it ran" {
		t.Fatalf("unstarted call answered %+v", r)
	}
	if got := e.sandboxState(id); !strings.Contains(got, "counter=1 ") {
		t.Fatalf("the sandbox was not brought back to the last acknowledged step: %s", got)
	}
	if len(e.events(id, EventSandboxRestored)) != 1 {
		t.Fatal("no restore recorded")
	}
}
