// Package e2b is E2B's control plane, served by the daemon so that the
// official e2b SDK (npm e2b@2.51.0, the paths and bodies of its
// OpenAPI-generated client) runs unchanged against Amber: create (v2),
// get, list (v2, by metadata and state, with pagination), kill, timeout,
// pause, connect (resume), metrics. Its in-sandbox half is envd
// (internal/edge/e2b/envd), which the server routes by host or by the
// E2b-Sandbox-Id header.
//
// The mapping onto Amber: an E2B sandbox is an Amber sandbox of the key's
// tenant; its metadata and timeout are Amber's (engine/ttl.go), E2B's
// "autoPause" is on_timeout pause; kill is destroy; pause is a checkpoint
// and stop (Engine.Pause) and connect a resume from it (exact memory);
// "running" is running and "paused" is Engine.Paused. Nothing is kept
// beside the sandbox's row.
//
// Keys: the SDK sends its key as X-API-KEY. An Amber key is accepted as
// it is, or as its E2B-form alias "e2b_" + the hex of the key's bytes
// (Alias; `amber key e2b`), which matches the SDKs' "e2b_<hex>" check. The
// sandbox's envdAccessToken is the caller's Amber key: envd authorizes
// with it (envd.KeyAuthorizer).
package e2b

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/amber-run/amber/core/clock"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/metadata"
	"github.com/amber-run/amber/internal/engine"
)

// Keys is what the control plane reads of the metadata store.
type Keys interface {
	KeyByHash(ctx context.Context, hash string) (metadata.APIKey, error)
}

// Options configure Handler.
type Options struct {
	Engine *engine.Engine
	Keys   Keys
	Clock  clock.Clock
	Logger *slog.Logger
	// Domain is the sandboxes' domain the SDK builds hosts under
	// (<port>-<id>.<Domain>, Sandbox.getHost), the answers' "domain".
	Domain string
	// Templates maps E2B template names to Amber's (default: "base" is
	// python if the catalog has it, else minimal).
	Templates map[string]string
}

// DefaultTimeout is a sandbox's timeout when a create names none (E2B's).
const DefaultTimeout = 300 * time.Second

// Alias is the E2B-form alias of an Amber key: "e2b_" and the hex of its
// bytes.
func Alias(key string) string { return "e2b_" + hex.EncodeToString([]byte(key)) }

// keyOf returns the Amber key an X-API-KEY value holds (an alias, or the
// key itself).
func keyOf(v string) string {
	v = strings.TrimSpace(v)
	if rest, ok := strings.CutPrefix(v, "e2b_"); ok {
		if b, err := hex.DecodeString(rest); err == nil {
			return string(b)
		}
	}
	return v
}

// Handler serves the control plane at the paths of E2B's API (the
// server mounts it under a prefix, stripped).
func Handler(o Options) http.Handler {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	h := &handler{o: o}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v2/sandboxes", h.wrap(metadata.ScopeWrite, h.create))
	mux.HandleFunc("POST /sandboxes", h.wrap(metadata.ScopeWrite, h.create))
	mux.HandleFunc("GET /v2/sandboxes", h.wrap(metadata.ScopeRead, h.list))
	mux.HandleFunc("GET /sandboxes", h.wrap(metadata.ScopeRead, h.list))
	mux.HandleFunc("GET /sandboxes/{id}", h.wrap(metadata.ScopeRead, h.get))
	mux.HandleFunc("DELETE /sandboxes/{id}", h.wrap(metadata.ScopeWrite, h.kill))
	mux.HandleFunc("POST /sandboxes/{id}/timeout", h.wrap(metadata.ScopeWrite, h.setTimeout))
	mux.HandleFunc("POST /sandboxes/{id}/refreshes", h.wrap(metadata.ScopeWrite, h.refresh))
	mux.HandleFunc("POST /sandboxes/{id}/pause", h.wrap(metadata.ScopeWrite, h.pause))
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", h.wrap(metadata.ScopeWrite, h.connect))
	mux.HandleFunc("POST /sandboxes/{id}/connect", h.wrap(metadata.ScopeWrite, h.connect))
	mux.HandleFunc("POST /sandboxes/{id}/resume", h.wrap(metadata.ScopeWrite, h.connect))
	mux.HandleFunc("GET /sandboxes/{id}/metrics", h.wrap(metadata.ScopeRead, h.metrics))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, errdefs.NotImplementedf("%s %s is not part of Amber's E2B surface", r.Method, r.URL.Path))
	})
	return mux
}

type handler struct{ o Options }

// call is an authenticated request: the tenant and the Amber key.
type call struct {
	tenant, key string
}

func (h *handler) wrap(scope metadata.Scope, f func(w http.ResponseWriter, r *http.Request, c call) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := h.auth(r, scope)
		if err == nil {
			if scope == metadata.ScopeRead {
				r = r.WithContext(engine.WithoutResume(r.Context()))
			}
			err = f(w, r, c)
		}
		if err != nil {
			if errdefs.HTTPStatus(err) >= 500 {
				h.o.Logger.Warn("e2b call failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			writeErr(w, err)
		}
	}
}

// auth finds the key of X-API-KEY (or a Bearer Authorization) and checks
// it has scope.
func (h *handler) auth(r *http.Request, scope metadata.Scope) (call, error) {
	v := r.Header.Get("X-API-KEY")
	if v == "" {
		if s, tok, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(s, "Bearer") {
			v = tok
		}
	}
	if v == "" {
		return call{}, fmt.Errorf("missing X-API-KEY (an Amber key, or its e2b_ alias: `amber key e2b`): %w", errdefs.ErrUnauthenticated)
	}
	key := keyOf(v)
	k, err := h.o.Keys.KeyByHash(r.Context(), metadata.HashKey(key))
	if errdefs.IsNotFound(err) {
		return call{}, fmt.Errorf("the API key is not valid: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		return call{}, err
	}
	if err := k.Usable(h.o.Clock.Now()); err != nil {
		return call{}, err
	}
	if !k.Has(scope) {
		return call{}, errdefs.PermissionDeniedf("%s %s needs a key with scope %s", r.Method, r.URL.Path, scope)
	}
	return call{tenant: k.Tenant, key: key}, nil
}

// errorBody is E2B's error: {code, message}.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeErr(w http.ResponseWriter, err error) {
	code := errdefs.HTTPStatus(err)
	msg := err.Error()
	if code >= 500 && !errors.Is(err, errdefs.ErrUnavailable) && !errors.Is(err, errdefs.ErrNotImplemented) {
		msg = "internal error"
	}
	writeJSON(w, code, errorBody{Code: code, Message: msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// readBody decodes an optional JSON body into v (unknown fields are
// ignored: the SDK sends fields Amber does not use).
func readBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err := dec.Decode(v); err != nil && !errors.Is(err, errEOF) {
		return errdefs.InvalidArgumentf("request body: %v", err)
	}
	return nil
}
