// Package agent is the host's side of amber-agent (cmd/amber-agent, protocol
// in lib/agentproto): a client that the drivers use for everything that runs
// inside a sandbox — process start, output, stdin, signals, wait, lists and
// file watches — and the locator of the agent's binary.
//
// One Client serves one sandbox. It holds one HTTP/2 connection that every
// call shares (a dial through the driver's port dialer costs a process start
// under gvisor; a call then costs a stream). A dropped connection is dialled
// again on the next call; an output stream that breaks (a checkpoint, a
// restore, a daemon that restarted the connection) is re-attached from the
// last offset it delivered, so the caller sees neither a gap nor a repeat.
//
// Everything the agent answers is the sandbox's word: bodies are read
// through size limits, frames through agentproto's checked decoder, and a
// hung or dead agent is ErrUnavailable ("agent unavailable") within a
// deadline, never a hang.
package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/lib/agentproto"
)

// Dialer opens a new connection to the sandbox's agent.
type Dialer func(ctx context.Context) (net.Conn, error)

// Timeouts of the client. Variables so that tests can shorten them.
var (
	// CallTimeout bounds a call that does not stream (start, signal,
	// list, health) when its context has no earlier deadline.
	CallTimeout = 15 * time.Second
	// DialTimeout bounds one dial.
	DialTimeout = 10 * time.Second
	// ReattachWindow is how long a broken output stream keeps trying to
	// re-attach before it gives up with ErrUnavailable.
	ReattachWindow = 60 * time.Second
	// PingTimeout: a connection whose agent does not answer a ping within
	// this long is dropped (a stopped or hung agent).
	PingTimeout = 5 * time.Second
)

// Client talks to one sandbox's agent.
type Client struct {
	id    string
	token string
	dial  Dialer
	// Alive, when set, is asked before re-attaching a broken stream: an
	// error (the sandbox stopped) ends the stream with it.
	Alive func(ctx context.Context) error

	mu    sync.Mutex
	tr    *http.Transport
	conns map[net.Conn]struct{}
	// protocol is the version the agent last reported ("" before the
	// first Health, and after Drop).
	protocol string
}

// New returns a client of sandbox id's agent, reached with dial and
// authorized with token.
func New(id, token string, dial Dialer) *Client {
	c := &Client{id: id, token: token, dial: dial, conns: map[net.Conn]struct{}{}}
	c.tr = c.newTransport()
	return c
}

func (c *Client) newTransport() *http.Transport {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	return &http.Transport{
		Protocols: &protos,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(ctx, DialTimeout)
			defer cancel()
			conn, err := c.dial(ctx)
			if err != nil {
				return nil, err
			}
			tc := &trackedConn{Conn: conn, c: c}
			c.mu.Lock()
			c.conns[tc] = struct{}{}
			c.mu.Unlock()
			return tc, nil
		},
		ResponseHeaderTimeout: 0, // per call, by context
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:      4096,
			SendPingTimeout:           PingTimeout,
			PingTimeout:               PingTimeout,
			MaxReceiveBufferPerStream: 1 << 20,
			MaxReadFrameSize:          256 << 10,
		},
	}
}

// trackedConn lets Close end connections that calls are using.
type trackedConn struct {
	net.Conn
	c    *Client
	once sync.Once
}

func (t *trackedConn) Close() error {
	t.once.Do(func() {
		t.c.mu.Lock()
		delete(t.c.conns, t)
		t.c.mu.Unlock()
	})
	return t.Conn.Close()
}

// Drop closes every connection to the agent, also ones a call is using
// (before a checkpoint, and when the sandbox stops). Streams re-attach; the
// next call dials again.
func (c *Client) Drop() {
	c.mu.Lock()
	old := c.tr
	c.tr = c.newTransport()
	c.protocol = ""
	conns := make([]net.Conn, 0, len(c.conns))
	for k := range c.conns {
		conns = append(conns, k)
	}
	c.mu.Unlock()
	old.CloseIdleConnections()
	for _, k := range conns {
		k.Close()
	}
}

func (c *Client) transport() *http.Transport {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tr
}

// Conns reports how many connections are open (tests).
func (c *Client) Conns() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns)
}

// unavailable wraps a transport failure.
func (c *Client) unavailable(err error) error {
	return errdefs.Unavailablef("sandbox %s: agent unavailable: %v", c.id, err)
}

