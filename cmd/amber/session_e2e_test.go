package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
)

// sessionScript: a file written and a command run in the sandbox, an
// answer; after the second user message a slow command that reads what the
// first turn left (so a daemon killed during it meets a cut-off call).
const sessionScript = `[
 {"text": "writing", "tool_calls": [
   {"name": "write_file", "input": {"path": "/tmp/notes.txt", "content": "hello"}},
   {"name": "bash", "input": {"command": "echo ran >> /tmp/runs; cat /tmp/notes.txt"}}]},
 {"text": "first part done"},
 {"text": "checking", "tool_calls": [
   {"name": "bash", "input": {"command": "sleep 1; echo again >> /tmp/runs; wc -l < /tmp/runs"}}]},
 {"text": "all done"}
]`

// collector follows a session's SSE stream and keeps every durable event it
// was given, across reconnects.
type collector struct {
	mu   sync.Mutex
	evs  []api.Event
	last uint64
}

func (c *collector) add(ev api.Event) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.evs = append(c.evs, ev)
	c.last = ev.Seq
	return nil
}

func (c *collector) status() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.evs) - 1; i >= 0; i-- {
		if c.evs[i].Type == "session.status" {
			var p struct{ Status string }
			json.Unmarshal(c.evs[i].Payload, &p)
			return p.Status
		}
	}
	return ""
}

// follow streams from c.last until ctx ends or the stream breaks.
func (c *collector) follow(ctx context.Context, cl *client.Client, id string) error {
	c.mu.Lock()
	after := c.last
	c.mu.Unlock()
	_, err := cl.StreamSessionEvents(ctx, id, after, false, c.add)
	return err
}

