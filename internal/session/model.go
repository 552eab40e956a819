package session

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/amber-run/amber/internal/egress/gateway"
	"net/url"
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

// NewModel is the default ModelFactory. It reads nothing from the daemon's
// environment: the endpoint and key are the ones the harness resolved into
// cfg (resolveModel); a cfg it did not resolve goes to the definition's URL
// without a key, through the egress deny list.
func NewModel(cfg ModelConfig) (Model, error) {
	switch cfg.Adapter {
	case "scripted":
		return NewScripted(cfg.Script), nil
	case "anthropic", "openai":
		ep := cfg.ep
		if ep.url == "" {
			ep = endpoint{url: cfg.BaseURL}
			if ep.url == "" {
				ep.url = defaultEndpoint[cfg.Adapter]
			}
		}
		if cfg.Adapter == "anthropic" {
			return NewAnthropic(ep.url, ep.key, 0, ep.client()), nil
		}
		return NewOpenAI(ep.url, ep.key, 0, ep.client()), nil
	}
	return nil, errdefs.InvalidArgumentf("unknown model adapter %q", cfg.Adapter)
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

// defaultEndpoint is where an adapter sends requests without a provider or
// a base URL.
var defaultEndpoint = map[string]string{"anthropic": "https://api.anthropic.com", "openai": "https://api.openai.com/v1"}

// modelEndpoint resolves where tenant's calls with mc go, without the key
// of a secret (Manager.Create checks this much; the harness adds the
// secret when it opens the model). A provider must be one the operator
// configured and allows tenant to use; anything else is the tenant's URL,
// dialled through the deny list and never sent an operator's key.
func modelEndpoint(providers map[string]Provider, tenant string, mc ModelConfig) (endpoint, error) {
	if err := mc.check(); err != nil {
		return endpoint{}, err
	}
	if mc.Provider == "" {
		ep := endpoint{url: mc.BaseURL}
		if ep.url == "" {
			ep.url = defaultEndpoint[mc.Adapter]
		}
		return ep, nil
	}
	p, err := providerFor(providers, tenant, mc.Provider)
	if err != nil {
		return endpoint{}, err
	}
	if p.Adapter != "" && p.Adapter != mc.Adapter {
		return endpoint{}, errdefs.InvalidArgumentf("session: model provider %q speaks %s, not model.adapter %q", p.Name, p.Adapter, mc.Adapter)
	}
	return endpoint{url: p.URL, key: p.Key, trusted: true}, nil
}

// providerFor returns the provider name if tenant may use it. The answer
// is the same for one that exists and one that does not: a tenant does not
// learn the operator's other providers.
func providerFor(providers map[string]Provider, tenant, name string) (Provider, error) {
	p, ok := providers[name]
	if !ok || !p.Allows(tenant) {
		return Provider{}, errdefs.InvalidArgumentf("session: model.provider %q is not a model provider this daemon offers to tenant %s", name, tenant)
	}
	return p, nil
}

// resolveModel resolves mc of tenant into a factory-ready config: the
// endpoint (modelEndpoint) and, when mc names a secret, its value, checked
// to be bound to the endpoint's host:port and passed to the adapter in
// memory only (never in the log: the definition names the secret, not its
// value). It is the one path for new sessions and for sessions woken from
// an older log alike.
func resolveModel(ctx context.Context, providers map[string]Provider, src SecretSource, tenant string, mc ModelConfig) (ModelConfig, error) {
	if mc.Adapter == "scripted" {
		return mc, mc.check()
	}
	ep, err := modelEndpoint(providers, tenant, mc)
	if err != nil {
		return mc, err
	}
	if mc.APIKeySecret != "" {
		if ep.key, err = secretKey(ctx, src, tenant, mc.APIKeySecret, ep.url); err != nil {
			return mc, err
		}
	}
	mc.ep = ep
	return mc, nil
}

// secretKey returns the value of tenant's secret name if it is bound to
// base's host:port.
func secretKey(ctx context.Context, src SecretSource, tenant, name, base string) (string, error) {
	if src == nil {
		return "", errdefs.FailedPreconditionf("model API key secret %q: this daemon has no secret store", name)
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		return "", errdefs.InvalidArgumentf("model base URL %q does not parse", base)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "http": "80"}[u.Scheme]
	}
	sec, err := src.Secret(ctx, tenant, name)
	if err != nil {
		return "", fmt.Errorf("model API key secret %q: %w", name, err)
	}
	p, _ := strconv.ParseUint(port, 10, 16)
	if !gateway.SecretBound(sec, u.Hostname(), uint16(p)) {
		return "", errdefs.PermissionDeniedf("secret %q is not bound to %s:%s, the model endpoint", name, u.Hostname(), port)
	}
	return string(sec.Value), nil
}
