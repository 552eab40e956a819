package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
	"github.com/amber-run/amber/internal/edge/server"
	"github.com/amber-run/amber/internal/engine"
	"github.com/amber-run/amber/internal/engine/enginetest"
	"github.com/amber-run/amber/internal/obs/logging"
	"github.com/amber-run/amber/internal/obs/tracing"
	"github.com/amber-run/amber/internal/state/meta"
)

// syncBuffer is a log sink the server writes to from many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %v\n%s", err, l)
		}
		out = append(out, m)
	}
	return out
}

// observed is a server over a real engine whose spans go to an in-memory
// recorder and whose logs are JSON in a buffer.
type observed struct {
	c    *client.Client
	url  string
	rec  *tracetest.SpanRecorder
	logs *syncBuffer
}

func newObserved(t *testing.T) observed {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	logs := &syncBuffer{}
	lg, err := logging.New(logs, "json", nil)
	if err != nil {
		t.Fatal(err)
	}
	env := enginetest.New(t, engine.Options{Tracer: tp, Logger: lg})
	if err := env.Meta.PutKey(context.Background(), meta.APIKey{Tenant: "default", Name: "admin", Hash: meta.HashKey(testKey), Scopes: meta.AllScopes}); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(server.New(server.Options{Engine: env.Engine, Meta: env.Meta, Logger: lg, Tracer: tp, Version: "test"}))
	t.Cleanup(ts.Close)
	c, err := client.New(ts.URL, testKey)
	if err != nil {
		t.Fatal(err)
	}
	return observed{c: c, url: ts.URL, rec: rec, logs: logs}
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.Emit()
		}
	}
	return ""
}

// waitSpan returns the first ended span named name for which match is
// true. The server ends a request's span after the response is written,
// so the client can be ahead of the recorder by a moment.
func waitSpan(t *testing.T, rec *tracetest.SpanRecorder, name string, match func(sdktrace.ReadOnlySpan) bool) sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, s := range rec.Ended() {
			if s.Name() == name && (match == nil || match(s)) {
				return s
			}
		}
		if time.Now().After(deadline) {
			var names []string
			for _, s := range rec.Ended() {
				names = append(names, s.Name())
			}
			t.Fatalf("no span %q among %q", name, names)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// childOf fails unless child is a direct child of parent in the same trace.
func childOf(t *testing.T, child, parent sdktrace.ReadOnlySpan) {
	t.Helper()
	if child.SpanContext().TraceID() != parent.SpanContext().TraceID() || child.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("span %q (trace %s, parent %s) is not a child of %q (trace %s, span %s)",
			child.Name(), child.SpanContext().TraceID(), child.Parent().SpanID(),
			parent.Name(), parent.SpanContext().TraceID(), parent.SpanContext().SpanID())
	}
}

