package server

import (
	"context"
	"net/http"
	"strings"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/httpx"
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
	"GET /v1/sessions/{id}":              true,
	"GET /v1/sessions/{id}/events":       true,
}

// forward proxies r to the node that runs the sandbox it names (a
// session's: its sandbox's; a checkpoint's restore: the checkpointed
// sandbox's, whose node can restore it in place), when that is another
// node. It returns true when it answered. Authentication and
// authorisation happen again on the owner (the key is in the shared
// store), and so does the audit record.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, rt Route) (bool, error) {
	if s.router == nil || !(strings.HasPrefix(rt.Path, "/v1/sandboxes/{id}") || strings.HasPrefix(rt.Path, "/v1/sessions/{id}") ||
		rt.Method+" "+rt.Path == "POST /v1/checkpoints/{id}/restore") || anyNodeAnswers[rt.Method+" "+rt.Path] ||
		r.Header.Get(forwardedHeader) != "" {
		return false, nil
	}
	addr, err := s.router.Owner(r.Context(), r.PathValue("id"))
	if err != nil || addr == "" {
		return false, err
	}
	s.forwardTo(w, r, addr)
	return true, nil
}

// forwardTo proxies r to the node at addr, marked forwarded.
func (s *Server) forwardTo(w http.ResponseWriter, r *http.Request, addr string) {
	httpx.Forward(w, r, addr, forwardedHeader, s.router.Self(), func(w http.ResponseWriter, err error) {
		writeError(w, errdefs.Unavailablef("forward to node at %s: %v; retry", addr, err))
	})
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