// do sends one request and returns the response of a status < 400.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body io.Reader) (*http.Response, error) {
	u := "http://agent" + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set(agentproto.TokenHeader, c.token)
	resp, err := c.transport().RoundTrip(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("sandbox %s: agent: %w", c.id, ctx.Err())
		}
		return nil, c.unavailable(err)
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		return nil, c.callError(resp)
	}
	return resp, nil
}

// Error is a failed call, as the agent explained it.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return "agent: " + e.Code + ": " + e.Message }

func (c *Client) callError(resp *http.Response) error {
	var e agentproto.Error
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if json.Unmarshal(b, &e) != nil || e.Code == "" {
		e = agentproto.Error{Code: "internal", Message: fmt.Sprintf("status %d", resp.StatusCode)}
	}
	if len(e.Message) > 1024 {
		e.Message = e.Message[:1024]
	}
	ae := &Error{Status: resp.StatusCode, Code: e.Code, Message: e.Message}
	msg := fmt.Sprintf("sandbox %s: %s", c.id, e.Message)
	switch e.Code {
	case "not_found":
		return errors.Join(errdefs.NotFoundf("%s", msg), ae)
	case "invalid":
		return errors.Join(errdefs.InvalidArgumentf("%s", msg), ae)
	case "denied":
		return errors.Join(errdefs.PermissionDeniedf("%s", msg), ae)
	case "exists":
		return errors.Join(errdefs.AlreadyExistsf("%s", msg), ae)
	case "precondition":
		return errors.Join(errdefs.FailedPreconditionf("%s", msg), ae)
	case "exhausted":
		return errors.Join(errdefs.ResourceExhaustedf("%s", msg), ae)
	case "too_large":
		return errors.Join(errdefs.TooLargef("%s", msg), ae)
	case "no_program", "not_executable":
		return ae
	}
	return errors.Join(fmt.Errorf("%s", msg), ae)
}

// call does a unary JSON call: in (nil: no body) → out (nil: none).
func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, CallTimeout)
		defer cancel()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := c.do(ctx, method, path, nil, body)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return c.unavailable(err)
		}
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, agentproto.MaxJSON))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, agentproto.MaxJSON)).Decode(out); err != nil {
		return c.unavailable(fmt.Errorf("bad answer to %s %s: %v", method, path, err))
	}
	return nil
}

// Health asks the agent who it is, and checks its protocol's major version.
func (c *Client) Health(ctx context.Context) (agentproto.Health, error) {
	var h agentproto.Health
	if err := c.call(ctx, "GET", "/v1/health", nil, &h); err != nil {
		return h, err
	}
	major, _, _ := strings.Cut(h.Protocol, ".")
	if n, err := strconv.Atoi(major); err != nil || n != agentproto.Major {
		return h, errdefs.FailedPreconditionf("sandbox %s: its agent speaks protocol %q; this daemon speaks %s", c.id, h.Protocol, agentproto.Version)
	}
	if len(h.Protocol) <= 16 {
		c.mu.Lock()
		c.protocol = h.Protocol
		c.mu.Unlock()
	}
	return h, nil
}

// WaitReady calls Health until it answers or ctx ends.
func (c *Client) WaitReady(ctx context.Context) (agentproto.Health, error) {
	var last error
	for delay := 2 * time.Millisecond; ; delay = min(delay*2, 100*time.Millisecond) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		h, err := c.Health(cctx)
		cancel()
		if err == nil || errors.Is(err, errdefs.ErrFailedPrecondition) || errors.Is(err, errdefs.ErrPermissionDenied) {
			return h, err // ready, or never will be
		}
		last = err
		select {
		case <-ctx.Done():
			return h, c.unavailable(fmt.Errorf("not ready: %v", last))
		case <-time.After(delay):
		}
	}
}

// Start starts a process and returns its sandbox PID. A program that is not
// there or cannot run is *Error with Code no_program or not_executable.
//
// A connection that breaks during the call (a checkpoint drops them) is
// dialled again and the start asked again under the same key, which the
// agent answers with the process it already started: one process, however
// often it is asked.
func (c *Client) Start(ctx context.Context, s agentproto.Start) (int, error) {
	if s.Key == "" {
		s.Key = newKey()
	}
	var st agentproto.Started
	var broke time.Time
	for {
		err := c.call(ctx, "POST", "/v1/processes", s, &st)
		if err == nil {
			break
		}
		if err := c.again(ctx, &broke, err); err != nil {
			return 0, err
		}
	}
	if st.PID <= 0 {
		return 0, c.unavailable(fmt.Errorf("start answered pid %d", st.PID))
	}
	return st.PID, nil
}

