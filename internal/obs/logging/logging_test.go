package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func decode(t *testing.T, b *bytes.Buffer) map[string]any {
	t.Helper()
	var m map[string]any
	line := b.String()
	b.Reset()
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		t.Fatalf("not one JSON line: %v\n%s", err, line)
	}
	return m
}

func TestContextIDsReachTheLine(t *testing.T) {
	var b bytes.Buffer
	lg, err := New(&b, "json", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := With(context.Background(), RequestID, "req-1", SandboxID, "sbx-1")
	ctx = With(ctx, TenantID, "acme", SandboxID, "sbx-2") // a later value replaces
	lg.InfoContext(ctx, "hello")
	m := decode(t, &b)
	if m[RequestID] != "req-1" || m[TenantID] != "acme" || m[SandboxID] != "sbx-2" {
		t.Fatalf("line %v", m)
	}

	// Fields the logger or the line has already are not repeated.
	lg.With(SandboxID, "sbx-logger").InfoContext(ctx, "x", TenantID, "line")
	line := b.String()
	if strings.Count(line, `"`+SandboxID+`"`) != 1 || strings.Count(line, `"`+TenantID+`"`) != 1 {
		t.Fatalf("repeated field: %s", line)
	}
	m = decode(t, &b)
	if m[SandboxID] != "sbx-logger" || m[TenantID] != "line" || m[RequestID] != "req-1" {
		t.Fatalf("line %v", m)
	}

	// Without a context nothing is added.
	lg.Info("plain")
	if m = decode(t, &b); m[RequestID] != nil {
		t.Fatalf("line without context has %v", m)
	}
}

func TestTraceIDOfTheSpanInContext(t *testing.T) {
	var b bytes.Buffer
	lg, _ := New(&b, "json", nil)
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid}))
	lg.InfoContext(ctx, "traced")
	m := decode(t, &b)
	if m[TraceID] != tid.String() || m[SpanID] != sid.String() {
		t.Fatalf("line %v", m)
	}
}

func TestFormats(t *testing.T) {
	var b bytes.Buffer
	lg, err := New(&b, "text", nil)
	if err != nil {
		t.Fatal(err)
	}
	lg.InfoContext(With(context.Background(), RequestID, "req-9"), "hi")
	if !strings.Contains(b.String(), "request_id=req-9") || strings.HasPrefix(b.String(), "{") {
		t.Fatalf("text line %q", b.String())
	}
	if _, err := New(&b, "yaml", nil); err == nil || !strings.Contains(err.Error(), "text or json") {
		t.Fatalf("format yaml: %v", err)
	}
}
