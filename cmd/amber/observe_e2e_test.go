package main

import (
	"bufio"
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is a minimal OTLP/HTTP trace collector on 127.0.0.1: it
// decodes each protobuf export and keeps the spans.
type otlpReceiver struct {
	url string
	mu  sync.Mutex
	// spans received; service.name of the resource that sent them.
	spans    []*tracepb.Span
	service  string
	problems []string
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &otlpReceiver{url: "http://" + ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(o.serve)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return o
}

func (o *otlpReceiver) problem(format string) {
	o.mu.Lock()
	o.problems = append(o.problems, format)
	o.mu.Unlock()
}

func (o *otlpReceiver) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != "POST" || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		o.problem(r.Method + " " + r.URL.Path + " " + r.Header.Get("Content-Type"))
		http.Error(w, "not an OTLP/HTTP protobuf trace export", http.StatusNotFound)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			o.problem("gzip: " + err.Error())
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	var req coltrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &req)
	}
	if err != nil {
		o.problem("decode: " + err.Error())
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				o.service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			o.spans = append(o.spans, ss.Spans...)
		}
	}
	o.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func spanAttr(s *tracepb.Span, key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			return a.GetValue().GetStringValue()
		}
	}
	return ""
}

// TestE2ETracesAndJSONLogs runs a daemon configured with an OTLP endpoint
// and JSON logs, drives create, exec and checkpoint through the CLI, and
// checks what a collector received and what the daemon logged.
func TestE2ETracesAndJSONLogs(t *testing.T) {
	bin, dir := e2eSetup(t)
	recv := newOTLPReceiver(t)
	d := startDaemon(t, bin, dir, freeAddr(t), "--pool", "0", "--log-format", "json", "--otlp-endpoint", recv.url)
	id := strings.TrimSpace(d.must("sandbox", "create", "--template", "minimal"))
	if got := d.must("exec", id, "--", "echo", "traced"); got != "traced\n" {
		t.Fatalf("exec printed %q", got)
	}
	out := d.must("checkpoint", "--json", id)
	var ck struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(out), &ck); err != nil || ck.ID == "" {
		t.Fatalf("checkpoint --json: %q %v", out, err)
	}
	d.must("sandbox", "rm", id)

	// The daemon bounds request headers (server.MaxHeaderBytes): 431.
	req, _ := http.NewRequest("GET", "http://"+d.addr+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("h", 100<<10))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("100 KiB header: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// A clean stop flushes the batched spans.
	d.stop(syscall.SIGTERM)

	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.problems) > 0 {
		t.Errorf("the collector got requests it could not take: %q", recv.problems)
	}
	if recv.service != "amber" {
		t.Errorf("resource service.name %q", recv.service)
	}
	byName := map[string][]*tracepb.Span{}
	for _, s := range recv.spans {
		byName[s.Name] = append(byName[s.Name], s)
	}
	// The request span of each call and the engine span under it.
	for _, c := range []struct{ request, engine, sandbox string }{
		{"POST /v1/sandboxes", "engine.create", id},
		{"POST /v1/sandboxes/{id}/exec", "engine.exec", id},
		{"POST /v1/sandboxes/{id}/checkpoints", "engine.checkpoint", id},
	} {
		var found bool
		for _, parent := range byName[c.request] {
			for _, child := range byName[c.engine] {
				if string(child.ParentSpanId) == string(parent.SpanId) && string(child.TraceId) == string(parent.TraceId) {
					found = true
					if got := spanAttr(child, "amber.sandbox_id"); got != c.sandbox {
						t.Errorf("%s: amber.sandbox_id %q, want %s", c.engine, got, c.sandbox)
					}
					if got := spanAttr(parent, "amber.tenant_id"); got != "default" {
						t.Errorf("%s: amber.tenant_id %q", c.request, got)
					}
				}
			}
		}
		if !found {
			names := make([]string, 0, len(byName))
			for n := range byName {
				names = append(names, n)
			}
			t.Errorf("no %s span under a %s span; the collector got %q", c.engine, c.request, names)
		}
	}
	for _, s := range byName["engine.checkpoint"] {
		if got := spanAttr(s, "amber.checkpoint_id"); got != ck.ID {
			t.Errorf("engine.checkpoint: amber.checkpoint_id %q, want %s", got, ck.ID)
		}
	}

	// Every line of the daemon's log is JSON; the access line of the exec
	// call names its request, tenant, sandbox and the trace sent above.
	f, err := os.Open(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	execTraces := map[string]bool{}
	for _, s := range byName["POST /v1/sandboxes/{id}/exec"] {
		execTraces[hex.EncodeToString(s.TraceId)] = true
	}
	var sawExec bool
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l map[string]any
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Errorf("log line is not JSON: %q", sc.Text())
			continue
		}
		if l["msg"] == "request" && l["path"] == "/v1/sandboxes/"+id+"/exec" {
			sawExec = true
			rid, _ := l["request_id"].(string)
			tid, _ := l["trace_id"].(string)
			if l["tenant_id"] != "default" || l["sandbox_id"] != id || !strings.HasPrefix(rid, "req-") || !execTraces[tid] {
				t.Errorf("access line of exec %v; exec traces sent %v", l, execTraces)
			}
		}
	}
	if !sawExec {
		t.Errorf("no access line for the exec call in the log:\n%s", tail(d.log(), 30))
	}
}
