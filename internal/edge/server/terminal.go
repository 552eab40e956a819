package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/internal/obs/logging"
)

// The terminal: a shell on a pseudo-terminal in a sandbox, over a
// WebSocket (the console's in-browser terminal).
//
// A browser cannot send an Authorization header on a WebSocket, and an API
// key in a URL would end up in logs and histories. So the client first
// calls POST /v1/sandboxes/{id}/terminal with its key (scope write, like
// exec; audited), and gets a single-use ticket valid for ticketTTL. It then
// opens GET /v1/sandboxes/{id}/terminal/ws?ticket=… as a WebSocket. The
// ticket is bound to the tenant, the key's name and the sandbox; it is
// removed when used or expired, and never logged. The WebSocket's Origin
// must be the daemon's own host (coder/websocket's default check), so
// another site cannot open it even with a leaked ticket.
//
// Frames: the client sends binary (or text) messages as the terminal's
// input; the server sends the terminal's output as binary messages and, when
// the shell ends, a text message {"exit":{"code":…}} (or {"error":…}) before
// closing; it ends so, with an error, when the key that issued its ticket is
// revoked (streams.go), and counts as one of the tenant's streams. The
// first size is ?cols=&rows= (also exported as COLUMNS and LINES, except
// with control=1). With &control=1 a text message
// {"resize":{"cols":C,"rows":R}} changes it (sandboxes with the in-sandbox
// agent); without, every message is input, so that a paste of that text is
// typed, not obeyed.

// ticketTTL is how long a terminal ticket may wait to be used.
const ticketTTL = 30 * time.Second

type termTicket struct {
	tenant, sandbox string
	key             metadata.APIKey // the terminal lives as long as it is usable (streams.go)
	expires         time.Time
}

// tickets holds the unused terminal tickets.
type tickets struct {
	mu sync.Mutex
	m  map[string]termTicket
}

func (t *tickets) issue(tk termTicket, now time.Time) string {
	b := make([]byte, 24)
	rand.Read(b)
	id := hex.EncodeToString(b)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]termTicket{}
	}
	for k, v := range t.m {
		if now.After(v.expires) {
			delete(t.m, k)
		}
	}
	t.m[id] = tk
	return id
}

// take consumes ticket id: it is valid once, before it expires, for the
// sandbox it was issued for.
func (t *tickets) take(id, sandbox string, now time.Time) (termTicket, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tk, ok := t.m[id]
	if !ok {
		return termTicket{}, false
	}
	delete(t.m, id)
	return tk, tk.sandbox == sandbox && !now.After(tk.expires)
}

// terminalTicket issues a ticket for the terminal of a running sandbox;
// an idle one wakes first (engine.Wake), as for an exec.
func (s *Server) terminalTicket(w http.ResponseWriter, r *http.Request, c *call) error {
	id := r.PathValue("id")
	if _, err := s.eng.Wake(r.Context(), c.tenant, id); err != nil {
		return err
	}
	exp := s.clock.Now().Add(ticketTTL)
	tk := s.tickets.issue(termTicket{tenant: c.tenant, key: c.key, sandbox: id, expires: exp}, s.clock.Now())
	return writeJSON(w, http.StatusCreated, api.TerminalTicket{Ticket: tk, Expires: exp,
		Path: "/v1/sandboxes/" + url.PathEscape(id) + "/terminal/ws?ticket=" + tk})
}

