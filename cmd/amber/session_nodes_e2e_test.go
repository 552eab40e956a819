package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/internal/enginetest"
)

// TestE2ENodesSessionFailover: an agent session runs on node a (its
// sandbox there); a is killed (process and sandboxes) while a tool call
// runs. The node that takes a over takes the session too: the session goes
// on there from its log — the cut tool call re-issued against the sandbox
// restored to the session's checkpoint, so its effect on the sandbox's
// files happens once —, every event acknowledged before the kill is kept,
// and a client event sent through the other live node reaches the session
// (forwarded to the node that runs it) and starts another turn there.
func TestE2ENodesSessionFailover(t *testing.T) {
	bin, dir := e2eSetup(t)
	shared, adminKey := sharedStores(t, dir)
	a := startNode(t, bin, dir, "node-a", adminKey, shared)
	nodes := map[string]*testNode{"node-a": a}
	for _, id := range []string{"node-b", "node-c"} {
		nodes[id] = startNode(t, bin, dir, id, adminKey, shared)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	call := func(name string, input map[string]any) map[string]any {
		return map[string]any{"name": name, "input": input}
	}
	script := []map[string]any{
		{"tool_calls": []any{call("write_file", map[string]any{"path": "/root/a.txt", "content": "one\n"})}},
		// The node dies while this runs.
		{"tool_calls": []any{call("bash", map[string]any{"command": "echo slept >> /root/b.txt; sleep 6; cat /root/a.txt"})}},
		{"text": "done"},
		// After a second user message, through another node.
		{"tool_calls": []any{call("bash", map[string]any{"command": "cat /root/b.txt"})}},
		{"text": "again"},
	}
	se, err := a.cl.CreateSession(ctx, map[string]any{"model": map[string]any{"adapter": "scripted", "script": script},
		"template": "minimal", "policy": "strict"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.cl.PostSessionEvent(ctx, se.ID, api.PostSessionEventRequest{Type: "user_message", ID: "go", Payload: json.RawMessage(`{"text":"go"}`)}); err != nil {
		t.Fatal(err)
	}
	// Wait until the bash call has started on a.
	via := nodes["node-b"]
	var acked []api.Event
	waitFor(t, 4*time.Minute, "the session's bash call to start on node-a", func() bool {
		l, err := via.cl.SessionEvents(ctx, se.ID, 0, 1000)
		if err != nil {
			return false
		}
		for _, ev := range l.Events {
			if ev.Type == "session.tool_started" && strings.Contains(string(ev.Payload), `"attempt":1`) && countType(l.Events, "session.tool_started") == 2 {
				acked = l.Events
				return true
			}
		}
		return false
	})
	sess, err := via.cl.GetSession(ctx, se.ID)
	if err != nil || sess.Sandbox == "" {
		t.Fatalf("session %s: %+v %v", se.ID, sess, err)
	}
	if sb, err := via.cl.GetSandbox(ctx, sess.Sandbox); err != nil || sb.Node != "node-a" {
		t.Fatalf("the session's sandbox: %+v %v, want it on node-a", sb, err)
	}

	killed := time.Now()
	a.stop(syscall.SIGKILL)
	destroyLeftovers(t, filepath.Join(a.dataDir, "drivers", enginetest.DriverName()))
	sb := waitMoved(t, via, sess.Sandbox, "node-a", 0, 2*time.Minute)
	winner, loser := nodes[sb.Node], nodes["node-b"]
	if sb.Node == "node-b" {
		loser = nodes["node-c"]
	}
	t.Logf("the session's sandbox runs on %s %s after node-a was killed", sb.Node, time.Since(killed).Round(time.Millisecond))

	// The session finishes on the winner, by itself.
	finished := func(want int) func() bool {
		return func() bool {
			l, err := loser.cl.SessionEvents(ctx, se.ID, 0, 1000)
			if err != nil {
				return false
			}
			return countType(l.Events, "session.assistant_message") >= want && lastStatus(l.Events) == "idle"
		}
	}
	waitForOr(t, 4*time.Minute, "the session to finish on "+winner.id, func() string { return tail(quiet(winner.log()), 60) }, finished(3))
	t.Logf("the session finished on %s %s after the kill", winner.id, time.Since(killed).Round(time.Millisecond))
	l, err := loser.cl.SessionEvents(ctx, se.ID, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range acked {
		if i >= len(l.Events) || l.Events[i].ID != ev.ID || l.Events[i].Seq != ev.Seq {
			t.Fatalf("acknowledged event %d (%s %s) lost or moved after the failover", ev.Seq, ev.ID, ev.Type)
		}
	}
	// The cut call was re-issued once, on a sandbox brought back to the
	// session's position: its line in b.txt is there once.
	if out := winner.must("exec", sess.Sandbox, "--", "cat", "/root/b.txt"); out != "slept\n" {
		t.Fatalf("/root/b.txt after the failover: %q, want one line (the cut call's effect once)", out)
	}
	var texts []string
	for _, ev := range l.Events {
		if ev.Type == "session.assistant_message" {
			texts = append(texts, string(ev.Payload))
		}
	}
	if !strings.Contains(texts[len(texts)-1], "done") {
		t.Fatalf("last answer %s, want done", texts[len(texts)-1])
	}

	// A client event through the loser reaches the session on the winner.
	if _, err := loser.cl.PostSessionEvent(ctx, se.ID, api.PostSessionEventRequest{Type: "user_message", ID: "again", Payload: json.RawMessage(`{"text":"again"}`)}); err != nil {
		t.Fatal(err)
	}
	waitForOr(t, 3*time.Minute, "the next turn on "+winner.id, func() string { return tail(quiet(winner.log()), 60) }, finished(5))
	l, _ = loser.cl.SessionEvents(ctx, se.ID, 0, 1000)
	var last string
	for _, ev := range l.Events {
		if ev.Type == "session.tool_result" {
			last = string(ev.Payload)
		}
	}
	if !strings.Contains(last, `slept\n`) || strings.Count(last, "slept") != 1 {
		t.Fatalf("the next turn's tool result %s, want one line 'slept'", last)
	}
	if strings.Contains(quiet(loser.log()), se.ID+" ") && strings.Contains(loser.log(), "session harness stopped") {
		t.Logf("note: the loser logged about the session:\n%s", tail(quiet(loser.log()), 20))
	}
}

func countType(evs []api.Event, typ string) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

func lastStatus(evs []api.Event) string {
	status := ""
	for _, ev := range evs {
		if ev.Type == "session.status" {
			var s struct{ Status string }
			json.Unmarshal(ev.Payload, &s)
			status = s.Status
		}
	}
	return status
}
