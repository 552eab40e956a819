package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/amber-run/amber/internal/obs/tracing"
	"github.com/amber-run/amber/lib/httpx"
	"go.opentelemetry.io/otel/attribute"
	"io"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
)

// Response headers the gateway adds.
const (
	// HeaderReplayed is set on answers served from the journal.
	HeaderReplayed = "Amber-Replayed"
	// HeaderError names the kind of a gateway-made error answer:
	// "denied", "rate-limited", "fenced", "needs-reconciliation",
	// "divergence", "body-not-journaled", "journal", "bad-request", "busy".
	HeaderError = "Amber-Gateway-Error"
)

// upstreamTimeout bounds one forwarded request, detached from the client:
// once sent, a request's outcome is recorded even if the client went away.
const upstreamTimeout = 2 * time.Minute

type handler struct {
	g       *Gateway
	st      *sandboxState
	sandbox string
	origDst netip.AddrPort
	// origHost is the name the sandbox resolved origDst from ("" if none).
	origHost string
	scheme   string // "http", or "https" behind terminated TLS
}

// request is one HTTP request on its way through the gateway.
type request struct {
	r        *http.Request
	run      Run
	host     string
	port     uint16
	upstream netip.AddrPort
	url      string // normalized
	body     []byte
	bodySum  string
	out      http.Header // headers to send: secrets substituted
	sub      *substitution
	d        Decision
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g := h.g
	if g.crashed.Load() {
		panic(http.ErrAbortHandler)
	}
	h.st.mu.Lock()
	run := h.st.run
	h.st.mu.Unlock()

	// The Host (for an absolute-form request or an HTTP/2 CONNECT, the
	// URL's authority: net/http puts it in r.Host) is parsed once, here; a
	// zone or a name no DNS could hold is refused before any decision.
	host, herr := parseRequestHost(r.Host)
	if a, err := netip.ParseAddr(host); herr == nil && (host == "" || err == nil && a == h.origDst.Addr() && h.origHost != "") {
		// No Host, or the stand-in address the sandbox dialled by literal:
		// the request is for the name the address stands for.
		host = h.origHost
	}
	if host == "" {
		host = h.origDst.Addr().String()
	}
	port := h.origDst.Port()
	ctx, span := tracing.StartGatewayRequest(r.Context(), g.opts.Tracer, run.Tenant, h.sandbox, r.Method, host)
	sw := &httpx.StatusWriter{ResponseWriter: w}
	w, r = sw, r.WithContext(ctx)
	defer func() {
		span.SetAttributes(attribute.Int("http.response.status_code", sw.Status),
			tracing.GatewayReplayed.Bool(sw.Header().Get(HeaderReplayed) == "true"))
		var err error
		if sw.Status >= 500 {
			err = fmt.Errorf("status %d", sw.Status)
		}
		tracing.End(span, err)
	}()
	q := &request{r: r, run: run, host: host, port: port}
	q.d = Decision{Dest: joinHostPort(host, port), Method: r.Method}
	if !h.st.enter(g.opts.MaxRequestsPerSandbox) {
		w.Header().Set("Retry-After", "1")
		h.fail(w, q, http.StatusTooManyRequests, "rate-limited", "rate-limited",
			fmt.Sprintf("concurrent request limit (%d per sandbox)", g.opts.MaxRequestsPerSandbox))
		return
	}
	entered := true
	leave := func() {
		if entered {
			entered = false
			h.st.leave()
		}
	}
	defer leave()
	if herr != nil {
		h.fail(w, q, http.StatusBadRequest, "bad-request", "deny", herr.Error())
		return
	}
	nurl, err := NormalizeURL(h.scheme + "://" + q.d.Dest + r.URL.RequestURI())
	if err != nil {
		h.fail(w, q, http.StatusBadRequest, "bad-request", "error", "request URL does not parse")
		return
	}
	q.url, q.d.URL = nurl, nurl

	// Policy, before anything is read or numbered: a refused request has no
	// journal key, so a re-run refused differently still numbers alike.
	if !h.st.limiter.allow(g.opts.Clock.Now()) {
		w.Header().Set("Retry-After", "1")
		h.fail(w, q, http.StatusTooManyRequests, "rate-limited", "rate-limited", "request rate limit")
		return
	}
	if !run.Policy.allowed(host, port) {
		h.fail(w, q, http.StatusForbidden, "denied", "deny", "destination not in the allowlist")
		return
	}
	ip, named, err := g.resolve(r.Context(), host)
	if err != nil {
		h.fail(w, q, http.StatusBadGateway, "resolve", "error", "cannot resolve "+host)
		return
	}
	if why := run.Policy.denyReason(ip); !named && why != "" {
		h.fail(w, q, http.StatusForbidden, "denied", "deny", "destination resolves into a denied network ("+why+")")
		return
	}
	q.upstream = netip.AddrPortFrom(ip, port)

	q.out, q.sub, err = substituteSecrets(r.Context(), g.opts.Secrets, run.Tenant, r.Header, host, port)
	if err != nil {
		h.fail(w, q, http.StatusForbidden, "denied", "deny", err.Error())
		return
	}
	q.d.Secrets = q.sub.names
	removeHopByHop(q.out)

	if r.Header.Get("Upgrade") != "" {
		leave() // a switched protocol is a stream, not a request in flight
		h.upgrade(w, q)
		return
	}

	// Room for the response this request may buffer, then its body as it
	// is read: all before anything is recorded or sent.
	respRoom := int64(unjournaledBuffer + 1)
	if g.opts.Journal != nil {
		respRoom = g.opts.MaxJournaledBody + 1
	}
	if !h.st.reserve(respRoom, g.opts.MaxBufferedPerSandbox) {
		h.bufferFull(w, q)
		return
	}
	var charged int64
	defer func() { h.st.release(respRoom + charged) }()
	q.body, err = io.ReadAll(budgetReader{http.MaxBytesReader(w, r.Body, g.opts.MaxRequestBody), h.st, g.opts.MaxBufferedPerSandbox, &charged})
	if errors.Is(err, errBufferFull) {
		h.bufferFull(w, q)
		return
	}
	if err != nil {
		h.fail(w, q, http.StatusRequestEntityTooLarge, "bad-request", "deny", "request body too large or unreadable")
		return
	}
	sum := sha256.Sum256(q.body)
	q.bodySum = hex.EncodeToString(sum[:])

	if g.opts.Journal == nil {
		h.forward(w, q, nil, 0)
		return
	}
	h.journaled(w, q)
}

