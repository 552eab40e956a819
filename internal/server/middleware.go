package server

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/meta"
)

// statusWriter remembers the status a handler wrote, for the access log.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush and EnableFullDuplex.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// requestID returns the client's X-Request-Id when it is sane, else a new one.
func requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 64 && strings.Trim(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == "" {
		return id
	}
	b := make([]byte, 8)
	rand.Read(b)
	return "req-" + hex.EncodeToString(b)
}

// wrap adds request ids, access logging, panic recovery and authentication
// around a route's handler.
func (s *Server) wrap(rt Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rid := requestID(r)
		w.Header().Set("X-Request-Id", rid)
		sw := &statusWriter{ResponseWriter: w}
		lg := s.lg.With("request_id", rid)
		if id := r.PathValue("id"); id != "" {
			lg = lg.With("sandbox", id)
		}
		c := &call{lg: lg}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				lg.Error("handler panicked", "panic", p)
				if sw.status == 0 {
					writeError(sw, fmt.Errorf("internal error (request %s)", rid))
				}
			}
			lvl := slog.LevelInfo
			if sw.status >= 500 {
				lvl = slog.LevelError
			}
			lg.Log(r.Context(), lvl, "request", "method", r.Method, "path", r.URL.Path, "status", sw.status,
				"took", time.Since(start).Round(time.Microsecond), "tenant", c.tenant)
		}()
		if rt.Scope != Public {
			key, err := s.authorize(r, rt)
			if err != nil {
				if errdefs.HTTPStatus(err) == http.StatusUnauthorized {
					sw.Header().Set("WWW-Authenticate", `Bearer realm="amber"`)
				}
				if key.Tenant != "" {
					lg = lg.With("tenant", key.Tenant, "key", key.Name)
				}
				lg.Info("request refused", "method", r.Method, "path", r.URL.Path, "err", err)
				writeError(sw, err)
				return
			}
			c.tenant, c.key = key.Tenant, key
			c.lg = lg.With("tenant", key.Tenant, "key", key.Name)
			if ok, rate := s.allow(r, key.Tenant); !ok {
				sw.Header().Set("Retry-After", "1")
				writeError(sw, errdefs.ResourceExhaustedf("quota requests_per_second of tenant %s: more than %g requests per second", key.Tenant, rate))
				return
			}
		}
		h := rt.h
		if rt.Idempotent {
			h = func(w http.ResponseWriter, r *http.Request, c *call) error { return s.idempotent(w, r, c, rt.h) }
		}
		err := h(sw, r, c)
		if s.metrics != nil {
			defer func() {
				code := sw.status
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
			if sw.status != 0 {
				// Headers are out (a stream broke): the client sees a cut stream.
				c.lg.Warn("error after response started", "err", err)
				return
			}
			if errdefs.HTTPStatus(err) >= 500 {
				c.lg.Error("request failed", "err", err)
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
func (s *Server) authorize(r *http.Request, rt Route) (meta.APIKey, error) {
	if rt.Scope != read && rt.Scope != write && rt.Scope != admin {
		return meta.APIKey{}, fmt.Errorf("route %s %s declares no scope (server bug; refused): %w", rt.Method, rt.Path, errdefs.ErrPermissionDenied)
	}
	h := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || strings.TrimSpace(token) == "" {
		return meta.APIKey{}, fmt.Errorf("missing Authorization: Bearer <api key> (the admin key is in DATA_DIR/admin.key): %w", errdefs.ErrUnauthenticated)
	}
	k, err := s.meta.KeyByHash(r.Context(), meta.HashKey(strings.TrimSpace(token)))
	if errdefs.IsNotFound(err) {
		return meta.APIKey{}, fmt.Errorf("the API key is not valid: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		return meta.APIKey{}, err
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

func scopeList(ss []meta.Scope) string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = string(s)
	}
	return strings.Join(names, ",")
}
