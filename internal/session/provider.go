package session

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/egress/gateway"
)

// Provider is a model endpoint the operator configures (amber up
// --model-provider): a name tenants pick it by (model.provider), its URL,
// the wire format it speaks, the operator's API key for it, and the
// tenants allowed to use it. A tenant never names the daemon's
// environment: the operator's key is read from the variable the operator
// named, at start, and is sent only to this URL and only for these
// tenants. The URL is the operator's choice, so it is dialled without the
// egress deny list (a provider on 127.0.0.1 works); a URL a tenant
// chooses (model.base_url) is not (see endpoint).
type Provider struct {
	Name string
	URL  string
	// Adapter is the wire format ("anthropic" or "openai"); "" lets the
	// definition choose.
	Adapter string
	// KeyEnv names the operator's environment variable holding the key
	// ("" for none: tenants bring theirs as a secret); Key is its value.
	KeyEnv string
	Key    string
	// Tenants may use the provider; "*" is every tenant. Empty: the
	// operator's tenant (default) only.
	Tenants []string
}

// Allows reports whether tenant may use p.
func (p Provider) Allows(tenant string) bool {
	if len(p.Tenants) == 0 {
		return tenant == "default"
	}
	return slices.Contains(p.Tenants, "*") || slices.Contains(p.Tenants, tenant)
}

// ProviderSyntax is the form of one --model-provider value.
const ProviderSyntax = "NAME=URL[,key-env=VAR][,adapter=anthropic|openai][,tenants=T1|T2|*]"

// ParseProvider parses one --model-provider value (ProviderSyntax), e.g.
// "corp=https://llm.corp.example/anthropic,key-env=CORP_KEY,adapter=anthropic,tenants=acme|globex".
// getenv reads the operator's environment (os.Getenv); a key-env naming an
// unset or empty variable is an error, as is anything malformed.
func ParseProvider(spec string, getenv func(string) string) (Provider, error) {
	bad := func(format string, a ...any) (Provider, error) {
		return Provider{}, errdefs.InvalidArgumentf("--model-provider %q: "+format+" (want "+ProviderSyntax+")", append([]any{spec}, a...)...)
	}
	parts := strings.Split(spec, ",")
	name, raw, ok := strings.Cut(parts[0], "=")
	if !ok || !validProviderName(name) {
		return bad("the name must be 1-64 letters, digits, '-', '_' or '.'")
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return bad("the URL must be http(s)://host[:port][/path], without credentials")
	}
	p := Provider{Name: name, URL: raw}
	seen := map[string]bool{}
	for _, kv := range parts[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" || seen[k] {
			return bad("%q is not key=value, or is given twice", kv)
		}
		seen[k] = true
		switch k {
		case "key-env":
			p.KeyEnv = v
			if p.Key = getenv(v); p.Key == "" {
				return bad("the environment variable %s is not set", v)
			}
		case "adapter":
			if v != "anthropic" && v != "openai" {
				return bad("adapter %q: anthropic or openai", v)
			}
			p.Adapter = v
		case "tenants":
			p.Tenants = strings.Split(v, "|")
			for _, t := range p.Tenants {
				if t == "" {
					return bad("an empty tenant in %q", v)
				}
			}
		default:
			return bad("unknown option %q", k)
		}
	}
	return p, nil
}

func validProviderName(s string) bool {
	return s != "" && len(s) <= 64 && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == ""
}

// endpoint is where a model call goes and with which key, resolved by the
// harness (in memory only, never in the log). trusted marks an operator's
// provider; every other URL is dialled through the egress deny list.
type endpoint struct {
	url     string
	key     string
	trusted bool
}

// dialTimeout bounds a model connection's dial.
const dialTimeout = 30 * time.Second

// client returns the HTTP client for e: an operator's provider is dialled
// as the operator configured the host (proxy settings included); a URL a
// tenant chose is dialled through gateway.GuardedDialer, whose check runs
// on the address actually connected to (a name re-resolving to 127.0.0.1,
// the metadata address or the host's own addresses is refused), never
// through a proxy (the guard would see the proxy, not the destination).
// Redirects are not followed.
func (e endpoint) client() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if !e.trusted {
		t.Proxy = nil
		t.DialContext = gateway.GuardedDialer(nil, dialTimeout).DialContext
	}
	return &http.Client{Transport: refusalStops{t}, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// guardedClient is the client of an unresolved URL (a tenant's).
func guardedClient() *http.Client { return endpoint{}.client() }

// refusalStops ends a model call whose connection the egress guard
// refused: the SDKs retry a connection error as if the network were down,
// and a refusal will not change. The adapter's call context carries a
// cancel function (withStop); the refusal is its cause.
type refusalStops struct{ http.RoundTripper }

type stopKey struct{}

func (t refusalStops) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.RoundTripper.RoundTrip(req)
	var op *net.OpError
	if err != nil && errors.As(err, &op) && op.Op == "dial" && errors.Is(err, errdefs.ErrPermissionDenied) {
		if stop, ok := req.Context().Value(stopKey{}).(context.CancelCauseFunc); ok {
			stop(err)
		}
	}
	return resp, err
}

// withStop returns a context for one adapter call that refusalStops can
// end, and a function returning the refusal (nil if none) to call when the
// call returned.
func withStop(ctx context.Context) (context.Context, func() error, context.CancelFunc) {
	ctx, stop := context.WithCancelCause(ctx)
	refusal := func() error {
		if c := context.Cause(ctx); c != nil && errors.Is(c, errdefs.ErrPermissionDenied) {
			return c
		}
		return nil
	}
	return context.WithValue(ctx, stopKey{}, stop), refusal, func() { stop(nil) }
}
