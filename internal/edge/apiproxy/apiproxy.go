// Package apiproxy is Amber's API-only server (`amber api`): a stateless
// front for a deployment of many nodes on shared stores. It runs no
// sandboxes and claims no dead nodes; it reads the shared metadata store
// (nodes, sandbox and session rows, API keys) and passes every call on to
// a node agent, which authorizes, audits and answers it:
//
//   - a call for a sandbox (/v1/sandboxes/{id}/…) goes to the node that runs
//     it, and a call for a session (/v1/sessions/{id}/…) to the node of its
//     sandbox; when that node is down (its sandboxes are being restored
//     elsewhere) the answer is 503, retry;
//   - a checkpoint's restore goes to the node of the sandbox it was cut
//     from (which can restore it in place);
//   - a create (POST /v1/sandboxes, POST /v1/sessions) goes to the node
//     Place chooses (a live node that takes new sandboxes, with room);
//   - an exposed port's origin (Host <port>-<id>.<PortDomain>) goes to the
//     node that runs the sandbox (no key: the exposure's token is the
//     credential, checked there), and so does the old path form /p/{id}/…
//     (which that node redirects to the port's origin);
//   - anything else (tenants, keys, templates, usage, nodes, the console)
//     goes to any live node, in turn.
//
// The key is checked here first (401 before any lookup), so an anonymous
// caller learns nothing about which sandboxes exist or where; a sandbox or
// session of another tenant is passed on like an unknown one (its node
// answers 404 after its own check). Calls are marked forwarded
// (X-Amber-Forwarded-By: api/<name>), so a node answers them itself and
// never forwards them again; with a node token (Options.Hop, the nodes'
// --node-token-file) they carry it, and a node refuses a call marked
// forwarded without it.
package apiproxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/lib/httpx"
)

// ForwardedHeader is the header nodes honour (internal/edge/server).
const ForwardedHeader = "X-Amber-Forwarded-By"

// Store is what the proxy reads from the shared metadata store.
type Store interface {
	ListNodes(ctx context.Context) ([]metadata.Node, error)
	GetNode(ctx context.Context, id string) (metadata.Node, error)
	Get(ctx context.Context, id string) (metadata.Sandbox, error)
	GetSession(ctx context.Context, id string) (metadata.Session, error)
	Checkpoint(ctx context.Context, id string) (metadata.Checkpoint, error)
	KeyByHash(ctx context.Context, hash string) (metadata.APIKey, error)
}

// Options configure New.
type Options struct {
	Meta Store
	// Name names this server in the forwarded header (api/<Name>).
	Name string
	// Place chooses the node for a new sandbox or session among nodes
	// (template may be ""); default LeastLoaded.
	Place  func(nodes []metadata.Node, template string, now time.Time) (metadata.Node, error)
	Clock  clock.Clock
	Logger *slog.Logger
	// PortDomain is the nodes' --port-domain: a request whose Host is
	// under it is an exposed port's (internal/edge/server ports.go); empty:
	// ports.localhost.
	PortDomain string
	// Hop is the node token the proxy forwards with (httpx.Hop; the
	// nodes' --node-token-file); nil: none.
	Hop *httpx.Hop
}

// Proxy is the API-only server's handler.
type Proxy struct {
	o    Options
	next atomic.Uint64 // round robin over live nodes
}

// New returns the proxy.
func New(o Options) *Proxy {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Place == nil {
		o.Place = LeastLoaded
	}
	if o.Name == "" {
		o.Name = "api"
	}
	if o.PortDomain = strings.Trim(strings.ToLower(o.PortDomain), "."); o.PortDomain == "" {
		o.PortDomain = "ports.localhost"
	}
	return &Proxy{o: o}
}

