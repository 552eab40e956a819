package session

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/amber-run/amber/core/eventlog"
)

// FuzzSessionDefinition: any bytes as the payload of a session.created
// event (a body of POST /v1/sessions, or a definition an older binary put
// in the log) decode without a panic; a definition Normalize accepts never
// names the daemon's environment, normalizes to itself, and survives the
// log (encoded, then folded back by State.Apply) unchanged; the model
// settings the harness resolves from it never carry a key or a trusted
// (deny-list-free) endpoint without an operator's provider.
func FuzzSessionDefinition(f *testing.F) {
	for _, s := range []string{
		`{"model":{"adapter":"scripted","script":[{"text":"hi"}]},"template":"minimal"}`,
		`{"model":{"adapter":"anthropic","name":"m","base_url":"http://127.0.0.1:1/","api_key_env":"PGPASSWORD"},"tools":["bash"],"template":"python","policy":"strict","context_budget":200000,"fast_every":5}`,
		`{"model":{"adapter":"openai","base_url":"https://api.example.com/v1","api_key_secret":"k"},"limits":{"max_turns":3,"max_wall_ns":1000}}`,
		`{"model":{"provider":"corp","name":"m"},"policy":"fast","fast_every":2,"custom_tools":[{"name":"t","description":"d","input_schema":{}}],"confirm":["bash"]}`,
		`{"model":{"adapter":"anthropic","provider":"corp","base_url":"http://x"}}`,
		`{"model":{"adapter":"openai","base_url":"http://u:p@[::1%25x]:80"}}`,
		`{"model":null,"tools":[""],"limits":{"max_turns":-1}}`,
		`[]`, `null`, `{"model":{"adapter":"anthropic","base_url":"\u0000"}}`,
	} {
		f.Add([]byte(s))
	}
	providers := map[string]Provider{"corp": {Name: "corp", URL: "http://127.0.0.1:9", Adapter: "anthropic", Key: "operator-key", Tenants: []string{"acme"}}}
	f.Fuzz(func(t *testing.T, b []byte) {
		st := NewState("ses-fuzz")
		ev := eventlog.Event{Tenant: "acme", Seq: 1, ID: "ses-fuzz.created", Type: EventCreated, Version: 1, Payload: b}
		_ = st.Apply(ev) // an error, never a panic

		var def Definition
		if json.Unmarshal(b, &def) != nil {
			return
		}
		for _, tenant := range []string{"acme", "globex"} {
			mc, err := resolveModel(context.Background(), providers, nil, tenant, def.Model)
			if err != nil {
				continue
			}
			if def.Model.APIKeyEnv != "" {
				t.Fatalf("api_key_env %q resolved", def.Model.APIKeyEnv)
			}
			if (mc.ep.trusted || mc.ep.key != "") && (def.Model.Provider != "corp" || tenant != "acme") {
				t.Fatalf("tenant %s got an operator's endpoint %+v for %+v", tenant, mc.ep, def.Model)
			}
		}
		n, err := def.Normalize()
		if err != nil {
			return
		}
		if n.Model.APIKeyEnv != "" {
			t.Fatalf("Normalize accepted api_key_env %q", n.Model.APIKeyEnv)
		}
		again, err := n.Normalize()
		if err != nil || !reflect.DeepEqual(again, n) {
			t.Fatalf("Normalize is not idempotent: %+v → %+v, %v", n, again, err)
		}
		p, err := json.Marshal(n)
		if err != nil {
			t.Fatalf("a normalized definition does not encode: %v", err)
		}
		st = NewState("ses-fuzz")
		if err := st.Apply(eventlog.Event{Tenant: "acme", Seq: 1, ID: "ses-fuzz.created", Type: EventCreated, Version: 1, Payload: p}); err != nil {
			t.Fatalf("the log's copy does not fold back: %v", err)
		}
		back, _ := json.Marshal(st.Def)
		if !bytes.Equal(back, p) {
			t.Fatalf("the definition changed through the log:\n%s\n%s", p, back)
		}
	})
}