// journaled runs a request through the journal: replay, reconcile, refuse
// a divergence, or record the intent and forward.
func (h *handler) journaled(w http.ResponseWriter, q *request) {
	g, j, r := h.g, h.g.opts.Journal, q.r
	ctx := context.WithoutCancel(r.Context())

	// Number the request among identical ones, and among those to the same
	// method and URL, since the cut.
	h.st.mu.Lock()
	for h.st.held != nil {
		// A cut is in progress: this request belongs to the run it starts.
		ch := h.st.held
		h.st.mu.Unlock()
		select {
		case <-ch:
		case <-r.Context().Done():
			return
		}
		h.st.mu.Lock()
	}
	h.st.active++
	defer func() {
		h.st.mu.Lock()
		h.st.active--
		h.st.mu.Unlock()
	}()
	q.run = h.st.run
	cid := contentID(q.run.ID, r.Method, q.url, q.bodySum)
	h.st.counts[cid]++
	occ := h.st.counts[cid]
	sid := r.Method + " " + q.url
	h.st.slots[sid]++
	sl := slot{Run: q.run.ID, Method: r.Method, URL: q.url, Occurrence: h.st.slots[sid]}
	h.st.mu.Unlock()

	k := Key{Sandbox: h.sandbox, Run: q.run.ID, Method: r.Method, URL: q.url, BodySHA256: q.bodySum, Occurrence: occ}
	q.d.Key = k.ID()
	wr := Writer{Tenant: q.run.Tenant, Sandbox: h.sandbox, Epoch: q.run.Epoch}
	mode := q.run.Policy.mode(r.Method, q.host, q.port)

	// Claim the key in this process; wait if a previous incarnation of the
	// run is still forwarding it.
	for {
		g.mu.Lock()
		ch, busy := g.inflight[q.d.Key]
		if !busy {
			ch = make(chan struct{})
			g.inflight[q.d.Key] = ch
		}
		g.mu.Unlock()
		if !busy {
			defer func() {
				g.mu.Lock()
				delete(g.inflight, q.d.Key)
				g.mu.Unlock()
				close(ch)
			}()
			break
		}
		h.g.opts.Failpoints.Eval(FPWaitInFlight) // counted: tests see the wait
		select {
		case <-ch:
		case <-r.Context().Done():
			return
		}
	}

	e, found, err := j.Lookup(ctx, k)
	if err != nil {
		h.journalError(w, q, err)
		return
	}
	attempt := 1
	switch {
	case found && e.Outcome != nil:
		if e.Outcome.BodyTruncated {
			if mode == ModeReplaySafe {
				h.forward(w, q, nil, 0) // safe to fetch again; not journaled twice
				return
			}
			h.fail(w, q, http.StatusBadGateway, "body-not-journaled", "error",
				fmt.Sprintf("recorded response body (%d bytes) exceeds the journal limit; it cannot be replayed", e.Outcome.BodySize))
			return
		}
		h.replay(w, q, e.Outcome)
		return
	case found && mode == ModeAtMostOnce:
		err := j.RecordReconcile(ctx, wr, ReconcilePayload{Key: k.ID(), Run: q.run.ID, Method: r.Method, URL: q.url,
			Reason: "intent recorded without outcome; at-most-once: not re-sent"})
		if err != nil {
			h.journalError(w, q, err)
			return
		}
		h.fail(w, q, http.StatusBadGateway, "needs-reconciliation", "reconcile",
			"an earlier attempt of this request may have reached the destination; at-most-once: not re-sent, marked for reconciliation")
		return
	case found:
		attempt = e.Attempts + 1 // idempotent-key or replay-safe: re-send
	default:
		se, ok, err := j.lookupSlot(ctx, h.sandbox, sl)
		if err != nil {
			h.journalError(w, q, err)
			return
		}
		if ok && se.Intent != nil && se.Intent.Key != k.ID() {
			pol := q.run.Policy.divergence()
			err := j.RecordDivergence(ctx, wr, DivergencePayload{Key: k.ID(), Run: q.run.ID, Method: r.Method, URL: q.url,
				Slot: sl.Occurrence, RecordedKey: se.Intent.Key, RecordedBodySHA256: se.Intent.BodySHA256,
				BodySHA256: q.bodySum, Policy: pol})
			if err != nil {
				h.journalError(w, q, err)
				return
			}
			reason := fmt.Sprintf("re-run request #%d to %s %s differs from the recorded one (body %.12s, recorded %.12s)",
				sl.Occurrence, r.Method, q.url, q.bodySum, se.Intent.BodySHA256)
			if pol == DivergenceFail {
				h.fail(w, q, http.StatusConflict, "divergence", "divergence", reason+"; policy fail")
				return
			}
			d := q.d
			d.Kind, d.Reason = "divergence", reason+"; policy forward"
			g.report(q.run, d)
		}
	}

	intent := IntentPayload{Key: k.ID(), Run: q.run.ID, Method: r.Method, URL: q.url, BodySHA256: q.bodySum,
		BodySize: int64(len(q.body)), Occurrence: occ, Slot: sl.Occurrence, Attempt: attempt, Mode: mode,
		Headers: journalHeaders(r.Header)}
	if mode == ModeIdempotentKey {
		intent.IdemKey = k.IdempotencyKey()
		q.out.Set("Idempotency-Key", intent.IdemKey)
	}
	if err := recordIntent(ctx, j, wr, intent); err != nil {
		h.journalError(w, q, err)
		return
	}
	h.forward(w, q, &wr, attempt)
}

