package tracing

import (
	"context"
	"errors"
	"strings"
	"testing"

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
