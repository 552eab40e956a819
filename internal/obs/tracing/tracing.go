// Package tracing sets up Amber's OpenTelemetry traces and names what they
// carry, in one place.
//
// A request to the API is one trace: the server middleware starts a span
// per request named after the route pattern ("POST /v1/sandboxes/{id}/exec")
// and the engine's operations (create, exec, checkpoint, restore) start
// child spans of it; the gateway will do the same for each outbound request
// (StartGatewayRequest). Every span carries the tenant and, where there is
// one, the sandbox id (the attribute keys below), so a trace can be found
// from either.
//
// Traces leave the process only when an OTLP endpoint is configured: the
// `amber up --otlp-endpoint` flag, or the standard OTEL_EXPORTER_OTLP_ENDPOINT
// / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT variables. They are sent over
// OTLP/HTTP (protobuf) in batches. Without an endpoint Setup returns the
// no-op provider: starting a span then allocates nothing and records
// nothing, so the instrumented paths cost a few nanoseconds.
package tracing

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/amber-run/amber/core/errdefs"
)

// Instrumentation scopes: the tracer names of the packages that make spans.
const (
	ScopeServer  = "github.com/amber-run/amber/internal/edge/server"
	ScopeEngine  = "github.com/amber-run/amber/internal/engine"
	ScopeGateway = "github.com/amber-run/amber/internal/egress/gateway"
)

// Attribute keys Amber puts on its spans (the same names as the log fields
// of internal/obs/logging, so a log line and its span are found by one id).
const (
	TenantID     = attribute.Key("amber.tenant_id")
	SandboxID    = attribute.Key("amber.sandbox_id")
	CheckpointID = attribute.Key("amber.checkpoint_id")
	SessionID    = attribute.Key("amber.session_id")
	RequestID    = attribute.Key("amber.request_id")
	Template     = attribute.Key("amber.template")
	ErrorKind    = attribute.Key("amber.error_kind")
	ExitCode     = attribute.Key("amber.exit_code")
	StoredBytes  = attribute.Key("amber.stored_bytes") // what a checkpoint added to the store
)

// Propagator reads and writes the W3C traceparent/tracestate headers: a
// client that sends traceparent gets its API call's span as a child of its
// own.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Config says where traces go.
type Config struct {
	// Endpoint is the OTLP/HTTP base URL ("http://collector:4318"); traces
	// are posted to its path + /v1/traces, like OTEL_EXPORTER_OTLP_ENDPOINT.
	// It overrides the environment. Empty: the environment decides.
	Endpoint string
	// Getenv reads the environment (default os.Getenv; tests replace it).
	Getenv func(string) string
	// Service and Version name this process in the traces' resource.
	Service, Version string
}

// Provider is the tracer provider the daemon hands to its parts.
type Provider struct {
	trace.TracerProvider
	// Endpoint is where traces are sent ("" when they are not).
	Endpoint string
	shutdown func(context.Context) error
}

// Enabled reports whether spans are recorded and exported.
func (p *Provider) Enabled() bool { return p.shutdown != nil }

// Shutdown sends the spans still buffered and stops the exporter. Call it
// once, when the daemon stops, with a deadline: an unreachable collector
// must not hold up the exit.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p.shutdown == nil {
		return nil
	}
	return p.shutdown(ctx)
}

// Setup returns the provider Config asks for: an OTLP/HTTP exporter when an
// endpoint is configured (flag or environment), the no-op provider
// otherwise. A malformed endpoint is an error naming where it came from;
// an unreachable one is not (the exporter retries and drops, and the
// daemon serves on).
func Setup(ctx context.Context, c Config) (*Provider, error) {
	getenv := c.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	var opts []otlptracehttp.Option
	where := ""
	switch {
	case c.Endpoint != "":
		u, err := parseEndpoint("--otlp-endpoint", c.Endpoint)
		if err != nil {
			return nil, err
		}
		u.Path = path.Join("/", u.Path, "v1/traces")
		where = u.String()
		// Explicit options win over the environment inside the exporter.
		opts = append(opts, otlptracehttp.WithEndpointURL(where))
	case getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "":
		u, err := parseEndpoint("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
		if err != nil {
			return nil, err
		}
		// Per the OTLP spec the per-signal URL is used as it is.
		where = u.String()
		opts = append(opts, otlptracehttp.WithEndpointURL(where))
	case getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "":
		u, err := parseEndpoint("OTEL_EXPORTER_OTLP_ENDPOINT", getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
		if err != nil {
			return nil, err
		}
		u.Path = path.Join("/", u.Path, "v1/traces")
		where = u.String()
		opts = append(opts, otlptracehttp.WithEndpointURL(where))
	default:
		return &Provider{TracerProvider: noop.NewTracerProvider()}, nil
	}
	// The exporter also reads OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT,
	// _COMPRESSION and the TLS variables itself.
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter for %s: %w", where, err)
	}
	service := c.Service
	if service == "" {
		service = "amber"
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service), semconv.ServiceVersion(c.Version)))
	if err != nil {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(2*time.Second)),
		sdktrace.WithResource(res),
	)
	return &Provider{TracerProvider: tp, Endpoint: where, shutdown: tp.Shutdown}, nil
}

func parseEndpoint(from, s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errdefs.InvalidArgumentf("%s %q: want an http:// or https:// URL such as http://127.0.0.1:4318", from, s)
	}
	return u, nil
}

// OrNoop returns tp, or the no-op provider when tp is nil: what a part
// does with an unset Options.Tracer.
func OrNoop(tp trace.TracerProvider) trace.TracerProvider {
	if tp == nil {
		return noop.NewTracerProvider()
	}
	return tp
}

// End ends span with err's outcome: an error status and its kind
// (errdefs.Kind) when err is not nil.
func End(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(ErrorKind.String(errdefs.Kind(err)))
	}
	span.End()
}

// StartGatewayRequest starts the span of one outbound request through the
// egress gateway, a child of whatever span ctx carries. The gateway calls
// it for each request it serves and ends the span with End once the
// request is answered (replayed from the journal or forwarded), setting
// amber.gateway.replayed on it.
func StartGatewayRequest(ctx context.Context, tp trace.TracerProvider, tenant, sandbox, method, host string) (context.Context, trace.Span) {
	return OrNoop(tp).Tracer(ScopeGateway).Start(ctx, "gateway "+method,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(TenantID.String(tenant), SandboxID.String(sandbox),
			semconv.HTTPRequestMethodKey.String(method), semconv.ServerAddress(host)))
}

// GatewayReplayed is the attribute the gateway sets on a request's span:
// true when the answer came from the effect journal.
const GatewayReplayed = attribute.Key("amber.gateway.replayed")