// bodyTransport answers every request with body as an event stream (one
// adapter for the whole fuzz run; its calls take turns).
type bodyTransport struct {
	mu   sync.Mutex
	body []byte
}

func (b *bodyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return &http.Response{StatusCode: 200, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: io.NopCloser(bytes.NewReader(b.body)), Request: r}, nil
}

// checkStreamAnswer holds what the harness relies on in an adapter's
// answer: every tool call's input is JSON (it goes into the log as a raw
// message; invalid JSON would make the append panic in mustJSON).
func checkStreamAnswer(t *testing.T, r Response, err error) {
	if err != nil {
		return
	}
	for _, c := range r.ToolCalls {
		if !json.Valid(c.Input) {
			t.Fatalf("tool call %q: input is not JSON: %q", c.ID, c.Input)
		}
	}
	if _, err := json.Marshal(AssistantMessage{Text: r.Text, ToolCalls: r.ToolCalls}); err != nil {
		t.Fatalf("the answer does not encode for the log: %v", err)
	}
}

var fuzzReq = Request{Model: "m", System: "s", Messages: []Message{{Role: "user", Text: "hi"}}, MaxTokens: 16,
	Tools: []ToolSpec{{Name: "bash", Description: "d", InputSchema: json.RawMessage(`{"type":"object"}`)}}}

// FuzzAnthropicSSE: any bytes as the Messages API's event stream go
// through the SDK's SSE decoder and the adapter without a panic, and an
// answer the adapter accepts is one the log can hold.
func FuzzAnthropicSSE(f *testing.F) {
	ev := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	full := ev("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"usage":{"input_tokens":3,"output_tokens":1}}}`) +
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`) +
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}`) +
		ev("content_block_stop", `{"type":"content_block_stop","index":0}`) +
		ev("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"bash","input":{}}}`) +
		ev("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"command\": \"ls\"}"}}`) +
		ev("content_block_stop", `{"type":"content_block_stop","index":1}`) +
		ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":5}}`) +
		ev("message_stop", `{"type":"message_stop"}`)
	f.Add([]byte(full))
	f.Add([]byte(strings.Replace(full, `{\"command\": \"ls\"}`, `{\"comm`, 1))) // a cut tool input
	f.Add([]byte(ev("error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)))
	f.Add([]byte(ev("content_block_delta", `{"type":"content_block_delta","index":7,"delta":{"type":"text_delta","text":"x"}}`) + ev("message_stop", `{}`)))
	f.Add([]byte("data: [DONE]\n\n"))
	tr := &bodyTransport{}
	a := NewAnthropic("http://model.invalid", "k", 1, &http.Client{Transport: tr})
	params := a.params(fuzzReq)
	f.Fuzz(func(t *testing.T, b []byte) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		tr.body = b
		r, err := a.once(context.Background(), params, func(string) {})
		checkStreamAnswer(t, r, err)
	})
}

// FuzzOpenAISSE: the same for the Chat Completions stream.
func FuzzOpenAISSE(f *testing.F) {
	chunk := func(delta, finish string) string {
		return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}` + "\n\n"
	}
	full := chunk(`{"role":"assistant","content":"hi"}`, "null") +
		chunk(`{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"comm"}}]}`, "null") +
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"and\": \"ls\"}"}}]}`, "null") +
		chunk(`{}`, `"tool_calls"`) +
		`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}` + "\n\n" +
		"data: [DONE]\n\n"
	f.Add([]byte(full))
	f.Add([]byte(chunk(`{"tool_calls":[{"index":3,"function":{"arguments":"{"}}]}`, `"stop"`)))
	f.Add([]byte(`data: {"error":{"message":"server overloaded","type":"server_error"}}` + "\n\n"))
	f.Add([]byte("data: [DONE]\n\n"))
	tr := &bodyTransport{}
	o := NewOpenAI("http://model.invalid/v1", "k", 1, &http.Client{Transport: tr})
	params := o.params(fuzzReq)
	f.Fuzz(func(t *testing.T, b []byte) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		tr.body = b
		r, err := o.once(context.Background(), params, func(string) {})
		checkStreamAnswer(t, r, err)
	})
}
