package apiproxy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/state/meta"
	"github.com/amber-run/amber/lib/httpx"
)

type fakeStore struct {
	nodes    []meta.Node
	sbs      map[string]meta.Sandbox
	sessions map[string]meta.Session
	keys     map[string]meta.APIKey
}

func (f *fakeStore) ListNodes(context.Context) ([]meta.Node, error) { return f.nodes, nil }
func (f *fakeStore) GetNode(_ context.Context, id string) (meta.Node, error) {
	for _, n := range f.nodes {
		if n.ID == id {
			return n, nil
		}
	}
	return meta.Node{}, errdefs.NotFoundf("node %s", id)
}
func (f *fakeStore) Get(_ context.Context, id string) (meta.Sandbox, error) {
	if sb, ok := f.sbs[id]; ok {
		return sb, nil
	}
	return meta.Sandbox{}, errdefs.NotFoundf("sandbox %s", id)
}
func (f *fakeStore) GetSession(_ context.Context, id string) (meta.Session, error) {
	if se, ok := f.sessions[id]; ok {
		return se, nil
	}
	return meta.Session{}, errdefs.NotFoundf("session %s", id)
}
func (f *fakeStore) Checkpoint(_ context.Context, id string) (meta.Checkpoint, error) {
	if id == "ckpt-a" {
		return meta.Checkpoint{ID: id, Tenant: "acme", SandboxID: "sbx-a"}, nil
	}
	return meta.Checkpoint{}, errdefs.NotFoundf("checkpoint %s", id)
}
func (f *fakeStore) KeyByHash(_ context.Context, h string) (meta.APIKey, error) {
	if k, ok := f.keys[h]; ok {
		return k, nil
	}
	return meta.APIKey{}, errdefs.NotFoundf("key")
}

// node is a fake node agent: it records what reached it.
type node struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []string // "METHOD PATH by=HEADER body=BODY"
}

func newNode(t *testing.T) *node {
	n := &node{}
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		n.mu.Lock()
		n.got = append(n.got, r.Method+" "+r.URL.Path+" by="+r.Header.Get(ForwardedHeader)+" body="+string(b))
		n.mu.Unlock()
		w.WriteHeader(http.StatusTeapot)
	}))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *node) addr() string { u, _ := url.Parse(n.srv.URL); return u.Host }

func (n *node) take() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	g := n.got
	n.got = nil
	return g
}

