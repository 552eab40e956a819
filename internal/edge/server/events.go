package server

import (
	"encoding/json"
	"net/http"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/eventlog"
)

func toAPIEvent(ev eventlog.Event) api.Event {
	return api.Event{Seq: ev.Seq, ID: ev.ID, Type: ev.Type, Version: ev.Version, Time: ev.Time,
		CausationID: ev.CausationID, Payload: ev.Payload}
}

// events returns a sandbox's lifecycle events from position from; with
// follow=true it streams them as newline-delimited JSON until the client
// goes away or its key is revoked (then an error line ends the stream:
// streams.go).
func (s *Server) events(w http.ResponseWriter, r *http.Request, c *call) error {
	from, err := queryInt(r, "from", 1)
	if err != nil {
		return err
	}
	limit, err := queryInt(r, "limit", 1000)
	if err != nil {
		return err
	}
	follow, err := queryBool(r, "follow")
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if !follow {
		evs, err := s.eng.Events(r.Context(), c.tenant, id, uint64(from), int(limit))
		if err != nil {
			return err
		}
		out := api.EventList{Events: []api.Event{}, Next: uint64(max(from, 1))}
		for _, ev := range evs {
			out.Events = append(out.Events, toAPIEvent(ev))
			out.Next = ev.Seq + 1
		}
		return writeJSON(w, http.StatusOK, out)
	}
	ctx, endStream, err := s.beginStream(w, r, c)
	if err != nil {
		return err
	}
	defer endStream()
	sub, err := s.eng.Subscribe(ctx, c.tenant, id, uint64(from))
	if err != nil {
		return err
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc.Flush()
	enc := json.NewEncoder(w)
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			if r.Context().Err() != nil {
				return nil
			}
			eb := errBody(streamErr(ctx, err))
			return enc.Encode(api.Error{Error: eb})
		}
		if ev, err = s.eng.Upcast(ev); err != nil {
			eb := errBody(err)
			return enc.Encode(api.Error{Error: eb})
		}
		if err := enc.Encode(toAPIEvent(ev)); err != nil {
			return err
		}
		rc.Flush()
	}
}
