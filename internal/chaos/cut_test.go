package chaos

import (
	"encoding/json"
	"testing"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/eventlog"
	"github.com/amber-run/amber/internal/session"
)

func ev(t *testing.T, typ string, payload any) api.Event {
	t.Helper()
	b, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	return api.Event{Type: typ, Payload: b}
}

// TestNewestCut: the harness brings a session's sandbox back to the cut
// the session's own state names (State.Cut) — under strict the checkpoint
// of the last tool result, not the first cut's session.checkpointed (what
// the harness used: issue 23, harness defect). Each case is checked
// against the session's fold of the same events.
func TestNewestCut(t *testing.T) {
	created := ev(t, session.EventSandboxCreated, session.SandboxCreated{Sandbox: "sbx-a", Template: "python"})
	first := ev(t, session.EventCheckpointed, session.Checkpointed{Checkpoint: "ck-first", Sandbox: "sbx-a"})
	r1 := ev(t, session.EventToolResult, session.ToolResult{ToolCallID: "c1", Name: "bash", Output: "1", Changed: true, Checkpoint: "ck-after-c1"})
	r2 := ev(t, session.EventToolResult, session.ToolResult{ToolCallID: "c2", Name: "read_file", Output: "2"})
	for _, c := range []struct {
		name string
		evs  []api.Event
		want string
	}{
		{"first cut only", []api.Event{created, first}, "ck-first"},
		{"strict: the last changing result's checkpoint", []api.Event{created, first, r1}, "ck-after-c1"},
		{"a read after it moves nothing", []api.Event{created, first, r1, r2}, "ck-after-c1"},
		{"a new sandbox has no cut", []api.Event{created, first, r1, created}, ""},
	} {
		if got := newestCut(c.evs); got != c.want {
			t.Errorf("%s: newestCut = %q, want %q", c.name, got, c.want)
		}
		if got := foldCut(t, c.evs); got != c.want {
			t.Errorf("%s: the session's own State.Cut is %q, the test wants %q", c.name, got, c.want)
		}
	}
}

// foldCut is the session's State.Cut after evs (with the tool calls the
// results answer).
func foldCut(t *testing.T, evs []api.Event) string {
	t.Helper()
	st := session.NewState("ses-test")
	calls := []session.ToolCall{{ID: "c1", Name: "bash", Input: json.RawMessage(`{}`)}, {ID: "c2", Name: "read_file", Input: json.RawMessage(`{}`)}}
	all := []api.Event{
		ev(t, session.EventCreated, session.Definition{Model: session.ModelConfig{Adapter: "scripted"}, Template: "python", Policy: session.PolicyStrict}),
		ev(t, session.EventAssistantMessage, session.AssistantMessage{ToolCalls: calls}),
	}
	all = append(all, evs...)
	for i, e := range all {
		if err := st.Apply(eventlog.Event{Tenant: "acme", Seq: uint64(i + 1), Type: e.Type, Version: 1, Payload: e.Payload}); err != nil {
			t.Fatalf("fold event %d (%s): %v", i+1, e.Type, err)
		}
	}
	return st.Cut.Checkpoint
}