func TestTracesOfCreateExecCheckpointRestore(t *testing.T) {
	o := newObserved(t)
	ctx := ctxT(t)
	sb, err := o.c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.c.Exec(ctx, sb.ID, api.ExecRequest{Args: []string{"sh", "-c", "exit 3"}}, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	ck, err := o.c.Checkpoint(ctx, sb.ID, api.CreateCheckpointRequest{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.c.Restore(ctx, ck.ID, api.RestoreRequest{}, nil); err != nil {
		t.Fatal(err)
	}

	create := waitSpan(t, o.rec, "POST /v1/sandboxes", nil)
	if create.SpanKind() != trace.SpanKindServer || attr(create, "http.response.status_code") != "201" ||
		attr(create, string(tracing.TenantID)) != "default" || attr(create, "http.route") != "/v1/sandboxes" {
		t.Errorf("create request span: kind %v, attributes %v", create.SpanKind(), create.Attributes())
	}
	ecreate := waitSpan(t, o.rec, "engine.create", nil)
	childOf(t, ecreate, create)
	if attr(ecreate, string(tracing.SandboxID)) != sb.ID || attr(ecreate, string(tracing.Template)) != "minimal" {
		t.Errorf("engine.create attributes %v, want sandbox %s", ecreate.Attributes(), sb.ID)
	}

	exec := waitSpan(t, o.rec, "POST /v1/sandboxes/{id}/exec", nil)
	if attr(exec, string(tracing.SandboxID)) != sb.ID || attr(exec, string(tracing.TenantID)) != "default" {
		t.Errorf("exec request span attributes %v, want sandbox %s", exec.Attributes(), sb.ID)
	}
	eexec := waitSpan(t, o.rec, "engine.exec", nil)
	childOf(t, eexec, exec)
	if attr(eexec, string(tracing.ExitCode)) != "3" {
		t.Errorf("engine.exec attributes %v, want exit code 3", eexec.Attributes())
	}

	ckpt := waitSpan(t, o.rec, "POST /v1/sandboxes/{id}/checkpoints", nil)
	eckpt := waitSpan(t, o.rec, "engine.checkpoint", nil)
	childOf(t, eckpt, ckpt)
	if attr(eckpt, string(tracing.CheckpointID)) != ck.ID || attr(eckpt, string(tracing.SandboxID)) != sb.ID {
		t.Errorf("engine.checkpoint attributes %v, want checkpoint %s of %s", eckpt.Attributes(), ck.ID, sb.ID)
	}

	restore := waitSpan(t, o.rec, "POST /v1/checkpoints/{id}/restore", nil)
	if attr(restore, string(tracing.CheckpointID)) != ck.ID || attr(restore, string(tracing.SandboxID)) != "" {
		t.Errorf("restore request span attributes %v: {id} is checkpoint %s, not a sandbox", restore.Attributes(), ck.ID)
	}
	childOf(t, waitSpan(t, o.rec, "engine.restore", nil), restore)

	// Four API calls, four traces: no engine span leaked into another's.
	traces := map[trace.TraceID]bool{}
	for _, s := range []sdktrace.ReadOnlySpan{create, exec, ckpt, restore} {
		traces[s.SpanContext().TraceID()] = true
	}
	if len(traces) != 4 {
		t.Errorf("the four calls share traces: %d distinct", len(traces))
	}

	// The JSON log: the access line of the exec call names its request,
	// tenant, sandbox and trace; the engine's line about the new sandbox
	// names the request that made it.
	var sawAccess, sawEngine bool
	for _, l := range o.logs.lines(t) {
		if l["msg"] == "request" && l["path"] == "/v1/sandboxes/"+sb.ID+"/exec" {
			sawAccess = true
			if l[logging.TenantID] != "default" || l[logging.SandboxID] != sb.ID || l[logging.TraceID] != exec.SpanContext().TraceID().String() ||
				!strings.HasPrefix(l[logging.RequestID].(string), "req-") || l["status"] != float64(200) {
				t.Errorf("access log line of exec: %v", l)
			}
		}
		if l["msg"] == "sandbox created" && l["component"] == nil && l[logging.SandboxID] == sb.ID && l["from_pool"] == nil {
			sawEngine = true
			if l[logging.RequestID] == nil || l[logging.TenantID] != "default" || l[logging.TraceID] != create.SpanContext().TraceID().String() {
				t.Errorf("engine log line of create: %v", l)
			}
		}
	}
	if !sawAccess || !sawEngine {
		t.Errorf("log has the exec access line: %v, the engine's create line: %v\n%s", sawAccess, sawEngine, o.logs.b.String())
	}
}

// A caller's W3C traceparent makes the API call's span a child of the
// caller's span, so an agent framework's trace continues into Amber.
func TestTraceparentIsHonoured(t *testing.T) {
	o := newObserved(t)
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, _ := http.NewRequest("GET", o.url+"/v1/sandboxes", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s := waitSpan(t, o.rec, "GET /v1/sandboxes", nil)
	if s.SpanContext().TraceID().String() != traceID || s.Parent().SpanID().String() != parentID || !s.Parent().IsRemote() {
		t.Fatalf("span trace %s parent %s (remote %v), want trace %s parent %s", s.SpanContext().TraceID(), s.Parent().SpanID(), s.Parent().IsRemote(), traceID, parentID)
	}
	if attr(s, "http.response.status_code") != "200" {
		t.Fatalf("status attribute %v", s.Attributes())
	}
}