// TestProxyRoutes: without a valid key nothing is looked up or passed on;
// a sandbox's and a session's calls go to the node that runs them, 503
// when it is down; another tenant's sandbox is passed on like an unknown
// one (its node's state is not revealed); creates go to the least loaded
// live node that takes sandboxes (a cached template first, never a
// draining or full node), their body intact; every call passed on is
// marked forwarded.
func TestProxyRoutes(t *testing.T) {
	now := time.Now()
	a, b, c := newNode(t), newNode(t), newNode(t)
	live := func(id string, n *node, st meta.NodeState, sandboxes int, templates ...string) meta.Node {
		return meta.Node{ID: id, Addr: n.addr(), State: st, Expires: now.Add(time.Hour),
			Capacity: meta.NodeCapacity{Sandboxes: sandboxes, MaxSandboxes: 10, Templates: templates}}
	}
	fs := &fakeStore{
		nodes: []meta.Node{live("a", a, meta.NodeLive, 5, "python"), live("b", b, meta.NodeLive, 1), live("c", c, meta.NodeDraining, 0, "python"),
			{ID: "dead", Addr: "127.0.0.1:1", State: meta.NodeLive, Expires: now.Add(-time.Second)}},
		sbs: map[string]meta.Sandbox{"sbx-a": {ID: "sbx-a", Tenant: "acme", Node: "a"}, "sbx-gone": {ID: "sbx-gone", Tenant: "acme", Node: "dead"},
			"sbx-other": {ID: "sbx-other", Tenant: "globex", Node: "dead"}},
		sessions: map[string]meta.Session{"ses-1": {ID: "ses-1", Tenant: "acme", SandboxID: "sbx-a"}},
		keys:     map[string]meta.APIKey{meta.HashKey("k-acme"): {Tenant: "acme", Name: "k", Scopes: meta.AllScopes}},
	}
	p := New(Options{Meta: fs, Name: "front", Clock: fixed{now}})
	ts := httptest.NewServer(p)
	defer ts.Close()
	call := func(method, path, key, body string) int {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	none := func(what string) {
		t.Helper()
		for _, n := range []*node{a, b, c} {
			if g := n.take(); len(g) > 0 {
				t.Fatalf("%s: a node got %v", what, g)
			}
		}
	}

	if code := call("GET", "/v1/sandboxes/sbx-a", "", ""); code != 401 {
		t.Fatalf("no key: %d", code)
	}
	if code := call("POST", "/v1/sandboxes/sbx-a/exec", "wrong", `{}`); code != 401 {
		t.Fatalf("bad key: %d", code)
	}
	none("unauthenticated calls")

	if code := call("POST", "/v1/sandboxes/sbx-a/exec", "k-acme", `{"args":["true"]}`); code != http.StatusTeapot {
		t.Fatalf("exec: %d", code)
	}
	if g := a.take(); len(g) != 1 || g[0] != `POST /v1/sandboxes/sbx-a/exec by=api/front body={"args":["true"]}` {
		t.Fatalf("the owner got %v", g)
	}
	if code := call("POST", "/v1/sessions/ses-1/events", "k-acme", `{"type":"user_message"}`); code != http.StatusTeapot || len(a.take()) != 1 {
		t.Fatalf("a session's event did not reach its sandbox's node: %d", code)
	}
	if code := call("GET", "/v1/sandboxes/sbx-gone", "k-acme", ""); code != 503 {
		t.Fatalf("a sandbox whose node is down: %d, want 503", code)
	}
	none("a sandbox whose node is down")
	if code := call("GET", "/v1/sandboxes/sbx-other", "k-acme", ""); code != http.StatusTeapot {
		t.Fatalf("another tenant's sandbox: %d, want it passed on like an unknown one (its node answers 404)", code)
	}
	a.take()
	b.take()
	c.take()
	if code := call("POST", "/v1/checkpoints/ckpt-a/restore", "k-acme", `{}`); code != http.StatusTeapot || len(a.take()) != 1 {
		t.Fatalf("a checkpoint's restore did not reach its sandbox's node: %d", code)
	}
	// An exposed port's URL needs no key; it goes to the sandbox's node.
	if code := call("GET", "/p/sbx-a/8080/tok/x", "", ""); code != http.StatusTeapot || len(a.take()) != 1 {
		t.Fatalf("port URL: %d", code)
	}
	if code := call("GET", "/p/sbx-gone/8080/tok/x", "", ""); code != 503 {
		t.Fatalf("port URL of a sandbox whose node is down: %d", code)
	}
	// A port's own origin (Host <port>-<sandbox>.ports.localhost), with
	// any path and no key, goes to the sandbox's node too; one of no
	// known sandbox to some node (which answers 404), never refused here.
	onHost := func(host, path string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", ts.URL+path, nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := onHost("8080-sbx-a.ports.localhost:7777", "/v1/sandboxes?amber_token=tok"); code != http.StatusTeapot || len(a.take()) != 1 {
		t.Fatalf("port origin: %d", code)
	}
	if code := onHost("8080-sbx-gone.ports.localhost", "/"); code != 503 {
		t.Fatalf("port origin of a sandbox whose node is down: %d", code)
	}
	if code := onHost("8080-sbx-nope.ports.localhost", "/"); code != http.StatusTeapot {
		t.Fatalf("port origin of an unknown sandbox: %d, want it passed to a node", code)
	}
	a.take()
	b.take()
	c.take()

	// Creates: b (fewest sandboxes) for any template; a for python (cached
	// there; c has it too but drains).
	if code := call("POST", "/v1/sandboxes", "k-acme", `{"template":"minimal"}`); code != http.StatusTeapot {
		t.Fatalf("create: %d", code)
	}
	if g := b.take(); len(g) != 1 || g[0] != `POST /v1/sandboxes by=api/front body={"template":"minimal"}` {
		t.Fatalf("create minimal: b got %v (a %v, c %v)", g, a.take(), c.take())
	}
	call("POST", "/v1/sessions", "k-acme", `{"template":"python","model":{"adapter":"scripted"}}`)
	if g := a.take(); len(g) != 1 || !strings.Contains(g[0], `"template":"python"`) {
		t.Fatalf("create python: a got %v (b %v, c %v)", g, b.take(), c.take())
	}
	// Everything full or draining: 429 (live nodes, all full), nothing passed on.
	fs.nodes[0].Capacity.Sandboxes, fs.nodes[1].Capacity.Sandboxes = 10, 10
	if code := call("POST", "/v1/sandboxes", "k-acme", `{"template":"minimal"}`); code != 429 {
		t.Fatalf("create with every node full: %d", code)
	}
	none("create with every node full")
	// Other calls: any live node, in turn (the dead one never).
	seen := map[string]bool{}
	for range 6 {
		if code := call("GET", "/v1/templates", "k-acme", ""); code != http.StatusTeapot {
			t.Fatalf("templates: %d", code)
		}
		for name, n := range map[string]*node{"a": a, "b": b, "c": c} {
			if len(n.take()) > 0 {
				seen[name] = true
			}
		}
	}
	if len(seen) != 3 {
		t.Fatalf("calls spread over %v, want a, b and c", seen)
	}
	if code := call("GET", "/readyz", "", ""); code != 200 {
		t.Fatalf("readyz: %d", code)
	}
}

func TestLeastLoadedNoNode(t *testing.T) { // no live node: 503
	_, err := LeastLoaded(nil, "", time.Now())
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("no nodes: %v", err)
	}
}