// intentRetryFor bounds how long a request waits for the journal to take
// its intent when the log fails for a while (a transient store error must
// not become a failed effect the agent sees: nothing was sent yet).
const intentRetryFor = 10 * time.Second

// recordIntent is Journal.RecordIntent retried with backoff for up to
// intentRetryFor while the log fails with an error that may pass (not
// fenced, conflicting or invalid). A retried append of the same intent is a
// no-op if an earlier attempt landed after all (event ids derive from the
// key and attempt).
func recordIntent(ctx context.Context, j *Journal, wr Writer, p IntentPayload) error {
	deadline := time.Now().Add(intentRetryFor)
	wait := 50 * time.Millisecond
	for {
		err := j.RecordIntent(ctx, wr, p)
		if err == nil || errdefs.IsFenced(err) || errdefs.IsConflict(err) || errdefs.IsInvalidArgument(err) ||
			errdefs.IsDataLoss(err) || ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// forward sends q upstream and answers the client. With wr set, the outcome
// is recorded (durably) before the client sees it. The crash points are
// evaluated with the journal off too, so the negative control meets the same
// crashes.
func (h *handler) forward(w http.ResponseWriter, q *request, wr *Writer, attempt int) {
	g := h.g
	h.st.mu.Lock()
	upBW := h.st.bw
	h.st.mu.Unlock()
	if err := upBW.wait(q.r.Context(), len(q.body)); err != nil {
		return // the client went away while its upload waited for bandwidth
	}
	h.crashpoint(FPBeforeSend)
	if f := g.opts.Fence; f != nil {
		if err := f(q.r.Context()); err != nil {
			h.journalError(w, q, err)
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(q.r.Context()), upstreamTimeout)
	defer cancel()
	ctx = context.WithValue(ctx, dialTargetKey{}, q.upstream)
	start := time.Now()
	out := OutcomePayload{Key: q.d.Key, Run: q.run.ID, Attempt: attempt}
	req, err := http.NewRequestWithContext(ctx, q.r.Method, h.scheme+"://"+joinHostPort(q.host, q.port)+q.r.URL.RequestURI(), bytes.NewReader(q.body))
	var resp *http.Response
	if err == nil {
		req.Host = q.r.Host
		req.Header = q.out
		req.ContentLength = int64(len(q.body))
		if len(q.body) == 0 {
			req.Body = http.NoBody
		}
		resp, err = g.transport.RoundTrip(req)
	}
	var rest io.Reader // unjournaled tail of a body over the limit
	var buffered int64 // response body bytes read so far
	if err != nil {
		out.Status = http.StatusBadGateway
		out.Error = string(q.sub.redact([]byte("upstream: " + err.Error())))
	} else {
		defer resp.Body.Close()
		out.Status = resp.StatusCode
		out.Headers = resp.Header.Clone()
		removeHopByHop(out.Headers)
		q.sub.redactHeader(out.Headers)
		limit := g.opts.MaxJournaledBody
		if wr == nil {
			limit = unjournaledBuffer // unjournaled: buffer a little, stream the rest
		}
		buf, rerr := io.ReadAll(io.LimitReader(resp.Body, limit+1))
		buffered = int64(len(buf))
		switch {
		case rerr != nil:
			out.Status, out.Error, out.Headers = http.StatusBadGateway, "upstream body: "+rerr.Error(), nil
		case int64(len(buf)) > limit:
			// Recorded as its announced size (-1 when chunked) only.
			out.BodyTruncated, out.BodySize = true, resp.ContentLength
			red := q.sub.redact(buf)
			if len(red) != len(buf) && out.Headers != nil {
				out.Headers.Del("Content-Length") // no longer true
			}
			rest = io.MultiReader(bytes.NewReader(red), resp.Body)
		default:
			out.Body = q.sub.redact(buf)
			out.BodySize = int64(len(out.Body))
			if len(out.Body) != len(buf) && out.Headers != nil {
				// Redaction changed the length the upstream announced.
				out.Headers.Set("Content-Length", strconv.Itoa(len(out.Body)))
			}
			s := sha256.Sum256(out.Body)
			out.BodySHA256 = hex.EncodeToString(s[:])
		}
	}
	out.DurationNS = time.Since(start).Nanoseconds()
	out.RequestBytes, out.ResponseBytes = int64(len(q.body)), int64(len(out.Body))
	if out.BodyTruncated {
		out.ResponseBytes = max(out.BodySize, buffered)
	}

	h.crashpoint(FPAfterSend)
	if wr != nil {
		rec := out
		if rec.BodyTruncated {
			rec.Body = nil
		}
		if err := g.opts.Journal.RecordOutcome(context.WithoutCancel(q.r.Context()), *wr, rec); err != nil {
			// The effect happened; the client gets its answer. A re-run
			// finds the intent without outcome and follows the mode.
			g.log.Error("record outcome", "sandbox", h.sandbox, "key", q.d.Key, "err", err)
		}
	}
	h.crashpoint(FPAfterOutcome)

	d := q.d
	d.Kind, d.Status, d.Reason = "forward", out.Status, out.Error
	d.BytesOut, d.BytesIn = out.RequestBytes, out.ResponseBytes
	d.Journaled = wr != nil
	g.report(q.run, d)
	if out.Error != "" {
		writeGatewayError(w, out.Status, "upstream", out.Error)
		return
	}
	copyHeader(w.Header(), out.Headers)
	h.st.mu.Lock()
	bw := h.st.bw
	h.st.mu.Unlock()
	sw := shapedWriter{q.r.Context(), w, bw}
	if rest != nil {
		w.WriteHeader(out.Status)
		io.Copy(sw, rest)
		return
	}
	w.WriteHeader(out.Status)
	sw.Write(out.Body)
}

// replay answers from a recorded outcome; the upstream is not contacted.
func (h *handler) replay(w http.ResponseWriter, q *request, o *OutcomePayload) {
	d := q.d
	d.Kind, d.Status = "replay", o.Status
	h.g.report(q.run, d)
	if o.Error != "" {
		w.Header().Set(HeaderReplayed, "true")
		writeGatewayError(w, o.Status, "upstream", o.Error)
		return
	}
	copyHeader(w.Header(), o.Headers)
	w.Header().Set(HeaderReplayed, "true")
	w.WriteHeader(o.Status)
	w.Write(o.Body)
}

// upgrade proxies a request asking for a protocol switch (WebSocket) as a
// stream: not journaled.
func (h *handler) upgrade(w http.ResponseWriter, q *request) {
	d := q.d
	d.Kind, d.Reason = "stream", "upgrade "+q.r.Header.Get("Upgrade")+": proxied as a stream, not journaled"
	h.g.report(q.run, d)
	hdr := q.out.Clone()
	hdr.Set("Connection", "Upgrade")
	hdr.Set("Upgrade", q.r.Header.Get("Upgrade"))
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out = pr.Out.WithContext(context.WithValue(pr.Out.Context(), dialTargetKey{}, q.upstream))
			pr.Out.URL.Scheme, pr.Out.URL.Host = h.scheme, joinHostPort(q.host, q.port)
			pr.Out.Host = q.r.Host
			pr.Out.Header = hdr
		},
		Transport: h.g.transport,
	}
	rp.ServeHTTP(w, q.r)
}

// crashpoint evaluates a failpoint; when it fires the gateway behaves as a
// crashed process from then on.
func (h *handler) crashpoint(name string) {
	if err := h.g.opts.Failpoints.EvalFor(name, h.sandbox); err != nil {
		h.g.crashed.Store(true)
		h.g.log.Warn("failpoint fired", "point", name, "err", err)
		panic(http.ErrAbortHandler)
	}
}

// bufferFull answers a request that does not fit its sandbox's buffer
// budget (Options.MaxBufferedPerSandbox); nothing was recorded or sent.
func (h *handler) bufferFull(w http.ResponseWriter, q *request) {
	w.Header().Set("Retry-After", "1")
	h.fail(w, q, http.StatusServiceUnavailable, "busy", "rate-limited",
		fmt.Sprintf("the sandbox's requests buffer %d bytes already (at most %d); nothing was sent", h.st.bufferedNow(), h.g.opts.MaxBufferedPerSandbox))
}

func (h *handler) journalError(w http.ResponseWriter, q *request, err error) {
	if errors.Is(err, errdefs.ErrFenced) {
		h.fail(w, q, http.StatusServiceUnavailable, "fenced", "fenced",
			"this node no longer holds the sandbox's lease; nothing was forwarded")
		return
	}
	h.g.log.Error("effect journal", "sandbox", h.sandbox, "key", q.d.Key, "err", err)
	h.fail(w, q, http.StatusServiceUnavailable, "journal", "error", "effect journal unavailable; nothing was forwarded")
}

// fail answers with a gateway-made error and reports the decision.
func (h *handler) fail(w http.ResponseWriter, q *request, status int, errKind, kind, reason string) {
	d := q.d
	d.Kind, d.Status, d.Reason = kind, status, reason
	h.g.report(q.run, d)
	writeGatewayError(w, status, errKind, reason)
}

func writeGatewayError(w http.ResponseWriter, status int, kind, msg string) {
	w.Header().Set(HeaderError, kind)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	fmt.Fprintf(w, "amber gateway: %s\n", msg)
}

// resolve returns host's address and whether the operator named it
// (Options.Hosts: exempt from the denied networks).
func (g *Gateway) resolve(ctx context.Context, host string) (netip.Addr, bool, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap(), false, nil
	}
	if a, ok := g.opts.Hosts[strings.ToLower(host)]; ok {
		return a.Unmap(), true, nil
	}
	ips, err := g.opts.Resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.Addr{}, false, err
	}
	if len(ips) == 0 {
		return netip.Addr{}, false, errdefs.NotFoundf("no address for %s", host)
	}
	return ips[0].Unmap(), false, nil
}

var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopByHop(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
}

// journalHeaders is the request's header set as the journal keeps it: as the
// sandbox sent it (placeholders, never values), without hop-by-hop fields.
func journalHeaders(h http.Header) http.Header {
	c := h.Clone()
	removeHopByHop(c)
	if len(c) == 0 {
		return nil
	}
	return c
}

func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = append([]string(nil), vs...)
	}
}
