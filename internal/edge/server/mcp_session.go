package server

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
)

// The streamable HTTP transport of /v1/mcp (MCP 2025-03-26 and 2025-06-18)
// has two modes, chosen per request:
//
//   - Sessions. An initialize POST opens an MCP session: the answer carries
//     Mcp-Session-Id, and the client sends it on every later request. The
//     answers to POSTs with requests in them are SSE streams, so a tool's
//     progress notifications reach the client while it runs; a
//     notifications/cancelled sent in another POST of the session cancels
//     the call's context, which kills the command (an exec's process group
//     is SIGKILLed: see the agent client's Exec); GET opens the session's
//     standalone SSE stream and DELETE ends the session (its running
//     calls are cancelled with it).
//   - Sessionless. A POST that carries no session id and no initialize is
//     answered on its own, in JSON, as before sessions existed (curl, and
//     clients that never initialize). Such a call cannot be cancelled or
//     report progress: nothing can name it afterwards.
//   - Sessionless, protocol 2026-07-28 and later (Mcp-Protocol-Version),
//     where the POST is the whole life of a request: the answer is an SSE
//     stream with the call's progress, and the client's closing the
//     request cancels the call (PropagateRequestCancellation).
//
// Security: a session is bound to the key that opened it (its tenant and
// the hash of its secret), not just to the tenant. Each key has its own
// mcp.Server (mcpServer), and a session id is looked for only among the
// sessions of the caller's key's server: another key's session id, or one
// that ended, is 404, which tells the client to initialize again. A
// session id is 26 characters of crypto/rand (the SDK's rand.Text), and a
// guess of one is worth nothing without the key that opened it. Sessions
// live in this daemon's memory: a client whose next request reaches
// another node (or a restarted daemon) gets 404 and initializes again, as
// the transport foresees. A session nobody uses for mcpSessionIdle ends.
//
// GET and DELETE without a session id answer 405 with Allow: POST before
// any key is asked for (mcpOtherMethods): there is no stream or session to
// serve without one, and the official clients read 405 as "none".

// mcpRequestIDHeader carries the id of the request a tool call came in
// from the edge to the tool (mcpServe, mcpTool).
const mcpRequestIDHeader = "X-Amber-Mcp-Request-Id"

// mcpSessionIdle is how long an MCP session lives without a request.
const mcpSessionIdle = 30 * time.Minute

// mcpEndpoint holds the SDK's two handlers of /v1/mcp.
type mcpEndpoint struct {
	sessions, sessionless, perRequest http.Handler
	cancels                           mcpCancels
	calls                             mcpSessionCalls
}

// mcpSessionCalls cancels a session's calls in flight when the session is
// deleted: the SDK's Close waits for them to return, so a DELETE would
// wait for a running command (up to its timeout, an hour) and leave it
// running meanwhile. Every tool's context is tied to its session's
// (mcpTool), which DELETE cancels before the SDK closes the session.
type mcpSessionCalls struct {
	mu sync.Mutex
	m  map[string]*mcpSessionCtx
}

type mcpSessionCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// bind returns ctx, cancelled also when session sid is deleted, and the
// function that releases it. Sessions that ended otherwise (idle, the
// daemon's shutdown) are forgotten when the next session is first seen.
func (c *mcpSessionCalls) bind(ctx context.Context, s *Server, sid string) (context.Context, func()) {
	c.mu.Lock()
	sc := c.m[sid]
	if sc == nil {
		if c.m == nil {
			c.m = map[string]*mcpSessionCtx{}
		}
		live := map[string]bool{}
		s.mcpServers.Range(func(_, v any) bool {
			for ss := range v.(*mcp.Server).Sessions() {
				live[ss.ID()] = true
			}
			return true
		})
		for id, old := range c.m {
			if !live[id] {
				old.cancel()
				delete(c.m, id)
			}
		}
		sc = &mcpSessionCtx{}
		sc.ctx, sc.cancel = context.WithCancel(context.Background())
		c.m[sid] = sc
	}
	c.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(sc.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// end cancels the calls of session sid.
func (c *mcpSessionCalls) end(sid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sc := c.m[sid]; sc != nil {
		sc.cancel()
		delete(c.m, sid)
	}
}

// mcpPerRequestProtocol is the first protocol version without sessions
// (SEP-2575; the SDK's latest).
const mcpPerRequestProtocol = "2026-07-28"

// mcpEndpointFor makes the endpoint once; its handlers find the caller's
// server from the request's context (mcpServer).
func (s *Server) mcpEndpointFor() *mcpEndpoint {
	s.mcpOnce.Do(func() {
		get := func(r *http.Request) *mcp.Server {
			cl, _ := r.Context().Value(mcpCallerKey{}).(mcpCaller)
			return s.mcpServer(cl)
		}
		s.mcpHandler = &mcpEndpoint{
			sessions:    mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{SessionTimeout: mcpSessionIdle}),
			sessionless: mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true}),
			perRequest:  mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Stateless: true, PropagateRequestCancellation: true}),
		}
		go s.mcpCloseOnShutdown()
	})
	return s.mcpHandler
}

