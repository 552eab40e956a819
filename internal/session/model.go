package session

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/amber-run/amber/internal/gateway"
	"net/url"
	"os"
	"strconv"
	"sync/atomic"

	"github.com/amber-run/amber/core/errdefs"
)

// Model is a model adapter: one call of a chat model with tools. Adapters:
// scripted (deterministic, for tests and the demo), anthropic (Messages
// API) and openai (Chat Completions API and compatible servers).
//
// Complete streams the answer's text through onDelta as it arrives (live
// only: deltas are not durable) and returns the complete answer. It retries
// what the provider says is retryable (429, 529, 5xx) itself; an error it
// returns ends the call. It must not keep state between calls: everything a
// call needs is in the Request, built from the log.
type Model interface {
	Complete(ctx context.Context, req Request, onDelta func(text string)) (Response, error)
}

// Request is one model call.
type Request struct {
	Model     string
	System    string
	Messages  []Message
	Tools     []ToolSpec
	MaxTokens int
	// Turn is the number of completed model calls before this one (the
	// scripted model plays its script by it).
	Turn int
}

// Response is a model's complete answer.
type Response struct {
	Text       string
	ToolCalls  []ToolCall
	Usage      Usage
	StopReason string
}

// ModelFactory makes the adapter a session's definition names.
type ModelFactory func(cfg ModelConfig) (Model, error)

// NewModel is the default ModelFactory.
func NewModel(cfg ModelConfig) (Model, error) {
	switch cfg.Adapter {
	case "scripted":
		return NewScripted(cfg.Script), nil
	case "anthropic":
		return NewAnthropic(cfg.BaseURL, apiKey(cfg, "ANTHROPIC_API_KEY"), 0), nil
	case "openai":
		return NewOpenAI(cfg.BaseURL, apiKey(cfg, "OPENAI_API_KEY"), 0), nil
	}
	return nil, errdefs.InvalidArgumentf("unknown model adapter %q", cfg.Adapter)
}

func apiKey(cfg ModelConfig, def string) string {
	if cfg.resolvedKey != "" {
		return cfg.resolvedKey
	}
	if cfg.APIKeyEnv != "" {
		def = cfg.APIKeyEnv
	}
	return os.Getenv(def)
}

// ScriptTurn is one assistant turn of a scripted model.
type ScriptTurn struct {
	Text      string           `json:"text,omitempty"`
	ToolCalls []ScriptToolCall `json:"tool_calls,omitempty"`
}

// ScriptToolCall is a tool call in a script.
type ScriptToolCall struct {
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

// Scripted plays a script: the answer to a request is the script's turn
// number req.Turn (past the end: a final text turn). The same request gets
// the same answer, so a re-issued call is answered as the first attempt was.
// Calls counts the calls it answered.
type Scripted struct {
	turns []ScriptTurn
	calls atomic.Int64
}

// NewScripted returns a scripted model playing turns.
func NewScripted(turns []ScriptTurn) *Scripted { return &Scripted{turns: turns} }

// Calls is the number of Complete calls answered.
func (m *Scripted) Calls() int { return int(m.calls.Load()) }

// Complete implements Model.
func (m *Scripted) Complete(ctx context.Context, req Request, onDelta func(string)) (Response, error) {
	if err := ctx.Err(); err != nil {
		return Response{}, err
	}
	m.calls.Add(1)
	t := ScriptTurn{Text: "(end of script)"}
	if req.Turn < len(m.turns) {
		t = m.turns[req.Turn]
	}
	r := Response{Text: t.Text, StopReason: "end_turn"}
	for i, c := range t.ToolCalls {
		in := c.Input
		if len(in) == 0 {
			in = json.RawMessage(`{}`)
		}
		r.ToolCalls = append(r.ToolCalls, ToolCall{ID: fmt.Sprintf("call_%d_%d", req.Turn+1, i+1), Name: c.Name, Input: in})
	}
	if len(r.ToolCalls) > 0 {
		r.StopReason = "tool_use"
	}
	if onDelta != nil && r.Text != "" {
		onDelta(r.Text)
	}
	// Usage: a deterministic count (characters / 4) so budgets can be tested.
	in := len(req.System)
	for _, msg := range req.Messages {
		in += len(msg.Text)
		for _, c := range msg.ToolCalls {
			in += len(c.Input)
		}
	}
	out := len(r.Text)
	for _, c := range r.ToolCalls {
		out += len(c.Input)
	}
	r.Usage = Usage{InputTokens: in/4 + 1, OutputTokens: out/4 + 1}
	return r, nil
}

// retryable says whether a provider's answer with this status is worth
// another attempt: a stream cut by an error event (it began with 200), a
// timeout, a conflict, a rate limit, an overload (529) or a server error.
// Other 4xx answers will not change.
func retryable(status int) bool {
	return status < 400 || status == 408 || status == 409 || status == 429 || status >= 500
}

// SecretSource gives the harness a tenant's secrets (secretstore.Store).
type SecretSource interface {
	Secret(ctx context.Context, tenant, name string) (gateway.Secret, error)
}

// defaultEndpoint is where an adapter sends requests without a base URL.
var defaultEndpoint = map[string]string{"anthropic": "https://api.anthropic.com", "openai": "https://api.openai.com"}

// withSecretKey resolves cfg.APIKeySecret of tenant into a factory-ready
// config: the key is checked to be bound to the endpoint's host:port and
// passed to the adapter in memory only (never in the log: the definition
// names the secret, not its value).
func withSecretKey(ctx context.Context, src SecretSource, tenant string, cfg ModelConfig) (ModelConfig, string, error) {
	if cfg.APIKeySecret == "" {
		return cfg, "", nil
	}
	if src == nil {
		return cfg, "", errdefs.FailedPreconditionf("model API key secret %q: this daemon has no secret store", cfg.APIKeySecret)
	}
	base := cfg.BaseURL
	if base == "" {
		base = defaultEndpoint[cfg.Adapter]
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		return cfg, "", errdefs.InvalidArgumentf("model base URL %q does not parse", base)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "http": "80"}[u.Scheme]
	}
	sec, err := src.Secret(ctx, tenant, cfg.APIKeySecret)
	if err != nil {
		return cfg, "", fmt.Errorf("model API key secret %q: %w", cfg.APIKeySecret, err)
	}
	p, _ := strconv.ParseUint(port, 10, 16)
	if !gateway.SecretBound(sec, u.Hostname(), uint16(p)) {
		return cfg, "", errdefs.PermissionDeniedf("secret %q is not bound to %s:%s, the model endpoint", cfg.APIKeySecret, u.Hostname(), port)
	}
	return cfg, string(sec.Value), nil
}