// waitIdle follows (reconnecting as a client would) until the session's
// latest status event is idle and at least n assistant messages were seen.
func (c *collector) waitIdle(t *testing.T, cl *client.Client, id string, n int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c.follow(ctx, cl, id)
		cancel()
		if c.status() == "idle" && c.count("session.assistant_message") >= n {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("session %s not idle with %d answers; status %q, %d events", id, n, c.status(), len(c.evs))
}

func (c *collector) count(typ string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ev := range c.evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

// TestE2ESessionStreamResumesAcrossRestart drives a scripted session in a
// real sandbox through the CLI and follows its log over Server-Sent Events.
// The client disconnects on its own, then the daemon is killed (SIGKILL)
// while the session works on its second turn; a new daemon wakes the
// session, and the client reconnects with Last-Event-ID. The events the
// client saw are exactly the log: every sequence number once, in order,
// none missing. The session finished as an uninterrupted one would: every
// tool result once, and the command of the first turn ran once (its line
// is in /tmp/runs once, as the second turn's count shows).
func TestE2ESessionStreamResumesAcrossRestart(t *testing.T) {
	bin, dir := e2eSetup(t)
	addr := freeAddr(t)
	d := startDaemon(t, bin, dir, addr, "--pool", "0")
	scriptFile := filepath.Join(dir, "script.json")
	if err := os.WriteFile(scriptFile, []byte(sessionScript), 0o644); err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(d.must("session", "create", "--model", "scripted", "--script", scriptFile, "--template", "minimal", "--policy", "strict"))
	key, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(addr, strings.TrimSpace(string(key)))
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{}

	// First turn, followed by the CLI until idle, and by our client, which
	// hangs up after three events and comes back.
	d.must("session", "send", id, "write the notes")
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	cl.StreamSessionEvents(ctx, id, 0, false, func(ev api.Event) error {
		col.add(ev)
		if n++; n == 3 {
			cancel()
			return errors.New("hang up")
		}
		return nil
	})
	cancel()
	if col.last != 3 {
		t.Fatalf("after hanging up at the third event the client holds %d", col.last)
	}
	out := d.must("session", "events", id, "--follow", "--until", "idle")
	if !strings.Contains(out, "session.assistant_message\tfirst part done") {
		t.Fatalf("amber session events --follow --until idle:\n%s", out)
	}
	col.waitIdle(t, cl, id, 2)

	// Second turn: the daemon dies while the slow command runs.
	d.must("session", "send", id, "check it")
	time.Sleep(600 * time.Millisecond)
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	col.follow(ctx, cl, id)
	cancel()
	d.stop(syscall.SIGKILL)
	if err := col.follow(context.Background(), cl, id); err == nil {
		t.Fatal("a stream from a dead daemon did not fail")
	}

	d = startDaemon(t, bin, dir, addr, "--pool", "0")
	col.waitIdle(t, cl, id, 4)

	// What the client saw is the log, each event once.
	all, err := cl.SessionEvents(context.Background(), id, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(col.evs) != len(all.Events) {
		t.Fatalf("client saw %d events, the log has %d", len(col.evs), len(all.Events))
	}
	for i, ev := range col.evs {
		if ev.Seq != uint64(i+1) || ev.ID != all.Events[i].ID {
			t.Fatalf("event %d the client saw: seq %d id %s; the log's: seq %d id %s", i, ev.Seq, ev.ID, all.Events[i].Seq, all.Events[i].ID)
		}
	}
	results := map[string]string{}
	for _, ev := range all.Events {
		if ev.Type == "session.tool_result" {
			var r struct {
				ToolCallID string `json:"tool_call_id"`
				Output     string `json:"output"`
			}
			json.Unmarshal(ev.Payload, &r)
			if _, dup := results[r.ToolCallID]; dup {
				t.Fatalf("two results for %s", r.ToolCallID)
			}
			results[r.ToolCallID] = r.Output
		}
	}
	want := map[string]string{
		"call_1_1": "wrote 5 bytes to /tmp/notes.txt",
		"call_1_2": "exit 0\nhello",
		"call_3_1": "exit 0\n2\n",
	}
	if fmt.Sprint(results) != fmt.Sprint(want) {
		t.Fatalf("tool results %q, want %q\nlog:\n%s", results, want, d.must("session", "events", id))
	}
	if got := col.count("session.assistant_message"); got != 4 {
		t.Fatalf("%d assistant messages", got)
	}
	var se api.Session
	json.Unmarshal([]byte(d.must("session", "show", id)), &se)
	if se.Status != "idle" || se.Sandbox == "" {
		t.Fatalf("session after the restart: %+v", se)
	}
	if ls := d.must("session", "ls"); !strings.Contains(ls, id) {
		t.Fatalf("session ls:\n%s", ls)
	}
	t.Logf("log after the restart:\n%s", d.must("session", "events", id))
	d.must("session", "send", id, "--type", "terminate", "--payload", `{"reason":"test over"}`)
	deadline := time.Now().Add(time.Minute)
	for {
		json.Unmarshal([]byte(d.must("session", "show", id)), &se)
		if se.Status == "terminated" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session not terminated: %+v", se)
		}
		time.Sleep(100 * time.Millisecond)
	}
	d.must("sandbox", "rm", se.Sandbox)
}

// TestE2EModelProviders: the operator's model provider (amber up
// --model-provider, here a listener on 127.0.0.1) gets the operator's key
// from the variable key-env names; a tenant's own base_url on 127.0.0.1 is
// refused at dial time and sees nothing; no other variable of the daemon's
// environment (PGPASSWORD, ANTHROPIC_API_KEY) reaches either; the CLI's
// --api-key-env is gone and a definition naming api_key_env is refused; a
// key-env naming an unset variable stops the daemon at start.
func TestE2EModelProviders(t *testing.T) {
	bin, dir := e2eSetup(t)
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, fmt.Sprint(r.URL.Path, " ", r.Header))
		mu.Unlock()
		http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"fake provider"}}`, 401)
	}))
	defer srv.Close()
	requests := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), seen...) }

	if out, err := exec.Command(bin, "up", "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "--model-provider") ||
		!strings.Contains(string(out), "key-env=VAR") || !strings.Contains(string(out), "tenants=") {
		t.Fatalf("amber up --help does not document --model-provider: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "up", "--data-dir", filepath.Join(dir, "other"), "--addr", freeAddr(t), "--model-provider", "x=http://127.0.0.1:9,key-env=AMBER_TEST_UNSET_KEY")
	cmd.Env = append(os.Environ(), "AMBER_TEST_UNSET_KEY=")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "AMBER_TEST_UNSET_KEY is not set") {
		t.Fatalf("amber up with an unset key-env: %v\n%s", err, out)
	}

	addr := freeAddr(t)
	d := startDaemonEnv(t, bin, dir, addr, []string{"CORP_KEY=operator-corp-key", "PGPASSWORD=marker-pg-e2e", "ANTHROPIC_API_KEY=marker-ant-e2e"},
		"--pool", "0", "--model-provider", "corp="+srv.URL+",key-env=CORP_KEY,adapter=anthropic",
		// The tenants' egress allows the listener, so the tenant's own URL below
		// passes the allowlist and meets the deny list at dial time.
		"--egress-allow", strings.TrimPrefix(srv.URL, "http://"))
	key, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(addr, strings.TrimSpace(string(key)))
	if err != nil {
		t.Fatal(err)
	}
	errorEvent := func(id string) string {
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			evs, err := cl.SessionEvents(context.Background(), id, 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs.Events {
				if ev.Type == "session.error" {
					return string(ev.Payload)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("session %s: no error event", id)
		return ""
	}

	// The operator's provider, picked by name (the operator's tenant: no tenants= needed).
	id := strings.TrimSpace(d.must("session", "create", "--provider", "corp", "--model-name", "m", "--template", "minimal"))
	d.must("session", "send", id, "hi")
	if e := errorEvent(id); !strings.Contains(e, "fake provider") {
		t.Fatalf("provider session's error: %s", e)
	}
	got := requests()
	if len(got) == 0 || !strings.Contains(got[0], "Bearer operator-corp-key") {
		t.Fatalf("the provider got %q, want the operator's key", got)
	}

	// The tenant's own URL: refused at dial time, nothing sent.
	own := strings.TrimSpace(d.must("session", "create", "--model", "anthropic", "--base-url", srv.URL, "--model-name", "m", "--template", "minimal"))
	d.must("session", "send", own, "hi")
	if e := errorEvent(own); !strings.Contains(e, "refusing to dial") {
		t.Fatalf("tenant base_url session's error: %s", e)
	}
	if n := len(requests()); n != len(got) {
		t.Fatalf("a tenant's base_url on 127.0.0.1 was dialled: %q", requests()[len(got):])
	}
	for _, r := range requests() {
		if strings.Contains(r, "marker-") {
			t.Fatalf("the daemon's environment reached a model endpoint: %s", r)
		}
	}

	if _, errs, code := d.amber("session", "create", "--model", "anthropic", "--api-key-env", "PGPASSWORD"); code == 0 || !strings.Contains(errs, "unknown flag") {
		t.Fatalf("--api-key-env: exit %d %s, want an unknown flag", code, errs)
	}
	defFile := filepath.Join(dir, "def.json")
	os.WriteFile(defFile, []byte(`{"model":{"adapter":"anthropic","base_url":"`+srv.URL+`","api_key_env":"PGPASSWORD"}}`), 0o644)
	if _, errs, code := d.amber("session", "create", "-f", defFile); code == 0 || !strings.Contains(errs, "api_key_env") {
		t.Fatalf("a definition naming api_key_env: exit %d %s, want refused naming it", code, errs)
	}
}
