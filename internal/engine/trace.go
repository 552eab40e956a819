package engine

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/amber-run/amber/internal/obs/tracing"
)

// span starts the span of one engine operation ("engine.create",
// "engine.exec", "engine.checkpoint", "engine.restore"): a child of the API
// request's span when ctx carries one, a root span for what the engine does
// on its own (policy checkpoints, idle resumes). End it with tracing.End.
// With the no-op provider (no OTLP endpoint) this costs an interface call.
func (e *core) span(ctx context.Context, name, tenant, sandbox string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if tenant != "" {
		attrs = append(attrs, tracing.TenantID.String(tenant))
	}
	if sandbox != "" {
		attrs = append(attrs, tracing.SandboxID.String(sandbox))
	}
	return e.tracer.Start(ctx, name, trace.WithAttributes(attrs...))
}
