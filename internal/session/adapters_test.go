package session

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// wireServer is a local model API speaking a real wire format. Its first
// answers are the failures in fail (status codes, with a short retry-after);
// then it plays turns: the answer to a request is turn number (assistant
// messages in the request). It keeps every request body.
type wireServer struct {
	mu       sync.Mutex
	fail     []int
	midError int // requests to cut with an error event mid-stream
	bodies   []map[string]any
	statuses []int
}

func (w *wireServer) take(r *http.Request) (map[string]any, int, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var body map[string]any
	json.NewDecoder(r.Body).Decode(&body)
	w.bodies = append(w.bodies, body)
	if len(w.fail) > 0 {
		st := w.fail[0]
		w.fail = w.fail[1:]
		w.statuses = append(w.statuses, st)
		return body, st, false
	}
	w.statuses = append(w.statuses, 200)
	mid := w.midError > 0
	if mid {
		w.midError--
	}
	return body, 200, mid
}

func assistantTurns(body map[string]any) int {
	n := 0
	msgs, _ := body["messages"].([]any)
	for _, m := range msgs {
		if mm, _ := m.(map[string]any); mm["role"] == "assistant" {
			n++
		}
	}
	return n
}

func sse(w http.ResponseWriter, event string, data any) {
	b, _ := json.Marshal(data)
	if event != "" {
		fmt.Fprintf(w, "event: %s\n", event)
	}
	fmt.Fprintf(w, "data: %s\n\n", b)
	w.(http.Flusher).Flush()
}

// anthropicHandler speaks the Messages API: SSE events message_start,
// content_block_start/delta/stop (text_delta, input_json_delta),
// message_delta with usage, message_stop; errors as the API sends them.
func (ws *wireServer) anthropicHandler(w http.ResponseWriter, r *http.Request) {
	// The SDK sends the key as a Bearer token (X-Api-Key is accepted too).
	if r.URL.Path != "/v1/messages" || (r.Header.Get("X-Api-Key") != "test-key" && r.Header.Get("Authorization") != "Bearer test-key") || r.Header.Get("Anthropic-Version") == "" {
		http.Error(w, `{"type":"error","error":{"type":"authentication_error","message":"bad path or key"}}`, 401)
		return
	}
	body, st, mid := ws.take(r)
	if st != 200 {
		kind := map[int]string{429: "rate_limit_error", 529: "overloaded_error"}[st]
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After-Ms", "10")
		w.WriteHeader(st)
		fmt.Fprintf(w, `{"type":"error","error":{"type":%q,"message":"try again"}}`, kind)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	turn := assistantTurns(body)
	sse(w, "message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"], "content": []any{}, "stop_reason": nil, "usage": map[string]any{"input_tokens": 30 + turn, "output_tokens": 1}}})
	sse(w, "ping", map[string]any{"type": "ping"})
	sse(w, "content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
	if mid {
		sse(w, "error", map[string]any{"type": "error", "error": map[string]any{"type": "overloaded_error", "message": "Overloaded"}})
		return
	}
	text := []string{"Let me ", "look."}
	if turn > 0 {
		text = []string{"All ", "done."}
	}
	for _, t := range text {
		sse(w, "content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": t}})
	}
	sse(w, "content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	stop := "end_turn"
	if turn == 0 {
		stop = "tool_use"
		sse(w, "content_block_start", map[string]any{"type": "content_block_start", "index": 1, "content_block": map[string]any{"type": "tool_use", "id": "toolu_01", "name": "bash", "input": map[string]any{}}})
		for _, p := range []string{`{"comm`, `and": "echo `, `hi"}`} {
			sse(w, "content_block_delta", map[string]any{"type": "content_block_delta", "index": 1, "delta": map[string]any{"type": "input_json_delta", "partial_json": p}})
		}
		sse(w, "content_block_stop", map[string]any{"type": "content_block_stop", "index": 1})
	}
	sse(w, "message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": 12}})
	sse(w, "message_stop", map[string]any{"type": "message_stop"})
}

