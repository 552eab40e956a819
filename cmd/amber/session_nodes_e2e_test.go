package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/internal/chaos"
	"github.com/amber-run/amber/internal/engine/enginetest"
)

// TestE2ENodesSessionFailover: three nodes and a stateless API server
// (amber api) in front of them. An agent session is created through the
// API server (placed on a node with room: its sandbox runs there); that
// node is killed (process and sandboxes) while a tool call runs. The node
// that takes it over takes the session too: the session goes on there from
// its log — the cut tool call re-issued against the sandbox restored to
// the session's checkpoint, so its effect on the sandbox's files happens
// once —, every event acknowledged before the kill is kept (read through
// the API server), and client events sent through the other live node and
// through the API server reach the session where it runs now.
func TestE2ENodesSessionFailover(t *testing.T) {
	bin, dir := e2eSetup(t)
	shared, adminKey := sharedStores(t, dir)
	nodes := map[string]*testNode{}
	for _, id := range []string{"node-a", "node-b", "node-c"} {
		nodes[id] = startNode(t, bin, dir, id, adminKey, shared)
	}
	front := startAPIServer(t, bin, dir, adminKey, shared)
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
	se, err := front.cl.CreateSession(ctx, map[string]any{"model": map[string]any{"adapter": "scripted", "script": script},
		"template": "minimal", "policy": "strict"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := front.cl.PostSessionEvent(ctx, se.ID, api.PostSessionEventRequest{Type: "user_message", ID: "go", Payload: json.RawMessage(`{"text":"go"}`)}); err != nil {
		t.Fatal(err)
	}
	// Wait until the bash call has started.
	via := front
	var acked []api.Event
	waitFor(t, 4*time.Minute, "the session's bash call to start", func() bool {
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
	first, err := via.cl.GetSandbox(ctx, sess.Sandbox)
	if err != nil || nodes[first.Node] == nil {
		t.Fatalf("the session's sandbox: %+v %v", first, err)
	}
	victim := nodes[first.Node]
	t.Logf("the API server placed the session on %s", victim.id)

	killed := time.Now()
	victim.stop(syscall.SIGKILL)
	destroyLeftovers(t, filepath.Join(victim.dataDir, "drivers", enginetest.DriverName()))
	sb := waitMoved(t, via, sess.Sandbox, victim.id, 0, 2*time.Minute)
	winner := nodes[sb.Node]
	var loser *testNode
	for id, n := range nodes {
		if id != victim.id && id != winner.id {
			loser = n
		}
	}
	t.Logf("the session's sandbox runs on %s %s after %s was killed", sb.Node, time.Since(killed).Round(time.Millisecond), victim.id)

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
	// And one through the API server: the script has no more turns, so
	// the model call fails on the winner and says so in the log.
	if _, err := front.cl.PostSessionEvent(ctx, se.ID, api.PostSessionEventRequest{Type: "user_message", ID: "third", Payload: json.RawMessage(`{"text":"third"}`)}); err != nil {
		t.Fatal(err)
	}
	waitForOr(t, time.Minute, "the third message to be taken up on "+winner.id, func() string { return tail(quiet(winner.log()), 30) }, func() bool {
		l, err := front.cl.SessionEvents(ctx, se.ID, 0, 1000)
		return err == nil && countType(l.Events, "session.model_request_started") >= 6
	})
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

// startAPIServer runs `amber api` in front of the nodes whose shared flags
// are shared; it is stopped when the test ends.
func startAPIServer(t *testing.T, bin, dir, adminKey string, shared []string) *testNode {
	t.Helper()
	store := ""
	for i, f := range shared {
		if f == "--store" && i+1 < len(shared) {
			store = shared[i+1]
		}
	}
	addr := freeAddr(t)
	logPath := filepath.Join(dir, "api.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "api", "--addr", addr, "--store", store, "--name", "front")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, bin: bin, dataDir: dir, addr: addr, cmd: cmd, pid: cmd.Process.Pid, exited: make(chan struct{}), logPath: logPath}
	go func() { cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() { d.stop(syscall.SIGTERM) })
	waitFor(t, 30*time.Second, "amber api to be ready", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	cl, err := client.New(addr, adminKey)
	if err != nil {
		t.Fatal(err)
	}
	return &testNode{daemon: d, id: "api", cl: cl}
}

// TestE2ENodesEffectFailover: an agent session on node a places an order
// through a's egress gateway (strict policy, the order's intent in the
// effect journal); the shop books it and holds its answer, and a is killed
// while the request is in flight. The node that takes a over takes the
// session and the sandbox's effect journal: the cut tool call is re-issued
// and its request re-sent with the same Idempotency-Key, so the shop books
// the order once and answers the repeat from its record.
//
// It failed (the order booked twice) while a new session sandbox had no
// checkpoint before its first tool call: the node taking over made a new
// sandbox, whose requests were new effects. The session now cuts a new
// sandbox before its first tool call (session.firstCut).
func TestE2ENodesEffectFailover(t *testing.T) {
	bin, dir := e2eSetup(t)
	if !hasTemplate("python") {
		t.Skip("no python template (the http tool runs python in the sandbox)")
	}
	sh, err := chaos.StartShop("book")
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	shared, adminKey := sharedStores(t, dir)
	var flags []string
	for _, f := range shared {
		if f != "--egress=false" {
			flags = append(flags, f)
		}
	}
	flags = append(flags, "--egress-host", "shop.test=127.0.0.1", "--egress-allow", fmt.Sprintf("shop.test:%d", sh.Port))
	a := startNode(t, bin, dir, "node-a", adminKey, flags)
	b := startNode(t, bin, dir, "node-b", adminKey, flags)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	script := []map[string]any{
		{"tool_calls": []any{map[string]any{"name": "http", "input": map[string]any{"method": "POST",
			"url": fmt.Sprintf("http://shop.test:%d/orders", sh.Port), "headers": map[string]string{"Content-Type": "application/json"},
			"body": `{"item":"book","qty":1}`}}}},
		{"text": "ordered"},
	}
	se, err := a.cl.CreateSession(ctx, map[string]any{"model": map[string]any{"adapter": "scripted", "script": script},
		"template": "python", "policy": "strict"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.cl.PostSessionEvent(ctx, se.ID, api.PostSessionEventRequest{Type: "user_message", ID: "go", Payload: json.RawMessage(`{"text":"go"}`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sh.Arrived:
	case <-time.After(4 * time.Minute):
		t.Fatalf("the order never reached the shop\n%s", tail(quiet(a.log()), 40))
	}
	// The shop has booked it and holds the answer: a dies now.
	a.stop(syscall.SIGKILL)
	destroyLeftovers(t, filepath.Join(a.dataDir, "drivers", enginetest.DriverName()))
	close(sh.Release)
	waitForOr(t, 4*time.Minute, "the session to finish on node-b", func() string { return tail(quiet(b.log()), 60) }, func() bool {
		l, err := b.cl.SessionEvents(ctx, se.ID, 0, 1000)
		return err == nil && countType(l.Events, "session.assistant_message") >= 2 && lastStatus(l.Events) == "idle"
	})
	l, err := b.cl.SessionEvents(ctx, se.ID, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if items, dedup := sh.Items(), sh.Deduplicated(); len(items) != 1 || dedup != 1 {
		var evs []string
		for _, ev := range l.Events {
			p := string(ev.Payload)
			if len(p) > 160 {
				p = p[:160]
			}
			evs = append(evs, fmt.Sprintf("%d %s %s", ev.Seq, ev.Type, p))
		}
		t.Fatalf("the shop booked %v and answered %d repeats from its record; want one booking and one repeat (the same key re-sent by node-b)\nsession log:\n%s",
			items, dedup, strings.Join(evs, "\n"))
	}
	var result string
	for _, ev := range l.Events {
		if ev.Type == "session.tool_result" {
			result = string(ev.Payload)
		}
	}
	if !strings.Contains(result, `order`) || !strings.Contains(result, `book`) {
		t.Fatalf("the order's tool result on node-b: %s", result)
	}
}