// newKey is a start key: a start asked again under it (after a broken
// connection) gets the process the first one started.
func newKey() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Signal sends sig to pid (group: its process group).
func (c *Client) Signal(ctx context.Context, pid, sig int, group bool) error {
	return c.call(ctx, "POST", "/v1/processes/"+strconv.Itoa(pid)+"/signal", agentproto.Signal{Signal: sig, Group: group}, nil)
}

// Resize sets a TTY process's window.
func (c *Client) Resize(ctx context.Context, pid int, rows, cols uint16) error {
	return c.call(ctx, "POST", "/v1/processes/"+strconv.Itoa(pid)+"/resize", agentproto.Resize{Rows: rows, Cols: cols}, nil)
}

// Processes lists the sandbox's processes, the agent left out.
func (c *Client) Processes(ctx context.Context) ([]agentproto.Process, error) {
	var ps []agentproto.Process
	err := c.call(ctx, "GET", "/v1/processes", nil, &ps)
	return ps, err
}

// Census asks the agent to count the sandbox's processes and established
// TCP sockets. An agent older than protocol 1.2 lacks the call: the error
// is then errdefs.ErrNotImplemented.
func (c *Client) Census(ctx context.Context) (agentproto.Census, error) {
	var cs agentproto.Census
	err := c.call(ctx, "GET", "/v1/census", nil, &cs)
	var ae *Error
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		return cs, errdefs.NotImplementedf("sandbox %s: its agent (older than protocol 1.2) has no census", c.id)
	}
	return cs, err
}

// Wait waits for a process the agent started to end.
func (c *Client) Wait(ctx context.Context, pid int) (agentproto.Exit, error) {
	var broke time.Time
	for {
		resp, err := c.do(ctx, "GET", "/v1/processes/"+strconv.Itoa(pid)+"/wait", nil, nil)
		if err == nil {
			var e agentproto.Exit
			derr := json.NewDecoder(io.LimitReader(resp.Body, agentproto.MaxJSON)).Decode(&e)
			resp.Body.Close()
			if derr == nil {
				return e, nil
			}
			if ctx.Err() != nil {
				return e, ctx.Err()
			}
			err = c.unavailable(derr)
		}
		if err := c.again(ctx, &broke, err); err != nil {
			return agentproto.Exit{}, err
		}
	}
}

// again decides whether a call that failed with err is made again: only
// when the agent was unavailable (a connection a cut, a restore or a
// restart broke), within ReattachWindow of the first failure since the
// call last got through (*broke), after reattachPause. It returns nil to
// try again, else the error to give up with.
func (c *Client) again(ctx context.Context, broke *time.Time, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if !errdefs.IsUnavailable(err) {
		return err
	}
	if broke.IsZero() {
		*broke = time.Now()
	} else if time.Since(*broke) > ReattachWindow {
		return err
	}
	return c.reattachPause(ctx)
}

// reattachPause waits a moment before a broken stream is tried again, and
// ends it when the sandbox is gone.
func (c *Client) reattachPause(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(50 * time.Millisecond):
	}
	if c.Alive != nil {
		if err := c.Alive(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Stdin streams r into a process's stdin; closeAfter ends its input at r's
// end.
func (c *Client) Stdin(ctx context.Context, pid int, r io.Reader, closeAfter bool) error {
	q := url.Values{}
	if closeAfter {
		q.Set("close", "1")
	}
	resp, err := c.do(ctx, "POST", "/v1/processes/"+strconv.Itoa(pid)+"/stdin", q, readerOnly{r})
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// readerOnly hides a reader's other methods (WriteTo, Len) from net/http,
// which would otherwise buffer or size it.
type readerOnly struct{ io.Reader }

// Watch streams changes under path inside the sandbox (recursive: every
// directory below it too) to fn until ctx ends or fn fails. The first call
// of fn may come before the watch is in place only if the agent was slow to
// answer; Watch returns once the agent has acknowledged the watch only
// through ready (closed then), which may be nil.
func (c *Client) Watch(ctx context.Context, path string, recursive bool, ready chan<- struct{}, fn func(agentproto.WatchEvent) error) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "1")
	}
	resp, err := c.do(ctx, "GET", "/v1/watch", q, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if ready != nil {
		close(ready)
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, 1<<62))
	for {
		var ev agentproto.WatchEvent
		if err := dec.Decode(&ev); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return c.unavailable(err)
		}
		if len(ev.Path) > 4096 || len(ev.Op) > 16 {
			return c.unavailable(errors.New("watch event out of bounds"))
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}