// openaiHandler speaks Chat Completions streaming: chunks with content and
// tool_calls deltas, a finish_reason, a usage chunk, [DONE].
func (ws *wireServer) openaiHandler(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" || r.Header.Get("Authorization") != "Bearer test-key" {
		http.Error(w, `{"error":{"message":"bad path or key","type":"invalid_request_error"}}`, 401)
		return
	}
	body, st, mid := ws.take(r)
	if st != 200 {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After-Ms", "10")
		w.WriteHeader(st)
		fmt.Fprint(w, `{"error":{"message":"slow down","type":"rate_limit_exceeded"}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	turn := assistantTurns(body)
	chunk := func(delta map[string]any, finish any) map[string]any {
		return map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": body["model"],
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
	}
	sse(w, "", chunk(map[string]any{"role": "assistant", "content": ""}, nil))
	if mid {
		fmt.Fprint(w, "data: {\"error\":{\"message\":\"server overloaded\",\"type\":\"server_error\"}}\n\n")
		return
	}
	text := []string{"Let me ", "look."}
	if turn > 0 {
		text = []string{"All ", "done."}
	}
	for _, t := range text {
		sse(w, "", chunk(map[string]any{"content": t}, nil))
	}
	finish := "stop"
	if turn == 0 {
		finish = "tool_calls"
		sse(w, "", chunk(map[string]any{"tool_calls": []any{map[string]any{"index": 0, "id": "call_abc", "type": "function", "function": map[string]any{"name": "bash", "arguments": ""}}}}, nil))
		for _, p := range []string{`{"comm`, `and": "echo `, `hi"}`} {
			sse(w, "", chunk(map[string]any{"tool_calls": []any{map[string]any{"index": 0, "function": map[string]any{"arguments": p}}}}, nil))
		}
	}
	sse(w, "", chunk(map[string]any{}, finish))
	sse(w, "", map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": body["model"], "choices": []any{},
		"usage": map[string]any{"prompt_tokens": 40 + turn, "completion_tokens": 9, "total_tokens": 49 + turn}})
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// TestAdaptersOverTheWire runs a session with each real adapter against a
// local server speaking its wire format: the first answers are 429 and
// 529/503 (retried), one stream is cut by an error event (re-issued), then
// a tool call streamed in pieces, its result sent back in the provider's
// shape, and a final answer.
func TestAdaptersOverTheWire(t *testing.T) {
	for _, c := range []struct {
		adapter string
		fail    []int
		handler func(*wireServer) http.HandlerFunc
		callID  string
	}{
		{"anthropic", []int{429, 529}, func(w *wireServer) http.HandlerFunc { return w.anthropicHandler }, "toolu_01"},
		{"openai", []int{429, 503}, func(w *wireServer) http.HandlerFunc { return w.openaiHandler }, "call_abc"},
	} {
		t.Run(c.adapter, func(t *testing.T) {
			ws := &wireServer{fail: c.fail, midError: 1}
			srv := httptest.NewServer(c.handler(ws))
			defer srv.Close()
			// The local server is an operator's provider (a tenant's
			// base_url on 127.0.0.1 is refused at dial time).
			url := srv.URL // the API root: the Anthropic SDK adds v1/messages
			if c.adapter == "openai" {
				url += "/v1/"
			}
			e := newTestEnv(t, nil)
			e.providers = map[string]Provider{"local": {Name: "local", URL: url, Adapter: c.adapter, Key: "test-key", Tenants: []string{"acme"}}}
			id := e.create(Definition{Model: ModelConfig{Provider: "local", Name: "test-model"},
				System: "You are careful.", Tools: []string{"bash"}})
			e.post(id, EventUserMessage, UserMessage{Text: "say hi"})
			h := e.harness(nil)
			h.Models = NewModel
			var deltas strings.Builder
			h.OnDelta = func(_, s string) { deltas.WriteString(s) }
			st, err := h.Wake(context.Background(), id)
			if err != nil || st != StatusIdle {
				t.Fatalf("wake: %v %v", st, err)
			}
			s := e.state(id)
			if len(s.Messages) != 4 || s.Messages[1].Text != "Let me look." || len(s.Messages[1].ToolCalls) != 1 ||
				s.Messages[1].ToolCalls[0].ID != c.callID || string(s.Messages[1].ToolCalls[0].Input) != `{"command":"echo hi"}` ||
				s.Messages[2].Role != "tool" || s.Messages[2].Text != "exit 0\ncounter=1\n" || s.Messages[3].Text != "All done." {
				t.Fatalf("conversation: %s", conversation(t, s))
			}
			if s.Usage.OutputTokens == 0 || s.Usage.InputTokens == 0 {
				t.Fatalf("usage not recorded: %+v", s.Usage)
			}
			// 429, 529/503, the cut stream, the first answer, the second.
			want := append(append([]int{}, c.fail...), 200, 200, 200)
			if fmt.Sprint(ws.statuses) != fmt.Sprint(want) {
				t.Fatalf("server answered %v, want %v", ws.statuses, want)
			}
			if !strings.Contains(deltas.String(), "Let me look.") || !strings.Contains(deltas.String(), "All done.") {
				t.Fatalf("live deltas: %q", deltas.String())
			}
			// The second call carried the tool result in the provider's shape.
			last, _ := json.Marshal(ws.bodies[len(ws.bodies)-1])
			for _, want := range map[string][]string{
				"anthropic": {`"tool_result"`, `"tool_use_id":"toolu_01"`, `"system":[{"text":"You are careful."`, `"stream":true`, `"name":"bash"`},
				"openai":    {`"role":"tool"`, `"tool_call_id":"call_abc"`, `"role":"system"`, `"stream":true`, `"include_usage":true`},
			}[c.adapter] {
				if !strings.Contains(string(last), want) {
					t.Errorf("second request lacks %s: %s", want, last)
				}
			}
			if n := len(e.events(id, EventModelRequestStarted)); n != 2 {
				t.Fatalf("%d model calls recorded, want 2 (retries are inside a call)", n)
			}
		})
	}
}

// TestAdapterGivesUpOnClientError: a 400 is not retried and the error is
// recorded in the session's log.
func TestAdapterGivesUpOnClientError(t *testing.T) {
	var n int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(400)
		fmt.Fprint(w, `{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens too large"}}`)
	}))
	defer srv.Close()
	e := newTestEnv(t, nil)
	e.providers = map[string]Provider{"local": {Name: "local", URL: srv.URL, Tenants: []string{"*"}}}
	id := e.create(Definition{Model: ModelConfig{Adapter: "anthropic", Name: "m", Provider: "local"}})
	e.post(id, EventUserMessage, UserMessage{Text: "hi"})
	h := e.harness(nil)
	h.Models = NewModel
	if _, err := h.Wake(context.Background(), id); err == nil || !strings.Contains(err.Error(), "max_tokens too large") {
		t.Fatalf("wake: %v", err)
	}
	if n != 1 {
		t.Fatalf("a 400 was sent %d times", n)
	}
	errs := e.events(id, EventError)
	if len(errs) != 1 || !strings.Contains(string(errs[0].Payload), "max_tokens too large") {
		t.Fatalf("error events: %v", errs)
	}
}
