package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/session"
)

func toAPISession(s metadata.Session) api.Session {
	return api.Session{ID: s.ID, Tenant: s.Tenant, Status: s.Status, Reason: s.Reason, Sandbox: s.SandboxID,
		Definition: json.RawMessage(s.Definition), Created: s.Created, Updated: s.Updated}
}

func (s *Server) sessionsOn() error {
	if s.sessions == nil {
		return errdefs.FailedPreconditionf("this daemon runs no agent sessions")
	}
	return nil
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.sessionsOn(); err != nil {
		return err
	}
	var def session.Definition
	if err := readJSON(r, &def); err != nil {
		return err
	}
	se, err := s.sessions.Create(r.Context(), c.tenant, def)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, toAPISession(se))
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.sessionsOn(); err != nil {
		return err
	}
	ss, err := s.sessions.List(r.Context(), c.tenant)
	if err != nil {
		return err
	}
	out := api.SessionList{Sessions: []api.Session{}}
	for _, se := range ss {
		out.Sessions = append(out.Sessions, toAPISession(se))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.sessionsOn(); err != nil {
		return err
	}
	se, err := s.sessions.Get(r.Context(), c.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, toAPISession(se))
}

// postSessionEvent appends a client event; the session's harness wakes.
func (s *Server) postSessionEvent(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.sessionsOn(); err != nil {
		return err
	}
	// Authorize before reading the body: a foreign id is 404 whatever it holds.
	if _, err := s.sessions.Get(r.Context(), c.tenant, r.PathValue("id")); err != nil {
		return err
	}
	var req api.PostSessionEventRequest
	if err := readJSON(r, &req); err != nil {
		return err
	}
	typ := req.Type
	if !strings.HasPrefix(typ, "session.") {
		typ = "session." + typ
	}
	ev, err := s.sessions.Post(r.Context(), c.tenant, r.PathValue("id"), typ, req.Payload, req.ID)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, toAPIEvent(ev))
}

// sessionEvents lists a session's events after position after.
func (s *Server) sessionEvents(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.sessionsOn(); err != nil {
		return err
	}
	after, err := queryInt(r, "after", 0)
	if err != nil {
		return err
	}
	limit, err := queryInt(r, "limit", 1000)
	if err != nil {
		return err
	}
	if limit < 1 || limit > 1000 {
		limit = 1000
	}
	evs, err := s.sessions.Events(r.Context(), c.tenant, r.PathValue("id"), uint64(after)+1, int(limit))
	if err != nil {
		return err
	}
	out := api.EventList{Events: []api.Event{}, Next: uint64(after) + 1}
	for _, ev := range evs {
		out.Events = append(out.Events, toAPIEvent(ev))
		out.Next = ev.Seq + 1
	}
	return writeJSON(w, http.StatusOK, out)
}

// sessionStream serves a session's log as Server-Sent Events: each event
// with "id: <seq>", "event: <type>" and the Event as data. It resumes after
// the Last-Event-ID header (or ?after=N): a client that reconnects with the
// last id it saw misses nothing and sees nothing twice — also across a
// daemon restart, since the log is the source. Live text deltas of model
// answers come as "event: session.assistant_delta" without an id (they are
// not durable; the complete message follows as an event with an id).
// A comment line every 15 s keeps idle connections open.
func (s *Server) sessionStream(w http.ResponseWriter, r *http.Request, c *call) error {
	if err := s.sessionsOn(); err != nil {
		return err
	}
	after, err := queryInt(r, "after", 0)
	if err != nil {
		return err
	}
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return errdefs.InvalidArgumentf("Last-Event-ID %.40q is not an event sequence number", v)
		}
		after = int64(n)
	}
	id := r.PathValue("id")
	// One of the tenant's streams, ended when its key is revoked (streams.go).
	ctx, endStream, err := s.beginStream(w, r, c)
	if err != nil {
		return err
	}
	defer endStream()
	r = r.WithContext(ctx)
	sub, err := s.sessions.Subscribe(r.Context(), c.tenant, id, uint64(after)+1)
	if err != nil {
		return err
	}
	deltas, stop := s.sessions.Deltas(id)
	defer stop()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc.Flush()

	type next struct {
		ev  api.Event
		err error
	}
	evc := make(chan next)
	go func() {
		for {
			ev, err := sub.Next(r.Context())
			if err == nil {
				ev, err = s.sessions.Upcast(ev)
			}
			select {
			case evc <- next{toAPIEvent(ev), err}:
			case <-r.Context().Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	tick := time.NewTicker(15 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return nil
		case <-s.streams.Done():
			return nil
		case <-tick.C:
			fmt.Fprint(w, ": keep-alive\n\n")
		case d := <-deltas:
			b, _ := json.Marshal(api.AssistantDelta{Text: d})
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", session.EventAssistantDelta, b)
		case n := <-evc:
			if n.err != nil {
				if r.Context().Err() != nil {
					return nil
				}
				b, _ := json.Marshal(api.Error{Error: errBody(n.err)})
				fmt.Fprintf(w, "event: error\ndata: %s\n\n", b)
				rc.Flush()
				return nil
			}
			b, _ := json.Marshal(n.ev)
			if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", n.ev.Seq, n.ev.Type, b); err != nil {
				return nil
			}
		}
		rc.Flush()
	}
}