// LeastLoaded places as the nodes do (metadata.Place): a live node that is not
// draining and has room; the template cached first, then the fewest
// sandboxes, the most free memory, the smallest id.
func LeastLoaded(nodes []metadata.Node, template string, now time.Time) (metadata.Node, error) {
	return metadata.Place(nodes, "", template, now)
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, ok := p.portHost(r.Host); ok {
		// An exposed port's origin: no key, the node checks the token.
		addr, err := p.owner(r.Context(), id, metadata.APIKey{})
		if err == nil && addr == "" {
			addr, err = p.anyNodeAddr(r.Context()) // unknown: that node answers 404
		}
		if err != nil {
			p.writeError(w, r, errdefs.Unavailablef("the node behind this URL is down; retry"))
			return
		}
		p.forward(w, r, addr)
		return
	}
	switch r.URL.Path {
	case "/healthz":
		w.Write([]byte("ok\n"))
		return
	case "/readyz":
		// Ready or not, nothing of why (a store's error is the operator's:
		// logged).
		if _, err := p.anyNode(r.Context()); err != nil {
			p.o.Logger.Warn("not ready", "err", err)
			p.writeError(w, r, errdefs.Unavailablef("not ready"))
			return
		}
		w.Write([]byte("ok\n"))
		return
	}
	key, err := p.authenticate(r)
	if err != nil {
		p.writeError(w, r, err)
		return
	}
	target, err := p.route(r, key)
	if err != nil {
		p.writeError(w, r, err)
		return
	}
	p.forward(w, r, target)
}

// portHost returns the sandbox id of a Host under the port domain
// (<port>-<id>.<domain>); ok is false for any other host.
func (p *Proxy) portHost(host string) (id string, ok bool) {
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		host = host[:i]
	}
	label, ok := strings.CutSuffix(strings.TrimSuffix(strings.ToLower(host), "."), "."+p.o.PortDomain)
	if !ok {
		return "", false
	}
	_, id, _ = strings.Cut(label, "-")
	return id, true
}

func (p *Proxy) anyNodeAddr(ctx context.Context) (string, error) {
	n, err := p.anyNode(ctx)
	return n.Addr, err
}

