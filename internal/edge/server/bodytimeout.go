package server

import (
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// A request body is read under a deadline that moves with every read:
// each read must bring bytes within Limits.BodyReadTimeout. A client that
// stops sending mid-body (a stalled upload, a half-sent JSON) so fails in
// bounded time — a 400 naming body_read_timeout, then net/http closes the
// connection, whose body was not read to its end — instead of holding its connection and a handler
// goroutine for as long as it likes; a slow but steady upload is never
// cut. net/http's own ReadTimeout cannot do this: it bounds the whole
// request, and an upload of a large file or a long exec is legitimately
// long.
//
// The deadline is the connection's read deadline (ResponseController), so
// it is lifted as soon as the body has ended: left in place, it would
// fire in net/http's background read while the handler still works and
// cancel the request's context. Exec's streamed stdin is not timed: it is
// a person's or a program's input, idle as long as they are (an
// interactive shell), and bounded instead as one of the tenant's streams
// (streams.go).

// timeBody puts r's body under the read timeout (see above) and returns
// it (nil: not timed). Whatever a handler makes of a stalled read (a JSON
// syntax error, a driver's broken upload), the middleware answers with
// the stall (stalledErr).
func (s *Server) timeBody(w http.ResponseWriter, r *http.Request, rt Route) *timedBody {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	if strings.HasSuffix(rt.Path, "/exec") && !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		return nil // streamed stdin (see above)
	}
	b := &timedBody{rc: r.Body, ctl: http.NewResponseController(w), timeout: s.limits.BodyReadTimeout}
	r.Body = b
	return b
}

// timedBody is a request body whose every read has a deadline.
type timedBody struct {
	rc      io.ReadCloser
	ctl     *http.ResponseController
	timeout time.Duration
	done    bool        // the body ended (or failed): the deadline is lifted
	stalled atomic.Bool // a read passed the deadline
}

// stalledErr is the error of a request whose body stalled, nil if it did not.
func (b *timedBody) stalledErr() error {
	if b == nil || !b.stalled.Load() {
		return nil
	}
	return errdefs.InvalidArgumentf("the request body stalled: no bytes came for %s (body_read_timeout)", b.timeout)
}

func (b *timedBody) Read(p []byte) (int, error) {
	if b.done {
		return b.rc.Read(p)
	}
	if err := b.ctl.SetReadDeadline(time.Now().Add(b.timeout)); err != nil {
		// A connection without deadlines (a test's recorder): untimed.
		b.done = true
		return b.rc.Read(p)
	}
	n, err := b.rc.Read(p)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The deadline stays passed: net/http's discard of the body's
		// rest after the handler fails at once too, and the connection
		// is closed (a cleared deadline would wait there for the rest).
		b.done = true
		b.stalled.Store(true)
		return n, b.stalledErr()
	case err != nil:
		// The body ended: lifted before net/http's background read of
		// the connection, which reads under it, can time out (see above).
		b.done = true
		_ = b.ctl.SetReadDeadline(time.Time{})
	}
	return n, err
}

func (b *timedBody) Close() error { return b.rc.Close() }
