package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/engine"
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
// answers them: given the request's body, whether this call does (a
// restore makes a new sandbox only as_new) and of which template ("":
// not known here).
var placedRoutes = map[string]func(body []byte) (bool, string){
	"POST /v1/sandboxes": func(body []byte) (bool, string) {
		var req struct {
			Template string `json:"template"`
		}
		_ = json.Unmarshal(body, &req) // a bad body is the handler's 400, here or there
		return true, req.Template
	},
	"POST /v1/checkpoints/{id}/restore": func(body []byte) (bool, string) {
		var req struct {
			AsNew bool `json:"as_new"`
		}
		_ = json.Unmarshal(body, &req)
		return req.AsNew, ""
	},
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
	if s.router == nil || r.Header.Get(forwardedHeader) != "" {
		return false, nil
	}
	key := rt.Method + " " + rt.Path
	if placed := placedRoutes[key]; placed != nil {
		done, makesOne, err := s.place(w, r, placed)
		if done || err != nil || makesOne {
			return done, err
		}
		// A restore in place: to the node of the checkpointed sandbox (below).
	}
	if !(strings.HasPrefix(rt.Path, "/v1/sandboxes/{id}") || strings.HasPrefix(rt.Path, "/v1/sessions/{id}") ||
		key == "POST /v1/checkpoints/{id}/restore") || anyNodeAnswers[key] {
		return false, nil
	}
	addr, err := s.router.Owner(r.Context(), r.PathValue("id"))
	if err != nil || addr == "" {
		return false, err
	}
	s.forwardTo(w, r, addr)
	return true, nil
}