// authenticate checks the caller's key (the node checks it again, with
// the route's scope).
func (p *Proxy) authenticate(r *http.Request) (metadata.APIKey, error) {
	if !strings.HasPrefix(r.URL.Path, "/v1/") || r.URL.Path == "/v1/openapi.json" {
		return metadata.APIKey{}, nil // public: the console's assets, the API description
	}
	token, ok := httpx.Bearer(r.Header.Get("Authorization"))
	if !ok {
		return metadata.APIKey{}, fmt.Errorf("missing Authorization: Bearer <api key>: %w", errdefs.ErrUnauthenticated)
	}
	k, err := p.o.Meta.KeyByHash(r.Context(), metadata.HashKey(strings.TrimSpace(token)))
	if errdefs.IsNotFound(err) {
		return metadata.APIKey{}, fmt.Errorf("the API key is not valid: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		return metadata.APIKey{}, err
	}
	return k, k.Usable(p.o.Clock.Now())
}

// route returns the API address the call goes to.
func (p *Proxy) route(r *http.Request, key metadata.APIKey) (string, error) {
	ctx := r.Context()
	path := r.URL.Path
	if r.Method == http.MethodPost && (path == "/v1/sandboxes" || path == "/v1/sessions") {
		nodes, err := p.o.Meta.ListNodes(ctx)
		if err != nil {
			return "", err
		}
		n, err := p.o.Place(nodes, peekTemplate(r), p.o.Clock.Now())
		if err != nil {
			return "", err
		}
		return n.Addr, nil
	}
	if rest, ok := strings.CutPrefix(path, "/p/"); ok {
		// An exposed port's URL: no key (the token in the path is the
		// credential, checked by the node that runs the sandbox).
		id, _, _ := strings.Cut(rest, "/")
		if addr, err := p.owner(ctx, id, metadata.APIKey{}); addr != "" || err != nil {
			if err != nil {
				err = errdefs.Unavailablef("the node behind this URL is down; retry")
			}
			return addr, err
		}
	}
	if rest, ok := strings.CutPrefix(path, "/v1/checkpoints/"); ok && r.Method == http.MethodPost && strings.HasSuffix(rest, "/restore") {
		// Restored on the node of the sandbox it was cut from (in place).
		if ck, err := p.o.Meta.Checkpoint(ctx, strings.TrimSuffix(rest, "/restore")); err == nil && (ck.Tenant == key.Tenant || operator(key)) {
			if addr, err := p.owner(ctx, ck.SandboxID, key); addr != "" || err != nil {
				return addr, err
			}
		}
	}
	for _, prefix := range []string{"/v1/sandboxes/", "/v1/sessions/"} {
		rest, ok := strings.CutPrefix(path, prefix)
		if !ok || rest == "" {
			continue
		}
		id, _, _ := strings.Cut(rest, "/")
		if addr, err := p.owner(ctx, id, key); addr != "" || err != nil {
			return addr, err
		}
	}
	n, err := p.anyNode(ctx)
	return n.Addr, err
}

// owner returns the address of the live node that runs sandbox (or
// session) id when key's tenant may know about it; "" when any node may
// answer (unknown, another tenant's, on no node).
func (p *Proxy) owner(ctx context.Context, id string, key metadata.APIKey) (string, error) {
	if strings.HasPrefix(id, "ses-") {
		se, err := p.o.Meta.GetSession(ctx, id)
		if err != nil || se.SandboxID == "" || se.Tenant != key.Tenant && !operator(key) {
			return "", nil
		}
		id = se.SandboxID
	}
	sb, err := p.o.Meta.Get(ctx, id)
	if err != nil || sb.Node == "" || sb.State == metadata.StateDestroyed || key.Tenant != "" && sb.Tenant != key.Tenant && !operator(key) {
		return "", nil
	}
	n, err := p.o.Meta.GetNode(ctx, sb.Node)
	if errdefs.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if !n.Alive(p.o.Clock.Now()) {
		return "", errdefs.Unavailablef("sandbox %s: its node %s is down; it is being restored on another node, retry", sb.ID, n.ID)
	}
	return n.Addr, nil
}

func operator(k metadata.APIKey) bool {
	return k.Tenant == metadata.DefaultTenant && k.Has(metadata.ScopeAdmin)
}

// anyNode returns a live node, in turn.
func (p *Proxy) anyNode(ctx context.Context) (metadata.Node, error) {
	nodes, err := p.o.Meta.ListNodes(ctx)
	if err != nil {
		return metadata.Node{}, err
	}
	now := p.o.Clock.Now()
	var live []metadata.Node
	for _, n := range nodes {
		if n.Alive(now) {
			live = append(live, n)
		}
	}
	if len(live) == 0 {
		return metadata.Node{}, errdefs.Unavailablef("no node of this deployment is live; retry")
	}
	return live[int(p.next.Add(1)%uint64(len(live)))], nil
}

// peekTemplate reads the "template" of a create's JSON body (up to 1 MiB;
// the node enforces its own limit) and puts the body back.
func peekTemplate(r *http.Request) string {
	if r.Body == nil {
		return ""
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b), r.Body))
	if err != nil {
		return ""
	}
	var v struct {
		Template string `json:"template"`
	}
	json.Unmarshal(b, &v)
	return v.Template
}

// forward proxies r to the node at addr.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, addr string) {
	p.o.Hop.Forward(w, r, addr, ForwardedHeader, "api/"+p.o.Name, func(w http.ResponseWriter, err error) {
		p.writeError(w, r, errdefs.Unavailablef("node at %s: %v; retry", addr, err))
	})
}

// writeError answers err; an internal one (500) only as "internal
// error" with a request id, its detail logged under that id (as the
// nodes do: internal/edge/server errors.go).
func (p *Proxy) writeError(w http.ResponseWriter, r *http.Request, err error) {
	body := api.ErrorBody{Kind: errdefs.Kind(err), Message: err.Error()}
	if errdefs.HTTPStatus(err) == http.StatusInternalServerError {
		b := make([]byte, 8)
		rand.Read(b)
		body.RequestID = "req-" + hex.EncodeToString(b)
		body.Message = "internal error"
		w.Header().Set("X-Request-Id", body.RequestID)
		p.o.Logger.Error("request failed", "request_id", body.RequestID, "method", r.Method, "path", r.URL.Path, "err", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(errdefs.HTTPStatus(err))
	json.NewEncoder(w).Encode(api.Error{Error: body})
}
