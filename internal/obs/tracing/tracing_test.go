package tracing

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/amber-run/amber/core/errdefs"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestSetupEndpoints(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name, flag string
		env        map[string]string
		want       string // "" : no exporter
	}{
		{name: "nothing configured"},
		{name: "flag is a base URL", flag: "http://127.0.0.1:4318", want: "http://127.0.0.1:4318/v1/traces"},
		{name: "flag with a prefix", flag: "https://127.0.0.1:9/otlp/", want: "https://127.0.0.1:9/otlp/v1/traces"},
		{name: "flag wins over env", flag: "http://127.0.0.1:9", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.2:9"}, want: "http://127.0.0.1:9/v1/traces"},
		{name: "base env", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.2:9"}, want: "http://127.0.0.2:9/v1/traces"},
		{name: "traces env used as it is", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.2:9", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.3:9/custom"}, want: "http://127.0.0.3:9/custom"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := Setup(ctx, Config{Endpoint: c.flag, Getenv: env(c.env)})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Shutdown(ctx) // nothing to send: no span is started
			if p.Endpoint != c.want || p.Enabled() != (c.want != "") {
				t.Fatalf("endpoint %q enabled %v, want %q", p.Endpoint, p.Enabled(), c.want)
			}
			if !p.Enabled() {
				// The no-op provider's spans record nothing.
				_, span := p.Tracer("t").Start(ctx, "s")
				if span.IsRecording() {
					t.Fatal("a span of the no-op provider records")
				}
				span.End()
			}
		})
	}
}

func TestSetupRefusesABadEndpoint(t *testing.T) {
	for _, c := range []struct{ flag, env string }{{flag: "127.0.0.1:4318"}, {env: "grpc://x:4317"}} {
		_, err := Setup(context.Background(), Config{Endpoint: c.flag, Getenv: env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": c.env})})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "http://") {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// With nothing configured a span costs at most one small allocation (the
// no-op span boxed in its interface): the instrumented request path pays
// next to nothing for tracing that is off.
func TestNoopSpansDoNotAllocate(t *testing.T) {
	p, _ := Setup(context.Background(), Config{Getenv: env(nil)})
	tr := p.Tracer(ScopeEngine)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		_, span := tr.Start(ctx, "engine.exec")
		End(span, nil)
	})
	if allocs > 1 {
		t.Fatalf("a no-op span allocates %v times", allocs)
	}
}

// The gateway's hook: a client span under the span in ctx (the request
// or engine operation that caused the outbound call), carrying the tenant,
// sandbox, method and host, and the error status End gives it.
func TestGatewayRequestSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, parent := tp.Tracer("test").Start(context.Background(), "engine.exec")
	_, span := StartGatewayRequest(ctx, tp, "acme", "sbx-1", "POST", "api.example.com")
	span.SetAttributes(GatewayReplayed.Bool(true))
	End(span, errdefs.Unavailablef("upstream down"))
	parent.End()
	spans := rec.Ended()
	if len(spans) != 2 || spans[0].Name() != "gateway POST" {
		t.Fatalf("spans %v", spans)
	}
	g := spans[0]
	if g.Parent().SpanID() != parent.SpanContext().SpanID() || g.SpanKind() != trace.SpanKindClient {
		t.Errorf("gateway span parent %s kind %v", g.Parent().SpanID(), g.SpanKind())
	}
	want := map[string]string{"amber.tenant_id": "acme", "amber.sandbox_id": "sbx-1", "http.request.method": "POST",
		"server.address": "api.example.com", "amber.gateway.replayed": "true", "amber.error_kind": "unavailable"}
	for _, a := range g.Attributes() {
		if w, ok := want[string(a.Key)]; ok {
			if a.Value.Emit() != w {
				t.Errorf("%s = %s, want %s", a.Key, a.Value.Emit(), w)
			}
			delete(want, string(a.Key))
		}
	}
	if len(want) > 0 {
		t.Errorf("gateway span lacks %v", want)
	}
	if g.Status().Code != codes.Error {
		t.Errorf("status %v", g.Status())
	}
	// Without a provider it is a no-op, not a panic.
	_, s := StartGatewayRequest(context.Background(), nil, "acme", "sbx-1", "GET", "x")
	End(s, nil)
}
