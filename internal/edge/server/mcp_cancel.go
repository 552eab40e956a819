package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// A cancelled call gets no answer. The spec asks a receiver of
// notifications/cancelled not to answer the request, and the official
// TypeScript client reports an answer (or a progress notification) to a
// request it cancelled as an error ("unknown message ID"). The SDK's
// server answers every request, cancelled or not (the tool returns
// "context canceled"), so the answer is held back here, at the HTTP edge:
// a session's POST that carries notifications/cancelled notes the request
// id before the SDK reads the message (so before the call's context is
// cancelled: no answer can slip out between the two), and the SSE stream
// of the POST that carried the request drops the answer to a cancelled
// id, and the notifications of a POST whose requests were all cancelled.

// mcpCancelKeep bounds how long a cancel is remembered when no answer
// comes to take it (a request that had ended already, or an unknown id).
const mcpCancelKeep = time.Minute

// mcpCancels is the set of cancelled requests, by session and id.
type mcpCancels struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func (c *mcpCancels) add(sid, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.m == nil {
		c.m = map[string]time.Time{}
	}
	for k, at := range c.m {
		if now.Sub(at) > mcpCancelKeep {
			delete(c.m, k)
		}
	}
	c.m[sid+"\x00"+id] = now
}

func (c *mcpCancels) has(sid, id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.m[sid+"\x00"+id]
	return ok
}

func (c *mcpCancels) forget(sid, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, sid+"\x00"+id)
}

// mcpMsg is what the edge reads of a JSON-RPC message.
type mcpMsg struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		RequestID json.RawMessage `json:"requestId"`
	} `json:"params"`
}

// mcpMessages decodes a POST's body: one message or a batch (nil if it is
// neither).
func mcpMessages(body []byte) []mcpMsg {
	var batch []mcpMsg
	if err := json.Unmarshal(body, &batch); err != nil {
		var one mcpMsg
		if json.Unmarshal(body, &one) != nil {
			return nil
		}
		batch = []mcpMsg{one}
	}
	return batch
}

// mcpID is a JSON-RPC id in one form whatever its spelling: "n:" and the
// number, or "s:" and the string ("" for none).
func mcpID(raw json.RawMessage) string {
	var v any
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil {
		return ""
	}
	switch v := v.(type) {
	case float64:
		return "n:" + strconv.FormatFloat(v, 'g', -1, 64)
	case string:
		return "s:" + v
	}
	return ""
}

// noteCancels notes the cancels of a session's POST and returns the ids of
// the requests it carries.
func (c *mcpCancels) noteCancels(sid string, msgs []mcpMsg) (calls []string) {
	for _, m := range msgs {
		switch id := mcpID(m.ID); {
		case m.Method == "notifications/cancelled":
			if rid := mcpID(m.Params.RequestID); rid != "" {
				c.add(sid, rid)
			}
		case m.Method != "" && id != "":
			calls = append(calls, id)
		}
	}
	return calls
}

// mcpCancelFilter is the writer of a session POST's SSE stream that
// carries requests (calls): it drops what must not reach the client after
// a cancel. The SDK writes one event per Write (writeEvent).
type mcpCancelFilter struct {
	http.ResponseWriter
	cancels *mcpCancels
	sid     string
	calls   []string
}

func (f *mcpCancelFilter) Write(b []byte) (int, error) {
	i := bytes.Index(b, []byte("data: "))
	if i < 0 || (i > 0 && b[i-1] != '\n') {
		return f.ResponseWriter.Write(b)
	}
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if json.Unmarshal(bytes.TrimSpace(b[i+len("data: "):]), &m) != nil {
		return f.ResponseWriter.Write(b)
	}
	if id := mcpID(m.ID); m.Method == "" && id != "" {
		if f.cancels.has(f.sid, id) {
			f.cancels.forget(f.sid, id)
			return len(b), nil
		}
		return f.ResponseWriter.Write(b)
	}
	for _, id := range f.calls {
		if !f.cancels.has(f.sid, id) {
			return f.ResponseWriter.Write(b)
		}
	}
	return len(b), nil // a notification of calls all cancelled
}

// Unwrap lets http.ResponseController reach Flush underneath.
func (f *mcpCancelFilter) Unwrap() http.ResponseWriter { return f.ResponseWriter }
