package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"

	"github.com/amber-run/amber/api"
)

func sesPath(id string, rest ...string) string {
	return "/v1/sessions/" + url.PathEscape(id) + strings.Join(rest, "")
}

// CreateSession creates an agent session from definition (a
// SessionDefinition as JSON: any value that marshals to one).
func (c *Client) CreateSession(ctx context.Context, definition any) (api.Session, error) {
	var out api.Session
	return out, c.do(ctx, "POST", "/v1/sessions", nil, definition, &out)
}

// ListSessions returns the tenant's sessions.
func (c *Client) ListSessions(ctx context.Context) ([]api.Session, error) {
	var out api.SessionList
	return out.Sessions, c.do(ctx, "GET", "/v1/sessions", nil, nil, &out)
}

// GetSession returns session id.
func (c *Client) GetSession(ctx context.Context, id string) (api.Session, error) {
	var out api.Session
	return out, c.do(ctx, "GET", sesPath(id), nil, nil, &out)
}

// PostSessionEvent sends a client event to session id.
func (c *Client) PostSessionEvent(ctx context.Context, id string, r api.PostSessionEventRequest) (api.Event, error) {
	var out api.Event
	return out, c.do(ctx, "POST", sesPath(id, "/events"), nil, r, &out)
}

// SessionEvents lists session id's events after position after.
func (c *Client) SessionEvents(ctx context.Context, id string, after uint64, limit int) (api.EventList, error) {
	var out api.EventList
	q := url.Values{"after": {fmt.Sprint(after)}}
	if limit > 0 {
		q.Set("limit", fmt.Sprint(limit))
	}
	return out, c.do(ctx, "GET", sesPath(id, "/events"), q, nil, &out)
}

// StreamSessionEvents follows session id's log over Server-Sent Events from
// after position after (sent as Last-Event-ID), calling f for each durable
// event (and, with deltas, for each live delta as an Event of type
// session.assistant_delta and Seq 0) until ctx ends, the stream ends or f
// returns an error. It returns the Seq of the last durable event it gave f:
// call it again with that to resume.
func (c *Client) StreamSessionEvents(ctx context.Context, id string, after uint64, deltas bool, f func(api.Event) error) (uint64, error) {
	req, err := c.request(ctx, "GET", sesPath(id, "/events/stream"), nil, nil, "")
	if err != nil {
		return after, err
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Last-Event-ID", strconv.FormatUint(after, 10))
	resp, err := c.send(req)
	if err != nil {
		return after, err
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var evType, data, evID string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if err == io.EOF || ctx.Err() != nil {
				return after, ctx.Err()
			}
			return after, err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if data == "" {
				evType, evID = "", ""
				continue
			}
			switch {
			case evType == "error":
				var e struct {
					Error api.ErrorBody `json:"error"`
				}
				json.Unmarshal([]byte(data), &e)
				return after, fromBody(e.Error, 0)
			case evID == "":
				if deltas {
					if err := f(api.Event{Type: evType, Payload: json.RawMessage(data)}); err != nil {
						return after, err
					}
				}
			default:
				var ev api.Event
				if err := json.Unmarshal([]byte(data), &ev); err != nil {
					return after, fmt.Errorf("session stream: event %s: %w", evID, err)
				}
				if err := f(ev); err != nil {
					return ev.Seq, err
				}
				after = ev.Seq
			}
			evType, data, evID = "", "", ""
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id:"):
			evID = strings.TrimSpace(line[3:])
		case strings.HasPrefix(line, "event:"):
			evType = strings.TrimSpace(line[6:])
		case strings.HasPrefix(line, "data:"):
			data += strings.TrimPrefix(line[5:], " ")
		}
	}
}
