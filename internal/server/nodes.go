package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/meta"
)

// Router finds the node that runs a sandbox, for deployments of many
// nodes on shared stores (internal/cluster implements it).
type Router interface {
	// Owner returns the API address (host:port) of the live node that
	// runs sandbox id, or "" when this node should answer (it runs the
	// sandbox, or the sandbox is unknown, or on no node). It fails with
	// ErrUnavailable when the sandbox's node is down and the sandbox not
	// yet running elsewhere: the client retries.
	Owner(ctx context.Context, id string) (string, error)
	// Self is this node's id (the X-Amber-Forwarded-By header names it).
	Self() string
}

// Placer is a Router that also chooses where a new sandbox goes
// (internal/cluster implements it): a create arriving at a node that is
// draining or full is forwarded to the best other node with room.
type Placer interface {
	// Place returns "" when this node takes a new sandbox of template,
	// else the API address of the node that should. It fails (ErrUnavailable
	// or ErrResourceExhausted, naming every node and why) when no node has
	// room.
	Place(ctx context.Context, template string) (string, error)
}

// placedRoutes are the routes that make a new sandbox on the node that
// answers them, with the field of their body that names its template.
var placedRoutes = map[string]bool{
	"POST /v1/sandboxes": true,
}

// forwardedHeader marks a call one node forwarded to another: it is
// answered where it arrives (never forwarded twice), and the engine
// refuses it (ErrFenced) if the sandbox is not there either.
const forwardedHeader = "X-Amber-Forwarded-By"

// anyNodeAnswers lists the sandbox routes every node answers from the
// shared stores (the row, the log, checkpoints, the effect journal):
// clients following a sandbox's events keep following through any node.
var anyNodeAnswers = map[string]bool{
	"GET /v1/sandboxes/{id}":             true,
	"GET /v1/sandboxes/{id}/events":      true,
	"GET /v1/sandboxes/{id}/checkpoints": true,
	"GET /v1/sandboxes/{id}/effects":     true,
	"GET /v1/sandboxes/{id}/egress":      true,
	"GET /v1/sandboxes/{id}/ports":       true,
}

// forward proxies r to the node that runs the sandbox it names, when that
// is another node. It returns true when it answered. Authentication and
// authorisation happen again on the owner (the key is in the shared
// store), and so does the audit record.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, rt Route) (bool, error) {
	if s.router == nil || r.Header.Get(forwardedHeader) != "" {
		return false, nil
	}
	if placedRoutes[rt.Method+" "+rt.Path] {
		return s.place(w, r)
	}
	if !strings.HasPrefix(rt.Path, "/v1/sandboxes/{id}") || anyNodeAnswers[rt.Method+" "+rt.Path] {
		return false, nil
	}
	addr, err := s.router.Owner(r.Context(), r.PathValue("id"))
	if err != nil || addr == "" {
		return false, err
	}
	s.proxyTo(w, r, addr)
	return true, nil
}

// place forwards a create to the node placement chooses when this node is
// draining or full (Placer); the body is read (bounded) to learn the
// template and sent on unchanged.
func (s *Server) place(w http.ResponseWriter, r *http.Request) (bool, error) {
	pl, ok := s.router.(Placer)
	if !ok {
		return false, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, s.limits.MaxBodyBytes+1))
	if err != nil {
		return false, errdefs.InvalidArgumentf("read the request body: %v", err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req struct {
		Template string `json:"template"`
	}
	_ = json.Unmarshal(body, &req) // a bad body is the handler's 400, here or there
	addr, err := pl.Place(r.Context(), req.Template)
	if err != nil || addr == "" {
		return false, err
	}
	s.proxyTo(w, r, addr)
	return true, nil
}

// proxyTo sends r to the node at addr, marked as forwarded by this node.
func (s *Server) proxyTo(w http.ResponseWriter, r *http.Request, addr string) {
	target := &url.URL{Scheme: "http", Host: addr}
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = r.Host
			pr.Out.Header.Set(forwardedHeader, s.router.Self())
		},
		FlushInterval: -1, // exec output and progress frames stream
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			writeError(w, errdefs.Unavailablef("forward to node at %s: %v; retry", addr, err))
		},
	}
	p.ServeHTTP(w, r)
}

// listNodes answers GET /v1/nodes (the operator only).
func (s *Server) listNodes(w http.ResponseWriter, r *http.Request, c *call) error {
	if !c.operator() {
		return errdefs.PermissionDeniedf("listing nodes needs the operator's key (an admin-scoped key of tenant %s)", meta.DefaultTenant)
	}
	nodes, err := s.meta.ListNodes(r.Context())
	if err != nil {
		return err
	}
	out := api.NodeList{Nodes: []api.Node{}}
	now := s.clock.Now()
	for _, n := range nodes {
		out.Nodes = append(out.Nodes, api.Node{ID: n.ID, Addr: n.Addr, Epoch: n.Epoch, State: string(n.State), Alive: n.Alive(now),
			Capacity: api.NodeCapacity{MemoryBytes: n.Capacity.MemoryBytes, MaxSandboxes: n.Capacity.MaxSandboxes, Sandboxes: n.Capacity.Sandboxes,
				UsedMemoryBytes: n.Capacity.UsedMemoryBytes, Templates: nonNilStrings(n.Capacity.Templates), Driver: n.Capacity.Driver},
			Started: n.Started, Heartbeat: n.Heartbeat, Expires: n.Expires, TakenBy: n.TakenBy})
	}
	return writeJSON(w, http.StatusOK, out)
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
