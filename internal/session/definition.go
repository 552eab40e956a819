package session

import (
	"encoding/json"
	"net/url"
	"slices"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// Definition is what a session is: the agent (model, system prompt, tools,
// limits), the sandbox it works in and the recovery policy. It is the
// payload of the session's first event, so a harness rebuilds it from the
// log alone.
type Definition struct {
	Model  ModelConfig `json:"model"`
	System string      `json:"system,omitempty"`
	// Tools are the built-in tools the agent may use (BuiltinTools when
	// empty); CustomTools are answered by the client.
	Tools       []string   `json:"tools,omitempty"`
	CustomTools []ToolSpec `json:"custom_tools,omitempty"`
	// Confirm names tools whose calls wait for a tool confirmation event.
	Confirm []string `json:"confirm,omitempty"`
	Limits  Limits   `json:"limits,omitempty"`
	// ContextBudget is the size (characters of message text) past which
	// the oldest turns are compacted out of the context sent to the model
	// (default 200000). The log keeps everything.
	ContextBudget int `json:"context_budget,omitempty"`
	// Template is the sandbox template (default "python"); the sandbox is
	// created at the first tool call that needs one.
	Template string `json:"template,omitempty"`
	// Policy is the recovery policy: "strict" (default) or "fast"
	// (BRIEF.md, "The recovery contract").
	Policy string `json:"policy,omitempty"`
	// FastEvery is the fast policy's checkpoint interval in sandbox-changing
	// tool calls (default 5).
	FastEvery int `json:"fast_every,omitempty"`
}

// ModelConfig chooses a model adapter and configures it. It never names
// the daemon's environment: a key comes from an operator's provider
// (Provider, which the operator grants to tenants) or from the tenant's
// own secret.
type ModelConfig struct {
	// Adapter: "scripted", "anthropic" or "openai" (with a provider that
	// names its adapter, "" takes that one).
	Adapter string `json:"adapter"`
	// Name is the model's name at the provider.
	Name string `json:"name,omitempty"`
	// Provider names a model provider the operator configured (amber up
	// --model-provider) and allows this tenant to use: its URL, and its
	// key unless APIKeySecret names the tenant's own.
	Provider string `json:"provider,omitempty"`
	// BaseURL is a provider's API the tenant chooses (the adapter's
	// public default when empty; not with Provider). It is dialled through
	// the egress deny list, and no key of the operator's is ever sent to
	// it: only APIKeySecret's.
	BaseURL string `json:"base_url,omitempty"`
	// APIKeyEnv is refused (InvalidArgument, on create and when an older
	// session is woken): it named the daemon's environment variable to send
	// as the key, which let a tenant read any of them. It stays a field so
	// that definitions already in the log decode and are refused by name.
	APIKeyEnv string `json:"api_key_env,omitempty"`
	// APIKeySecret names the tenant's secret (amber secret set) holding
	// the API key; it wins over a provider's key. The secret must be bound
	// to the model endpoint's host:port, as any secret to where it is sent.
	APIKeySecret string `json:"api_key_secret,omitempty"`
	MaxTokens    int    `json:"max_tokens,omitempty"`
	// Script is the scripted model's turns.
	Script []ScriptTurn `json:"script,omitempty"`

	// ep is where calls go, resolved by the harness in memory (never in
	// the log); zero means the tenant's URL, no key, the deny list.
	ep endpoint
}

// check refuses what no definition may say, new or already in the log.
func (mc ModelConfig) check() error {
	if mc.APIKeyEnv != "" {
		return errdefs.InvalidArgumentf("session: model.api_key_env is not accepted: a tenant cannot name the daemon's environment " +
			"(pick an operator's model provider with model.provider, or bring a key as a tenant secret with model.api_key_secret)")
	}
	switch mc.Adapter {
	case "scripted":
		if mc.Provider != "" || mc.BaseURL != "" || mc.APIKeySecret != "" {
			return errdefs.InvalidArgumentf("session: the scripted model takes no provider, base_url or api_key_secret")
		}
	case "anthropic", "openai":
	case "":
		return errdefs.InvalidArgumentf("session: model.adapter is required (scripted, anthropic or openai)")
	default:
		return errdefs.InvalidArgumentf("session: unknown model adapter %q (scripted, anthropic or openai)", mc.Adapter)
	}
	if mc.Provider != "" && mc.BaseURL != "" {
		return errdefs.InvalidArgumentf("session: model.provider and model.base_url exclude each other (the provider has its URL)")
	}
	if mc.BaseURL != "" {
		u, err := url.Parse(mc.BaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return errdefs.InvalidArgumentf("session: model.base_url %.200q: want http(s)://host[:port][/path], without credentials", mc.BaseURL)
		}
	}
	return nil
}

// ToolSpec describes a tool to the model.
type ToolSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// Limits are a session's budgets; reaching one pauses the session
// (StatusPausedBudget). Zero means no limit.
type Limits struct {
	MaxTurns  int           `json:"max_turns,omitempty"`  // model calls
	MaxTokens int           `json:"max_tokens,omitempty"` // input + output tokens
	MaxWall   time.Duration `json:"max_wall_ns,omitempty"`
}

// Policies.
const (
	PolicyStrict = "strict"
	PolicyFast   = "fast"
)

// Normalize fills defaults and checks d.
func (d Definition) Normalize() (Definition, error) {
	if err := d.Model.check(); err != nil {
		return d, err
	}
	if d.Policy == "" {
		d.Policy = PolicyStrict
	}
	if d.Policy != PolicyStrict && d.Policy != PolicyFast {
		return d, errdefs.InvalidArgumentf("session: policy %q: want strict or fast", d.Policy)
	}
	if d.Template == "" {
		d.Template = "python"
	}
	if len(d.Tools) == 0 {
		d.Tools = slices.Clone(BuiltinTools)
	}
	for _, t := range d.Tools {
		if !slices.Contains(BuiltinTools, t) {
			return d, errdefs.InvalidArgumentf("session: unknown built-in tool %q (have %v)", t, BuiltinTools)
		}
	}
	for _, c := range d.CustomTools {
		if c.Name == "" || slices.Contains(BuiltinTools, c.Name) {
			return d, errdefs.InvalidArgumentf("session: custom tool name %q is empty or a built-in's", c.Name)
		}
	}
	if d.Limits.MaxTurns < 0 || d.Limits.MaxTokens < 0 || d.Limits.MaxWall < 0 {
		return d, errdefs.InvalidArgumentf("session: limits must not be negative")
	}
	if d.ContextBudget <= 0 {
		d.ContextBudget = 200_000
	}
	if d.FastEvery <= 0 {
		d.FastEvery = 5
	}
	return d, nil
}

func (d Definition) isCustom(name string) bool {
	return slices.ContainsFunc(d.CustomTools, func(t ToolSpec) bool { return t.Name == name })
}
