package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
)

// Idempotency-Key (creating calls).
//
// A route marked Idempotent accepts an Idempotency-Key header. The first
// call with a key claims it (a row in internal/state/meta, before the handler
// runs: intent first), runs, and records its answer when it succeeded; a
// retry with the same key and the same request (method, path and body,
// hashed) gets that answer again with `Idempotent-Replayed: true` and
// creates nothing. The same key with another request is 400; a retry
// while the first call still runs is 409. A call that failed forgets its
// claim, so its retry runs again. A retry that arrives while the first call
// runs in this daemon waits for it (up to idemWait) and is then answered
// as above: a client that read the last frame of a streamed answer may
// retry before the handler has returned and recorded it. A claim older than idemStale whose call
// never answered (the daemon died) is taken over by the next retry: a create
// cut off by a crash may then happen twice (the engine does not know the
// key); within a running daemon, never.

const (
	idemHeader   = "Idempotency-Key"
	idemReplayed = "Idempotent-Replayed"
	idemStale    = 10 * time.Minute
	idemMaxBody  = 1 << 20 // answers larger than this are not recorded
	idemWait     = time.Minute
)

// idemFlight tracks the calls that hold a claim in this daemon, so that a
// retry can wait for the first call's answer instead of a 409.
type idemFlight struct {
	mu   sync.Mutex
	runs map[string]chan struct{} // tenant\x00key → closed when the call has recorded its answer
}

func (f *idemFlight) start(k string) func() {
	ch := make(chan struct{})
	f.mu.Lock()
	if f.runs == nil {
		f.runs = map[string]chan struct{}{}
	}
	f.runs[k] = ch
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		if f.runs[k] == ch {
			delete(f.runs, k)
		}
		f.mu.Unlock()
		close(ch)
	}
}

// wait blocks until the call holding k in this daemon ends, ctx ends or
// idemWait passes; it reports whether such a call was found and ended.
func (f *idemFlight) wait(ctx context.Context, k string) bool {
	f.mu.Lock()
	ch := f.runs[k]
	f.mu.Unlock()
	if ch == nil {
		return false
	}
	t := time.NewTimer(idemWait)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

// recorder tees what a handler writes into a buffer (up to idemMaxBody).
type recorder struct {
	http.ResponseWriter
	status   int
	buf      bytes.Buffer
	overflow bool
}

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if !w.overflow {
		if w.buf.Len()+len(b) > idemMaxBody {
			w.overflow = true
		} else {
			w.buf.Write(b)
		}
	}
	return w.ResponseWriter.Write(b)
}

func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// succeeded tells whether the recorded answer is a success worth replaying:
// a 2xx whose streamed last frame (NDJSON) is not an error.
func (w *recorder) succeeded() bool {
	if w.status/100 != 2 || w.overflow {
		return false
	}
	b := bytes.TrimSpace(w.buf.Bytes())
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return !bytes.HasPrefix(b, []byte(`{"error":`))
}

// idempotent runs h under r's Idempotency-Key, if any (see above).
func (s *Server) idempotent(w http.ResponseWriter, r *http.Request, c *call, h handler) error {
	key := r.Header.Get(idemHeader)
	if key == "" {
		return h(w, r, c)
	}
	if err := metadata.ValidIdempotencyKey(key); err != nil {
		return err
	}
	// The body is bounded by the middleware (Limits.MaxBodyBytes).
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return bodyError(err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	sum := sha256.New()
	sum.Write([]byte(r.Method + " " + r.URL.RequestURI() + "\n" + r.Header.Get("Accept") + "\n"))
	sum.Write(body)
	hash := hex.EncodeToString(sum.Sum(nil))

	flightKey := c.tenant + "\x00" + key
	prev, claimed, err := s.meta.BeginIdempotent(r.Context(), c.tenant, key, hash, idemStale)
	if err != nil {
		return err
	}
	if !claimed && !prev.Done && prev.RequestHash == hash && s.idem.wait(r.Context(), flightKey) {
		// The first call ended here: its answer is recorded, or its
		// claim forgotten (it failed) and this retry runs it again.
		if prev, claimed, err = s.meta.BeginIdempotent(r.Context(), c.tenant, key, hash, idemStale); err != nil {
			return err
		}
	}
	if !claimed {
		switch {
		case prev.RequestHash != hash:
			return errdefs.InvalidArgumentf("%s %q was used for another request; use a new key for a new request", idemHeader, key)
		case !prev.Done:
			return errdefs.Conflictf("a request with %s %q is still running; retry later", idemHeader, key)
		}
		w.Header().Set(idemReplayed, "true")
		if prev.ContentType != "" {
			w.Header().Set("Content-Type", prev.ContentType)
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(prev.Body)))
		w.WriteHeader(prev.Status)
		_, err := w.Write(prev.Body)
		c.lg.InfoContext(r.Context(), "idempotent replay", "idempotency_key", key, "status", prev.Status)
		return err
	}
	done := s.idem.start(flightKey)
	defer done()
	rec := &recorder{ResponseWriter: w}
	herr := h(rec, r, c)
	// The answer is recorded even when the client has gone: a client that
	// read a streamed answer's last frame closes the connection (which
	// cancels r's context) and may retry at once; a record lost to that
	// cancel left the claim running, and the retry a 409.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
	defer cancel()
	if herr == nil && rec.succeeded() {
		err = s.meta.FinishIdempotent(rctx, c.tenant, key, rec.status, rec.Header().Get("Content-Type"), rec.buf.Bytes())
	} else {
		err = s.meta.AbandonIdempotent(rctx, c.tenant, key)
	}
	if err != nil {
		c.lg.ErrorContext(r.Context(), "record idempotency key", "idempotency_key", key, "err", err)
	}
	return herr
}