// place forwards a call that makes a new sandbox to the node placement
// chooses when this node is draining or full (Placer); the body is read
// (bounded) to learn the template and sent on unchanged. It says whether
// it answered and whether the call makes a new sandbox at all.
func (s *Server) place(w http.ResponseWriter, r *http.Request, placed func([]byte) (bool, string)) (done, makesOne bool, err error) {
	pl, ok := s.router.(Placer)
	if !ok {
		return false, false, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, s.limits.MaxBodyBytes+1))
	if err != nil {
		return false, false, errdefs.InvalidArgumentf("read the request body: %v", err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	makesOne, template := placed(body)
	if !makesOne {
		return false, false, nil
	}
	addr, err := pl.Place(r.Context(), template)
	if err != nil || addr == "" {
		return false, true, err
	}
	s.forwardTo(w, r, addr)
	return true, true, nil
}

// forwardTo proxies r to the node at addr, marked forwarded.
func (s *Server) forwardTo(w http.ResponseWriter, r *http.Request, addr string) {
	s.hop.Forward(w, r, addr, forwardedHeader, s.router.Self(), func(w http.ResponseWriter, err error) {
		writeError(w, errdefs.Unavailablef("forward to node at %s: %v; retry", addr, err))
	})
}

// listNodes answers GET /v1/nodes (the operator only).
func (s *Server) listNodes(w http.ResponseWriter, r *http.Request, c *call) error {
	if !c.operator() {
		return errdefs.PermissionDeniedf("listing nodes needs the operator's key (an admin-scoped key of tenant %s)", metadata.DefaultTenant)
	}
	nodes, err := s.tenancy.Nodes(r.Context())
	if err != nil {
		return err
	}
	out := api.NodeList{Nodes: []api.Node{}}
	now := s.clock.Now()
	for _, n := range nodes {
		out.Nodes = append(out.Nodes, toAPINode(n, now))
	}
	return writeJSON(w, http.StatusOK, out)
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// operatorNode returns node id's row for an operator's call (what names
// the call in the refusal of anyone else's key).
func (s *Server) operatorNode(ctx context.Context, c *call, what, id string) (metadata.Node, error) {
	if !c.operator() {
		return metadata.Node{}, errdefs.PermissionDeniedf("%s needs the operator's key (an admin-scoped key of tenant %s)", what, metadata.DefaultTenant)
	}
	return s.tenancy.Node(ctx, id)
}

// drainNode answers POST /v1/nodes/{id}/drain (the operator only): node id
// becomes draining (engine.Tenancy.Drain) — it keeps its lease, takes no
// new sandboxes, and its sandboxes move to other nodes (internal/cluster,
// drain.go, does the moves; this handler only has the node marked and,
// with wait=true, follows the moves in the metadata store until the node
// holds none). It is refused, and the node left as it is, when the node is
// unknown or down, or when it holds sandboxes and no other node has room.
func (s *Server) drainNode(w http.ResponseWriter, r *http.Request, c *call) error {
	ctx, id := r.Context(), r.PathValue("id")
	n, err := s.operatorNode(ctx, c, "draining a node", id)
	if err != nil {
		return err
	}
	held, err := s.tenancy.Drain(ctx, n)
	if err != nil {
		return err
	}
	c.lg.InfoContext(ctx, "node draining", "node", id, "sandboxes", held)
	first := api.DrainFrame{Node: id, State: string(metadata.NodeDraining), Sandboxes: held}
	if r.URL.Query().Get("wait") != "true" {
		return writeJSON(w, http.StatusOK, first)
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	write := func(f api.DrainFrame) error {
		if err := enc.Encode(f); err != nil {
			return err
		}
		return rc.Flush()
	}
	if err := write(first); err != nil {
		return err
	}
	return s.followDrain(ctx, id, write)
}

// noRoomPatience is how long a drain waits for room on another node
// before it tells the client that it is stuck.
const noRoomPatience = 30 * time.Second

// followDrain writes a frame per sandbox that leaves node id (once it runs,
// or rests, on its new node) and a last one when the node holds none.
func (s *Server) followDrain(ctx context.Context, id string, write func(api.DrainFrame) error) error {
	type track struct {
		sb      metadata.Sandbox
		stopped time.Time // seen stopped for its move
	}
	start := time.Now()
	tracked := map[string]*track{}
	var noRoom time.Time
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	fail := func(err error) error {
		eb := errBody(err)
		return write(api.DrainFrame{Node: id, Error: &eb})
	}
	for {
		rows, err := s.tenancy.NodeSandboxes(ctx, id)
		if err != nil {
			return fail(err)
		}
		on, running := map[string]bool{}, 0
		for _, sb := range rows {
			on[sb.ID] = true
			t := tracked[sb.ID]
			if t == nil {
				t = &track{sb: sb}
				tracked[sb.ID] = t
			}
			if _, moving := engine.MovingTo(sb); moving && t.stopped.IsZero() {
				t.stopped = time.Now()
			}
			if sb.State == metadata.StateRunning {
				running++
			}
		}
		for sid, t := range tracked {
			if on[sid] {
				continue
			}
			cur, err := s.tenancy.Sandbox(ctx, sid)
			if err != nil || cur.State == metadata.StateDestroyed {
				delete(tracked, sid) // destroyed meanwhile
				continue
			}
			if _, moving := engine.MovingTo(cur); moving || cur.State == metadata.StateRestoring || cur.Node == id {
				continue // on its new node, not restored yet
			}
			from := t.stopped
			if from.IsZero() {
				from = start
			}
			delete(tracked, sid)
			if err := write(api.DrainFrame{Node: id, Sandboxes: len(rows), Moved: &api.DrainMove{Sandbox: sid, Tenant: cur.Tenant, To: cur.Node,
				State: string(cur.State), Generation: cur.Generation, Checkpoint: cur.Origin, TookMS: time.Since(from).Milliseconds()}}); err != nil {
				return err
			}
		}
		if len(rows) == 0 && len(tracked) == 0 {
			n, err := s.tenancy.Node(ctx, id)
			if err != nil {
				return fail(err)
			}
			return write(api.DrainFrame{Node: id, State: string(n.State), Done: true})
		}
		// Sandboxes that still run here and no node with room: say so
		// after a while rather than wait for ever.
		if running > 0 {
			if err := s.tenancy.Room(ctx, id); err != nil {
				if noRoom.IsZero() {
					noRoom = time.Now()
				} else if time.Since(noRoom) > noRoomPatience {
					return fail(fmt.Errorf("node %s still holds %d running sandboxes and has been waiting %s for room: %w (the node stays draining; it goes on when room appears)",
						id, running, noRoomPatience, err))
				}
			} else {
				noRoom = time.Time{}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// undrainNode answers POST /v1/nodes/{id}/undrain (the operator only): a
// draining node is live again and takes new sandboxes (the ones it moved
// stay where they went).
func (s *Server) undrainNode(w http.ResponseWriter, r *http.Request, c *call) error {
	ctx, id := r.Context(), r.PathValue("id")
	n, err := s.operatorNode(ctx, c, "undraining a node", id)
	if err != nil {
		return err
	}
	if err := s.tenancy.Undrain(ctx, n); err != nil {
		return err
	}
	c.lg.InfoContext(ctx, "node live again", "node", id)
	return s.listNode(w, r, id)
}

// listNode writes node id as GET /v1/nodes lists it.
func (s *Server) listNode(w http.ResponseWriter, r *http.Request, id string) error {
	n, err := s.tenancy.Node(r.Context(), id)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPINode(n, s.clock.Now()))
}

func toAPINode(n metadata.Node, now time.Time) api.Node {
	return api.Node{ID: n.ID, Addr: n.Addr, Epoch: n.Epoch, State: string(n.State), Alive: n.Alive(now),
		Capacity: api.NodeCapacity{MemoryBytes: n.Capacity.MemoryBytes, MaxSandboxes: n.Capacity.MaxSandboxes, Sandboxes: n.Capacity.Sandboxes,
			UsedMemoryBytes: n.Capacity.UsedMemoryBytes, Templates: nonNilStrings(n.Capacity.Templates), Driver: n.Capacity.Driver},
		Started: n.Started, Heartbeat: n.Heartbeat, Expires: n.Expires, TakenBy: n.TakenBy}
}