// terminalWS serves the terminal WebSocket, authorized by its ticket.
func (s *Server) terminalWS(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	lg := s.lg.With(logging.SandboxID, id)
	tk, ok := s.tickets.take(r.URL.Query().Get("ticket"), id, s.clock.Now())
	if !ok {
		lg.InfoContext(r.Context(), "terminal refused: no valid ticket")
		writeError(w, fmt.Errorf("terminal of sandbox %s: the ticket is unknown, used or expired (POST /v1/sandboxes/{id}/terminal for one): %w", id, errdefs.ErrUnauthenticated))
		return
	}
	lg = lg.With(logging.TenantID, tk.tenant, "key", tk.key.Name)
	cols := boundedQueryInt(r, "cols", 80, 10, 500)
	rows := boundedQueryInt(r, "rows", 24, 5, 200)
	control := r.URL.Query().Get("control") == "1"
	sctx, endStream, err := s.openStreams.begin(s, w.Header(), r.Context(), tk.tenant, tk.key)
	if err != nil {
		writeError(w, err)
		return
	}
	defer endStream()
	release, err := s.execs.take(id, s.limits.MaxExecsPerSandbox)
	if err != nil {
		writeError(w, err)
		return
	}
	defer release()
	conn, err := websocket.Accept(w, r, nil) // checks Origin against Host
	if err != nil {
		lg.InfoContext(r.Context(), "terminal: websocket refused", "err", err)
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	// The shell runs in ctx, which a revoked key ends too; the WebSocket
	// is read and written in wctx, the request's: a cancelled context
	// closes a coder/websocket connection, and the last message must
	// still go out.
	ctx, cancel := context.WithCancel(sctx)
	defer cancel()
	wctx, wcancelConn := context.WithCancel(r.Context())
	defer wcancelConn()
	lg.InfoContext(ctx, "terminal opened", "cols", cols, "rows", rows)
	start := time.Now()

	inR, inW := io.Pipe()
	resize := make(chan sandbox.WindowSize, 4)
	go func() {
		defer inW.Close()
		for {
			typ, b, err := conn.Read(wctx)
			if err != nil {
				cancel() // the browser went away: end the shell
				return
			}
			if ws, ok := resizeMessage(typ, b); control && ok {
				select {
				case resize <- ws:
				default: // the shell is slow to take sizes: the next one wins
				}
				continue
			}
			if _, err := inW.Write(b); err != nil {
				return
			}
		}
	}()
	out := wsWriter{ctx: wctx, c: conn}
	env := []string{"TERM=xterm-256color"}
	if !control {
		// The size a client that never resizes sees, also where the
		// terminal cannot be sized (sandboxes without the agent). Not
		// with resizes: programs prefer these to the terminal's size.
		env = append(env, "COLUMNS="+strconv.Itoa(cols), "LINES="+strconv.Itoa(rows))
	}
	st, err := s.eng.Exec(ctx, tk.tenant, id, sandbox.ExecSpec{
		Args: []string{"/bin/sh", "-i"}, TTY: true, Stdin: inR, Stdout: out, Stderr: out,
		Size: sandbox.WindowSize{Rows: uint16(rows), Cols: uint16(cols)}, Resize: resize, Env: env,
	})
	inR.Close()
	if keyRevoked(sctx) {
		err = errKeyRevoked
	}
	var msg []byte
	if err != nil {
		eb := errBody(err)
		msg, _ = json.Marshal(map[string]any{"error": eb})
	} else {
		msg, _ = json.Marshal(map[string]any{"exit": api.ExitStatus{Code: st.Code, Signal: st.Signal, TimedOut: st.TimedOut, Reason: st.Reason}})
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer wcancel()
	_ = conn.Write(wctx, websocket.MessageText, msg)
	conn.Close(websocket.StatusNormalClosure, "")
	lg.InfoContext(r.Context(), "terminal closed", "took", time.Since(start).Round(time.Millisecond), "err", err)
}

type wsWriter struct {
	ctx context.Context
	c   *websocket.Conn
}

func (w wsWriter) Write(p []byte) (int, error) {
	if err := w.c.Write(w.ctx, websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func boundedQueryInt(r *http.Request, name string, def, lo, hi int) int {
	v, err := strconv.Atoi(r.URL.Query().Get(name))
	if err != nil {
		return def
	}
	return min(max(v, lo), hi)
}

// resizeMessage reads a text message {"resize":{"cols":C,"rows":R}}, with
// the bounds of the first size.
func resizeMessage(typ websocket.MessageType, b []byte) (sandbox.WindowSize, bool) {
	if typ != websocket.MessageText || len(b) > 256 || len(b) == 0 || b[0] != '{' {
		return sandbox.WindowSize{}, false
	}
	var m struct {
		Resize *struct {
			Cols int `json:"cols"`
			Rows int `json:"rows"`
		} `json:"resize"`
	}
	if json.Unmarshal(b, &m) != nil || m.Resize == nil ||
		m.Resize.Cols < 10 || m.Resize.Cols > 500 || m.Resize.Rows < 5 || m.Resize.Rows > 200 {
		return sandbox.WindowSize{}, false
	}
	return sandbox.WindowSize{Rows: uint16(m.Resize.Rows), Cols: uint16(m.Resize.Cols)}, true
}
