package server

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"github.com/amber-run/amber/lib/httpx"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/obs/logging"
	"github.com/amber-run/amber/internal/obs/tracing"
)

// requestID returns the client's X-Request-Id when it is sane, else a new one.
func requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 64 && strings.Trim(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == "" {
		return id
	}
	return newRequestID()
}

func newRequestID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "req-" + hex.EncodeToString(b)
}

// pathIDs returns the log fields and span attributes of the ids in r's
// path: {id} is a sandbox under /v1/sandboxes and a checkpoint under
// /v1/checkpoints.
func pathIDs(r *http.Request) ([]any, []attribute.KeyValue) {
	id := r.PathValue("id")
	switch {
	case id == "":
		return nil, nil
	case strings.HasPrefix(r.URL.Path, "/v1/checkpoints/"):
		return []any{logging.CheckpointID, id}, []attribute.KeyValue{tracing.CheckpointID.String(id)}
	case strings.HasPrefix(r.URL.Path, "/v1/nodes/"):
		return []any{"node", id}, nil
	default:
		return []any{logging.SandboxID, id}, []attribute.KeyValue{tracing.SandboxID.String(id)}
	}
}

// wrap adds request ids, a trace span, access logging, panic recovery and
// authentication around a route's handler. The request's context carries
// the span and the ids (logging.With), so the engine's spans are children
// of the request's and its log lines name the request.
func (s *Server) wrap(rt Route) http.Handler {
	name := rt.Method + " " + rt.Path
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rid := requestID(r)
		w.Header().Set("X-Request-Id", rid)
		sw := &httpx.StatusWriter{ResponseWriter: w}
		fields, attrs := pathIDs(r)
		ctx := tracing.Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(append(attrs, semconv.HTTPRequestMethodKey.String(r.Method), semconv.HTTPRoute(rt.Path), tracing.RequestID.String(rid))...))
		fields = append([]any{logging.RequestID, rid}, fields...)
		ctx = logging.With(ctx, fields...)
		r = r.WithContext(ctx)
		lg := s.lg.With(fields...)
		c := &call{lg: lg}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					span.End()
					panic(p)
				}
				lg.ErrorContext(r.Context(), "handler panicked", "panic", p, "stack", string(debug.Stack()))
				if sw.Status == 0 {
					writeError(sw, fmt.Errorf("internal error (request %s)", rid))
				}
			}
			lvl := slog.LevelInfo
			if sw.Status >= 500 {
				lvl = slog.LevelError
			}
			c.lg.Log(r.Context(), lvl, "request", "method", r.Method, "path", r.URL.Path, "status", sw.Status,
				"took", time.Since(start).Round(time.Microsecond))
			span.SetAttributes(semconv.HTTPResponseStatusCode(sw.Status))
			if sw.Status >= 500 {
				span.SetStatus(codes.Error, http.StatusText(sw.Status))
			}
			span.End()
		}()
		if rt.Scope != Public {
			key, err := s.authorize(r, rt)
			if err != nil {
				if errdefs.HTTPStatus(err) == http.StatusUnauthorized {
					sw.Header().Set("WWW-Authenticate", `Bearer realm="amber"`)
				}
				if key.Tenant != "" {
					c.lg = lg.With(logging.TenantID, key.Tenant, "key", key.Name)
					span.SetAttributes(tracing.TenantID.String(key.Tenant))
				}
				c.lg.InfoContext(r.Context(), "request refused", "method", r.Method, "path", r.URL.Path, "err", err)
				writeError(sw, err)
				return
			}
			c.tenant, c.key = key.Tenant, key
			if !key.Has(write) {
				// A read-only key looks; it never resumes an idle sandbox
				// (engine/idle.go).
				r = r.WithContext(engine.WithoutResume(r.Context()))
			}
			c.lg = lg.With(logging.TenantID, key.Tenant, "key", key.Name)
			span.SetAttributes(tracing.TenantID.String(key.Tenant))
			r = r.WithContext(logging.With(r.Context(), logging.TenantID, key.Tenant))
			if ok, rate := s.allow(r, key.Tenant); !ok {
				if s.metrics != nil {
					s.metrics.QuotaRejected(key.Tenant, "requests_per_second")
				}
				sw.Header().Set("Retry-After", "1")
				writeError(sw, errdefs.ResourceExhaustedf("quota requests_per_second of tenant %s: more than %g requests per second", key.Tenant, rate))
				return
			}
		}
		body := s.timeBody(sw, r, rt)
		if done, err := s.forward(sw, r, rt); done || err != nil {
			if se := body.stalledErr(); se != nil && err != nil {
				err = se
			}
			if err != nil {
				if errdefs.HTTPStatus(err) >= 500 {
					c.lg.ErrorContext(r.Context(), "request failed", "err", err)
				}
				writeError(sw, err)
			}
			return
		}
		if !rt.Upload {
			s.limitBody(sw, r)
		}
		h := rt.h
		if rt.Idempotent {
			h = func(w http.ResponseWriter, r *http.Request, c *call) error { return s.idempotent(w, r, c, rt.h) }
		}
		err := h(sw, r, c)
		if se := body.stalledErr(); se != nil && err != nil {
			err = se
		}
		if s.metrics != nil {
			defer func() {
				code := sw.Status
				if code == 0 {
					code = errdefs.HTTPStatus(err)
				}
				s.metrics.Request(rt.Method+" "+rt.Path, code, time.Since(start))
			}()
		}
		if rt.Scope == write || rt.Scope == admin {
			defer s.record(r, rt, c, rid, sw, err)
		}
		if err != nil {
			span.SetAttributes(tracing.ErrorKind.String(errdefs.Kind(err)))
			if errdefs.HTTPStatus(err) >= 500 {
				span.SetStatus(codes.Error, err.Error())
			}
			if sw.Status != 0 {
				// Headers are out (a stream broke): the client sees a cut stream.
				c.lg.WarnContext(r.Context(), "error after response started", "err", err)
				return
			}
			if errdefs.HTTPStatus(err) >= 500 {
				c.lg.ErrorContext(r.Context(), "request failed", "err", err)
			}
			writeError(sw, err)
		}
	})
}

