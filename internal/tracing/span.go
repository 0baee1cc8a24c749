package tracing

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolpool/toolpool/internal/call"
)

// TracerName is the instrumentation scope of toolpool's own spans.
const TracerName = "github.com/toolpool/toolpool"

// Attribute keys of toolpool's spans. Arguments, output and tokens are never recorded.
const (
	AttrCallID    = attribute.Key("toolpool.call.id")
	AttrTenant    = attribute.Key("toolpool.tenant")
	AttrWorkspace = attribute.Key("toolpool.workspace")
	AttrTool      = attribute.Key("toolpool.tool")
	AttrStatus    = attribute.Key("toolpool.call.status")
	AttrAttempt   = attribute.Key("toolpool.delivery.attempt")
	AttrAction    = attribute.Key("toolpool.policy.action")
	AttrRule      = attribute.Key("toolpool.policy.rule")
)

// Start starts a span named name as a child of the span in ctx (or a new trace's root), from the global
// tracer provider, and returns the context that carries it. The caller must end the span (End). With
// tracing off the span is a no-op that still carries ctx's trace context.
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return start(ctx, name, trace.SpanKindInternal, attrs...)
}

func start(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return otelTracer().Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// otelTracer is toolpool's tracer from the global provider, looked up at each use so that spans follow
// the provider Setup installs.
func otelTracer() trace.Tracer { return otel.Tracer(TracerName) }

// End ends span, first recording err on it and marking it failed when err is not nil.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// Inject returns the W3C traceparent of the span in ctx, for call.Call.TraceParent, or "" when ctx
// carries no valid span context.
func Inject(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier.Get("traceparent")
}

// Extract returns ctx carrying the remote span context of traceparent (a W3C traceparent, as Inject
// writes it), so that spans started from it continue that trace. An empty or malformed traceparent
// returns ctx unchanged.
func Extract(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
}

// TraceID returns the hex trace id of the span in ctx, or "" when there is none.
func TraceID(ctx context.Context) string {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return sc.TraceID().String()
	}
	return ""
}

// CallAttributes are the attributes that identify c on a span: id, tenant, workspace and tool.
func CallAttributes(c *call.Call) []attribute.KeyValue {
	return []attribute.KeyValue{AttrCallID.String(c.ID), AttrTenant.String(c.Tenant),
		AttrWorkspace.String(c.Workspace), AttrTool.String(c.Tool)}
}

func resultAttributes(r *call.Result) []attribute.KeyValue {
	return []attribute.KeyValue{AttrCallID.String(r.ID), AttrTenant.String(r.Tenant),
		AttrTool.String(r.Tool), AttrStatus.String(string(r.Status))}
}