type fixed struct{ t time.Time }

func (f fixed) Now() time.Time { return f.t }

// TestProxyForwardsWithNodeToken: the API-only server forwards with the
// deployment's node token (httpx.Hop), never one a client made up; its
// /readyz and internal errors say nothing of the store.
func TestProxyForwardsWithNodeToken(t *testing.T) {
	now := time.Now()
	var got []string
	var mu sync.Mutex
	n := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get(httpx.NodeTokenHeader))
		mu.Unlock()
		w.WriteHeader(http.StatusTeapot)
	}))
	defer n.Close()
	u, _ := url.Parse(n.URL)
	fs := &fakeStore{nodes: []meta.Node{{ID: "a", Addr: u.Host, State: meta.NodeLive, Expires: now.Add(time.Hour)}},
		keys: map[string]meta.APIKey{meta.HashKey("k-acme"): {Tenant: "acme", Name: "k", Scopes: meta.AllScopes}}}
	ts := httptest.NewServer(New(Options{Meta: fs, Clock: fixed{now}, Hop: &httpx.Hop{Token: "the-node-token-0123456789abcdef01"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	defer ts.Close()
	req, _ := http.NewRequest("GET", ts.URL+"/v1/templates", nil)
	req.Header.Set("Authorization", "Bearer k-acme")
	req.Header.Set(httpx.NodeTokenHeader, "client-made-up")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTeapot || len(got) != 1 || got[0] != "the-node-token-0123456789abcdef01" {
		t.Fatalf("forwarded: %d, the node saw tokens %q", resp.StatusCode, got)
	}
	// No live node: "not ready", nothing more.
	fs.nodes = nil
	resp, err = http.Get(ts.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || strings.Contains(string(b), "node") {
		t.Errorf("readyz: %d %s", resp.StatusCode, b)
	}
}
