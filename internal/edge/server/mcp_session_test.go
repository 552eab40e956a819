package server_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/amber-run/amber/internal/edge/server"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/state/meta"
)

// mcpPost posts a JSON-RPC body to /v1/mcp with key and session sid ("":
// none) and returns the answer, read whole.
func mcpPost(t *testing.T, url, key, sid, body string) (*http.Response, string) {
	t.Helper()
	return mcpDo(t, "POST", url, key, sid, body)
}

func mcpDo(t *testing.T, method, url, key, sid, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctxT(t), method, url+"/v1/mcp", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

const mcpInit = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

// TestMCPSessions: initialize opens a session (Mcp-Session-Id, an SSE
// answer); the session serves its key only: another key of the same
// tenant, or of another tenant, gets 404 on POST, GET and DELETE; DELETE
// by its key ends it (204, then 404); a POST with neither a session nor
// an initialize is still answered in JSON.
func TestMCPSessions(t *testing.T) {
	_, env, url := newAPI(t)
	ctx := context.Background()
	const sameTenant = "amber_default_mcp_second_key_00000000000000"
	const otherTenant = "amber_globex_mcp_session_key_00000000000000"
	if _, err := env.Meta.CreateTenant(ctx, meta.Tenant{ID: "globex"}); err != nil {
		t.Fatal(err)
	}
	for tenant, k := range map[string]string{"default": sameTenant, "globex": otherTenant} {
		if err := env.Meta.PutKey(ctx, meta.APIKey{Tenant: tenant, Name: "mcp2", Hash: meta.HashKey(k), Scopes: meta.AllScopes}); err != nil {
			t.Fatal(err)
		}
	}
	resp, body := mcpPost(t, url, testKey, "", mcpInit)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || sid == "" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || !strings.Contains(body, `"serverInfo"`) {
		t.Fatalf("initialize: %d, session %q, %s: %s", resp.StatusCode, sid, resp.Header.Get("Content-Type"), body)
	}
	if strings.Contains(body, `"logging"`) {
		t.Errorf("the logging capability is advertised, but no log messages are sent: %s", body)
	}
	if resp, body := mcpPost(t, url, testKey, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("initialized: %d %s", resp.StatusCode, body)
	}
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	if resp, body := mcpPost(t, url, testKey, sid, list); resp.StatusCode != 200 || !strings.Contains(body, "sandbox_create") {
		t.Fatalf("tools/list in the session: %d %s", resp.StatusCode, body)
	}
	for _, k := range []string{sameTenant, otherTenant} {
		for _, m := range []string{"POST", "GET", "DELETE"} {
			if resp, body := mcpDo(t, m, url, k, sid, list); resp.StatusCode != http.StatusNotFound {
				t.Errorf("%s with another key's session (%s): %d %s; want 404", m, k[:13], resp.StatusCode, body)
			}
		}
	}
	if resp, body := mcpDo(t, "DELETE", url, testKey, sid, ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE of the session: %d %s", resp.StatusCode, body)
	}
	if resp, body := mcpPost(t, url, testKey, sid, list); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("POST in an ended session: %d %s; want 404", resp.StatusCode, body)
	}
	if resp, body := mcpPost(t, url, testKey, "", list); resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") || !strings.Contains(body, "sandbox_create") {
		t.Fatalf("sessionless tools/list: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
}

// TestMCPProgressAndCancel, with the SDK's client over a session: an exec
// that asks for progress gets notifications with its output while it
// runs, before its result, and so does a checkpoint; an exec whose call is
// cancelled (the client sends notifications/cancelled in another POST)
// stops at once, and its process is gone from the sandbox's ps.
func TestMCPProgressAndCancel(t *testing.T) {
	_, _, url := newAPI(t)
	// 2025-06-18: in a session, the cancel in a POST of its own; the
	// latest (2026-07-28, no sessions): the cancel is the request's end.
	for _, version := range []string{"2025-06-18", ""} {
		t.Run("protocol="+version, func(t *testing.T) { mcpProgressAndCancel(t, url, version) })
	}
}

func mcpProgressAndCancel(t *testing.T, url, version string) {
	var mu sync.Mutex
	var notes []string
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			notes = append(notes, r.Params.Message)
			mu.Unlock()
		}})
	s, err := c.Connect(ctxT(t), &mcp.StreamableClientTransport{Endpoint: url + "/v1/mcp",
		HTTPClient: &http.Client{Transport: bearer{testKey, http.DefaultTransport}}}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if (s.ID() == "") != (version == "") {
		t.Fatalf("protocol %q: MCP session id %q", version, s.ID())
	}
	var sb struct{ Sandbox string }
	if msg := call(t, s, "sandbox_create", map[string]any{"template": "minimal"}, &sb); msg != "" {
		t.Fatal(msg)
	}
	// taken waits for notifications holding each of want (the client
	// hands them to the handler on goroutines of their own, so the last
	// may come after the call's result) and returns them, forgotten.
	taken := func(want ...string) (string, bool) {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			got := strings.Join(notes, "|")
			mu.Unlock()
			missing := false
			for _, w := range want {
				missing = missing || !strings.Contains(got, w)
			}
			if !missing || time.Now().After(deadline) {
				mu.Lock()
				notes = nil
				mu.Unlock()
				return got, !missing
			}
		}
	}

	p := &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"sandbox": sb.Sandbox,
		"command": []string{"sh", "-c", "echo first-line; sleep 1; echo second-line"}}}
	p.SetProgressToken("t1")
	res, err := s.CallTool(ctxT(t), p)
	if err != nil || res.IsError {
		t.Fatalf("exec with progress: %v %+v", err, res)
	}
	if got, ok := taken("started as pid", "first-line", "second-line", "exited with code 0"); !ok {
		t.Errorf("exec's progress: %q", got)
	}
	p = &mcp.CallToolParams{Name: "checkpoint", Arguments: map[string]any{"sandbox": sb.Sandbox}}
	p.SetProgressToken(2)
	if res, err := s.CallTool(ctxT(t), p); err != nil || res.IsError {
		t.Fatalf("checkpoint with progress: %v %+v", err, res)
	}
	if got, ok := taken("started", " taken"); !ok {
		t.Errorf("checkpoint's progress: %q", got)
	}

	// Cancel: the call ends as soon as the client gives up on it, and
	// the command with it.
	cctx, cancel := context.WithCancel(ctxT(t))
	p = &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"sandbox": sb.Sandbox, "command": []string{"sleep", "3141"}}}
	p.SetProgressToken("t3")
	done := make(chan error, 1)
	go func() { _, err := s.CallTool(cctx, p); done <- err }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(strings.Join(notes0(&mu, &notes), "|"), "started as pid") {
		if time.Now().After(deadline) {
			t.Fatal("the long exec never reported its start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var ps struct{ Stdout string }
	if call(t, s, "exec", map[string]any{"sandbox": sb.Sandbox, "command": []string{"ps"}}, &ps); !strings.Contains(ps.Stdout, "sleep 3141") {
		t.Fatalf("the long exec is not in ps:\n%s", ps.Stdout)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	for {
		call(t, s, "exec", map[string]any{"sandbox": sb.Sandbox, "command": []string{"ps"}}, &ps)
		if !strings.Contains(ps.Stdout, "3141") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cancelled command still runs:\n%s", ps.Stdout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func notes0(mu *sync.Mutex, notes *[]string) []string {
	mu.Lock()
	defer mu.Unlock()
	return append([]string(nil), *notes...)
}

// TestMCPCancelledGetsNoAnswer, on the wire: a call cancelled by a
// notifications/cancelled in another POST of its session is not answered
// (the spec asks it; the TypeScript client reports an answer to a request
// it cancelled as an error), and its stream ends. Its progress
// notifications stop too.
func TestMCPCancelledGetsNoAnswer(t *testing.T) {
	_, _, url := newAPI(t)
	resp, _ := mcpPost(t, url, testKey, "", mcpInit)
	sid := resp.Header.Get("Mcp-Session-Id")
	mcpPost(t, url, testKey, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	_, body := mcpPost(t, url, testKey, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sandbox_create","arguments":{"template":"minimal"}}}`)
	i := strings.Index(body, `"sandbox":"`)
	if i < 0 {
		t.Fatalf("sandbox_create: %s", body)
	}
	sb := body[i+len(`"sandbox":"`):]
	sb = sb[:strings.IndexByte(sb, '"')]

	got := make(chan string, 1)
	go func() {
		_, b := mcpPost(t, url, testKey, sid, `{"jsonrpc":"2.0","id":"long","method":"tools/call","params":{"_meta":{"progressToken":"p"},"name":"exec","arguments":{"sandbox":"`+sb+`","command":["sh","-c","while :; do echo tick; sleep 0.1; done"]}}}`)
		got <- b
	}()
	time.Sleep(time.Second) // the command runs, ticks go out as progress
	if resp, b := mcpPost(t, url, testKey, sid, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"long","reason":"test"}}`); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("cancel: %d %s", resp.StatusCode, b)
	}
	select {
	case b := <-got:
		if strings.Contains(b, `"id":"long"`) {
			t.Fatalf("the cancelled call was answered:\n%s", b)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled call's stream did not end")
	}
}

// TestMCPSessionsEndAtShutdown: when the daemon shuts down (CloseStreams)
// its MCP sessions end, their GET streams with them (an open one would
// hold http.Server.Shutdown to its deadline), and no new one opens.
func TestMCPSessionsEndAtShutdown(t *testing.T) {
	env := enginetest.New(t, engine.Options{})
	if err := env.Meta.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(testKey), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Options{Engine: env.Engine, Meta: env.Meta, Logger: enginetest.Logger(t), Version: "test"})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	resp, _ := mcpPost(t, ts.URL, testKey, "", mcpInit)
	sid := resp.Header.Get("Mcp-Session-Id")
	mcpPost(t, ts.URL, testKey, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	req, _ := http.NewRequestWithContext(ctxT(t), "GET", ts.URL+"/v1/mcp", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	stream, err := http.DefaultClient.Do(req) // returns once the stream is open
	if err != nil || stream.StatusCode != 200 {
		t.Fatalf("GET stream: %v %v", err, stream)
	}
	defer stream.Body.Close()
	ended := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, stream.Body); ended <- err }()
	srv.CloseStreams()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the session's GET stream outlived CloseStreams")
	}
	if resp, body := mcpPost(t, ts.URL, testKey, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("POST in a session after shutdown: %d %s", resp.StatusCode, body)
	}
	if resp, body := mcpPost(t, ts.URL, testKey, "", mcpInit); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("initialize during shutdown: %d %s", resp.StatusCode, body)
	}
}

// TestMCPDeleteEndsCalls: DELETE of a session ends at once, its running
// command with it (the SDK's Close waits for the calls in flight).
func TestMCPDeleteEndsCalls(t *testing.T) {
	_, _, url := newAPI(t)
	resp, _ := mcpPost(t, url, testKey, "", mcpInit)
	sid := resp.Header.Get("Mcp-Session-Id")
	mcpPost(t, url, testKey, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	_, body := mcpPost(t, url, testKey, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sandbox_create","arguments":{"template":"minimal"}}}`)
	i := strings.Index(body, `"sandbox":"`)
	if i < 0 {
		t.Fatalf("sandbox_create: %s", body)
	}
	sb := body[i+len(`"sandbox":"`):]
	sb = sb[:strings.IndexByte(sb, '"')]
	go mcpPost(t, url, testKey, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"exec","arguments":{"sandbox":"`+sb+`","command":["sleep","1618"]}}}`)
	ps := func() string {
		res := toolCall(t, url, testKey, "exec", map[string]any{"sandbox": sb, "command": []string{"ps"}})
		return res["structuredContent"].(map[string]any)["stdout"].(string)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(ps(), "sleep 1618") {
		if time.Now().After(deadline) {
			t.Fatal("the exec never ran")
		}
		time.Sleep(50 * time.Millisecond)
	}
	start := time.Now()
	if resp, body := mcpDo(t, "DELETE", url, testKey, sid, ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, body)
	}
	t.Logf("DELETE took %s", time.Since(start))
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("DELETE took %s", took)
	}
	for strings.Contains(ps(), "sleep 1618") {
		if time.Now().After(deadline) {
			t.Fatal("the session's command outlived its DELETE")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