// authorize finds the key of the request's Bearer token and checks that
// it may call rt: an unknown, revoked or expired key is ErrUnauthenticated
// (401), a key without rt's scope ErrPermissionDenied (403) naming the
// scope. Whether the resource a call names belongs to the key's tenant is
// decided later, by the engine or the handler, and answered NotFound.
func (s *Server) authorize(r *http.Request, rt Route) (metadata.APIKey, error) {
	if rt.Scope != read && rt.Scope != write && rt.Scope != admin {
		return metadata.APIKey{}, fmt.Errorf("route %s %s declares no scope (server bug; refused): %w", rt.Method, rt.Path, errdefs.ErrPermissionDenied)
	}
	token, ok := httpx.Bearer(r.Header.Get("Authorization"))
	if !ok {
		return metadata.APIKey{}, fmt.Errorf("missing Authorization: Bearer <api key> (the admin key is in DATA_DIR/admin.key): %w", errdefs.ErrUnauthenticated)
	}
	k, err := s.meta.KeyByHash(r.Context(), metadata.HashKey(strings.TrimSpace(token)))
	if errdefs.IsNotFound(err) {
		return metadata.APIKey{}, fmt.Errorf("the API key is not valid: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		return metadata.APIKey{}, err
	}
	if err := k.Usable(s.clock.Now()); err != nil {
		return k, err
	}
	if !k.Has(rt.Scope) {
		return k, errdefs.PermissionDeniedf("%s %s needs an API key with scope %s; key %q of tenant %s has %s",
			rt.Method, rt.Path, rt.Scope, k.Name, k.Tenant, scopeList(k.Scopes))
	}
	return k, nil
}

func scopeList(ss []metadata.Scope) string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = string(s)
	}
	return strings.Join(names, ",")
}
