package server

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/internal/obs/logging"
)

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	return enc.Encode(v)
}

// errBody is the wire form of err. An internal error (status 500: no
// kind, or data loss) says only "internal error": its text names stores,
// paths and queries that are the operator's, not the tenant's; the detail
// is in the daemon's log under the request's id (wrap logs every 5xx, and
// writeError a 500 outside a route). Every other kind keeps its message:
// clients and SDKs act on them.
func errBody(err error) api.ErrorBody {
	if internal(err) {
		return api.ErrorBody{Kind: errdefs.Kind(err), Message: "internal error"}
	}
	return api.ErrorBody{Kind: errdefs.Kind(err), Message: err.Error()}
}

func internal(err error) bool { return errdefs.HTTPStatus(err) == http.StatusInternalServerError }

// writeError writes err with the status of its kind; an internal error
// carries the request's id (X-Request-Id, set by wrap; made here, and the
// detail logged, when the call came by no route).
func writeError(w http.ResponseWriter, err error) {
	body := errBody(err)
	if internal(err) {
		rid := w.Header().Get("X-Request-Id")
		if rid == "" {
			rid = newRequestID()
			w.Header().Set("X-Request-Id", rid)
			slog.Error("request failed", logging.RequestID, rid, "err", err)
		}
		body.RequestID = rid
	}
	writeJSON(w, errdefs.HTTPStatus(err), api.Error{Error: body})
}

func errNotFoundRoute(r *http.Request) error {
	return errdefs.NotFoundf("no route %s %s (see GET /v1/openapi.json)", r.Method, r.URL.Path)
}

// readJSON decodes the request body into v, refusing unknown fields and
// anything after the one JSON value. The body is bounded by the
// middleware (Limits.MaxBodyBytes); a larger one is a 413 naming the limit.
func readJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errdefs.InvalidArgumentf("request body is empty; expected JSON")
		}
		return bodyError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err != nil {
			return bodyError(err)
		}
		return errdefs.InvalidArgumentf("request body: more than one JSON value")
	}
	return nil
}

// queryBool parses an optional boolean query parameter.
func queryBool(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.InvalidArgumentf("query parameter %s=%q is not a boolean", name, v)
	}
	return b, nil
}

// queryInt parses an optional non-negative integer query parameter.
func queryInt(r *http.Request, name string, def int64) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, errdefs.InvalidArgumentf("query parameter %s=%q is not a non-negative integer", name, v)
	}
	return n, nil
}

func requireQuery(r *http.Request, name string) (string, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return "", errdefs.InvalidArgumentf("query parameter %s is required", name)
	}
	return v, nil
}

// parseMode parses an octal file mode ("0644"); def when empty.
func parseMode(s string, def uint32) (uint32, error) {
	if s == "" {
		return def, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, errdefs.InvalidArgumentf("mode %q is not an octal permission like 0644", s)
	}
	return uint32(m), nil
}