// mcpCloseOnShutdown ends every MCP session when the daemon shuts down
// (CloseStreams): a session's GET stream is open for as long as its
// client lives, and would hold http.Server.Shutdown to its deadline. A
// session's Close waits for its calls in flight, as Shutdown does for
// requests; its clients get 404 on their next request and initialize
// again, with the next daemon.
func (s *Server) mcpCloseOnShutdown() {
	<-s.streams.Done()
	s.mcpServers.Range(func(_, v any) bool {
		for ss := range v.(*mcp.Server).Sessions() {
			go ss.Close()
		}
		return true
	})
}

// mcpServe hands r to the handler of its mode: a request naming a session
// goes to the sessions handler only when that session is the caller's
// key's (else 404); one without goes there only if it initializes. A
// session's POST passes its cancels to the filter of answers (mcp_cancel.go).
func (s *Server) mcpServe(w http.ResponseWriter, r *http.Request, cl mcpCaller) {
	ep := s.mcpEndpointFor()
	// The tools of a session run in the context of the request that opened
	// it; this request's id reaches them in a header (mcpTool), so their
	// logs name the call's request. Set here, never taken from the client.
	r.Header.Del(mcpRequestIDHeader)
	if rid := w.Header().Get("X-Request-Id"); rid != "" {
		r.Header.Set(mcpRequestIDHeader, rid)
	}
	var msgs []mcpMsg
	if r.Method == http.MethodPost {
		body, err := io.ReadAll(r.Body) // bounded by the route's body limit (limitBody)
		if err != nil {
			writeError(w, bodyError(err))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		msgs = mcpMessages(body)
	}
	if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
		// Once the daemon shuts down every session is ending
		// (mcpCloseOnShutdown closes them in the background): a request in
		// one is answered 404 at once, not by a session a moment from its
		// end (a POST answered 200 between its GET stream's end and its
		// removal: TestMCPSessionsEndAtShutdown, once in CI).
		if s.streams.Err() != nil || !s.mcpOwns(cl, sid) {
			writeJSON(w, http.StatusNotFound, api.Error{Error: api.ErrorBody{Kind: errdefs.Kind(errdefs.ErrNotFound),
				Message: "MCP session " + sid + " not found (it ended, or another key opened it): initialize a new one"}})
			return
		}
		if r.Method == http.MethodDelete {
			ep.calls.end(sid)
		}
		if calls := ep.cancels.noteCancels(sid, msgs); len(calls) > 0 {
			w = &mcpCancelFilter{ResponseWriter: w, cancels: &ep.cancels, sid: sid, calls: calls}
		}
		ep.sessions.ServeHTTP(w, r)
		return
	}
	for _, m := range msgs {
		if m.Method == "initialize" {
			if s.streams.Err() != nil {
				writeError(w, errdefs.Unavailablef("the daemon is shutting down: initialize again in a moment"))
				return
			}
			ep.sessions.ServeHTTP(w, r)
			return
		}
	}
	if r.Header.Get("Mcp-Protocol-Version") >= mcpPerRequestProtocol {
		ep.perRequest.ServeHTTP(w, r)
		return
	}
	ep.sessionless.ServeHTTP(w, r)
}

// mcpOwns reports whether sid is a live session of the caller's key.
func (s *Server) mcpOwns(cl mcpCaller, sid string) bool {
	for ss := range s.mcpServer(cl).Sessions() {
		if ss.ID() == sid {
			return true
		}
	}
	return false
}

// mcpOtherMethods serves /v1/mcp's methods other than POST: GET (the
// session's SSE stream) and DELETE (end the session) with a session id go
// through the middleware as any call (key, scope read, the owner check of
// mcpServe); without one they are 405 with Allow: POST, for everyone.
func (s *Server) mcpOtherMethods() http.Handler {
	withSession := map[string]http.Handler{}
	for _, m := range []string{http.MethodGet, http.MethodDelete} {
		withSession[m] = s.wrap(Route{Method: m, Path: "/v1/mcp", Scope: read, h: s.mcp})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := withSession[r.Method]; h != nil && r.Header.Get("Mcp-Session-Id") != "" {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Allow", "POST")
		msg := r.Method + " /v1/mcp needs the Mcp-Session-Id of an MCP session (initialize opens one); send JSON-RPC messages with POST"
		if withSession[r.Method] == nil {
			msg = r.Method + " /v1/mcp: send JSON-RPC messages with POST"
		}
		writeJSON(w, http.StatusMethodNotAllowed, api.Error{Error: api.ErrorBody{Kind: errdefs.Kind(errdefs.ErrInvalidArgument), Message: msg}})
	})
}
