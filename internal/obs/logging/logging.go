// Package logging builds the daemon's log/slog logger and carries the ids
// every log line about a request should have.
//
// The field names are fixed here, once: request_id, tenant_id, sandbox_id,
// checkpoint_id, session_id, and trace_id / span_id when the line is
// logged inside a traced span. The API middleware puts the request's ids
// into its context (With); whoever logs with that context
// (lg.InfoContext(ctx, …)) gets them on the line without passing them
// along by hand, engine calls included. A field the logger or the line
// already has is not repeated.
//
// Two formats: text (slog's key=value, the default, for a terminal) and
// json (one object per line, for a log pipeline).
package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"

	"go.opentelemetry.io/otel/trace"
)

// Field names.
const (
	RequestID    = "request_id"
	TenantID     = "tenant_id"
	SandboxID    = "sandbox_id"
	CheckpointID = "checkpoint_id"
	SessionID    = "session_id"
	TraceID      = "trace_id"
	SpanID       = "span_id"
)

// Formats New accepts.
var Formats = []string{"text", "json"}

// New returns a logger writing lines of format ("text" or "json") at level
// and above to w, with the context's ids added (Handler).
func New(w io.Writer, format string, level slog.Leveler) (*slog.Logger, error) {
	o := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch format {
	case "text", "":
		h = slog.NewTextHandler(w, o)
	case "json":
		h = slog.NewJSONHandler(w, o)
	default:
		return nil, fmt.Errorf("log format %q: want text or json", format)
	}
	return slog.New(NewHandler(h)), nil
}

type ctxKey struct{}

// With returns ctx carrying the ids in attrs (key-value pairs as in
// slog.Logger.With) in addition to those it carries; a later value for a
// key replaces the earlier.
func With(ctx context.Context, args ...any) context.Context {
	prev, _ := ctx.Value(ctxKey{}).([]slog.Attr)
	add := slog.Group("", args...).Value.Group()
	out := make([]slog.Attr, 0, len(prev)+len(add))
	for _, a := range prev {
		if !slices.ContainsFunc(add, func(b slog.Attr) bool { return b.Key == a.Key }) {
			out = append(out, a)
		}
	}
	return context.WithValue(ctx, ctxKey{}, append(out, add...))
}

// Attrs returns the ids ctx carries (With).
func Attrs(ctx context.Context) []slog.Attr {
	a, _ := ctx.Value(ctxKey{}).([]slog.Attr)
	return a
}

// Handler adds to each record the ids its context carries and the trace
// and span id of the span in it, skipping the fields the logger (With) or
// the record already has.
type Handler struct {
	inner slog.Handler
	have  []string // keys added by WithAttrs
	group bool     // a group is open: the logger's keys no longer clash
}

// NewHandler wraps inner.
func NewHandler(inner slog.Handler) *Handler { return &Handler{inner: inner} }

// Enabled implements slog.Handler.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

// WithAttrs implements slog.Handler.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	h2 := *h
	h2.inner = h.inner.WithAttrs(as)
	if !h.group {
		h2.have = slices.Clip(h.have)
		for _, a := range as {
			h2.have = append(h2.have, a.Key)
		}
	}
	return &h2
}

// WithGroup implements slog.Handler.
func (h *Handler) WithGroup(name string) slog.Handler {
	h2 := *h
	h2.inner = h.inner.WithGroup(name)
	h2.group = true
	return &h2
}

// Handle implements slog.Handler.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if ctx == nil {
		return h.inner.Handle(ctx, r)
	}
	extra := Attrs(ctx)
	sc := trace.SpanContextFromContext(ctx)
	if len(extra) == 0 && !sc.IsValid() {
		return h.inner.Handle(ctx, r)
	}
	present := func(key string) bool {
		if slices.Contains(h.have, key) {
			return true
		}
		found := false
		r.Attrs(func(a slog.Attr) bool {
			found = a.Key == key
			return !found
		})
		return found
	}
	var add []slog.Attr
	for _, a := range extra {
		if !present(a.Key) {
			add = append(add, a)
		}
	}
	if sc.IsValid() {
		if !present(TraceID) {
			add = append(add, slog.String(TraceID, sc.TraceID().String()))
		}
		if !present(SpanID) {
			add = append(add, slog.String(SpanID, sc.SpanID().String()))
		}
	}
	if len(add) > 0 {
		r = r.Clone()
		r.AddAttrs(add...)
	}
	return h.inner.Handle(ctx, r)
}
