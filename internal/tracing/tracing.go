// Package tracing gives toolpool one OpenTelemetry trace per call, from the dispatcher's HTTP request to
// the worker's result, as decorators around the seams the services already have: the HTTP handler, the
// policy engine, the call store, the publisher, the queue's delivery handler and the sandbox runtime. The
// W3C trace context crosses the queue in call.Call.TraceParent (and the NATS message's traceparent
// header), which Inject writes and Extract reads.
//
// Setup installs the SDK when the standard OTEL_* environment asks for an exporter; otherwise the global
// no-op provider stays, every span is a no-op and the decorators cost a few allocations. cmd/* calls
// Setup; nothing else here touches global state.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Option configures Setup.
type Option func(*setupConfig)

type setupConfig struct {
	log   *slog.Logger
	attrs []attribute.KeyValue
}

// WithLogger sends the SDK's own errors (an unreachable collector, a dropped batch) to log at warn level
// instead of the standard library's logger.
func WithLogger(log *slog.Logger) Option { return func(c *setupConfig) { c.log = log } }

// WithResourceAttributes adds attributes to the resource every span is reported with, such as
// semconv.ServiceInstanceID(workerID). OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME override them.
func WithResourceAttributes(attrs ...attribute.KeyValue) Option {
	return func(c *setupConfig) { c.attrs = append(c.attrs, attrs...) }
}

// enabled reports whether the environment asks for trace export: OTEL_TRACES_EXPORTER, or an OTLP
// endpoint (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), is set, and neither
// OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none turns it off.
func enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))
	if strings.EqualFold(exp, "none") {
		return false
	}
	return exp != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs the W3C trace-context and baggage propagator as the global propagator and, when Enabled,
// an SDK tracer provider exporting over OTLP as the global tracer provider. It reads the standard OTEL_*
// environment, the one configuration toolpool takes from the environment because that is OpenTelemetry's
// convention: OTEL_TRACES_EXPORTER (otlp or none), OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL (http/protobuf,
// the specification's default, or grpc), and through the SDK the endpoint, headers, timeout, compression,
// TLS, OTEL_TRACES_SAMPLER[_ARG], OTEL_BSP_*, OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES. service is
// the default service.name.
//
// When tracing is not Enabled the global no-op tracer provider stays: spans cost nothing, yet a
// traceparent a client sends still flows through to the worker and its logs. Setup does not connect to
// the collector; export errors go to the SDK's error handler (see WithLogger).
//
// The caller must call shutdown (or Flush it), with a bounded context, before exiting: it flushes the spans not yet
// exported. shutdown is never nil.
func Setup(ctx context.Context, service string, opts ...Option) (shutdown func(context.Context) error, err error) {
	noop := func(context.Context) error { return nil }
	var cfg setupConfig
	for _, o := range opts {
		o(&cfg)
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if !enabled(os.Getenv) {
		return noop, nil
	}
	if exp := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); exp != "" && !strings.EqualFold(exp, "otlp") {
		return noop, fmt.Errorf("set up tracing: OTEL_TRACES_EXPORTER=%q is not supported: use otlp or none", exp)
	}
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exporter sdktrace.SpanExporter
	switch strings.TrimSpace(protocol) {
	case "", "http/protobuf":
		exporter, err = otlptracehttp.New(ctx)
	case "grpc":
		exporter, err = otlptracegrpc.New(ctx)
	default:
		return noop, fmt.Errorf("set up tracing: OTLP protocol %q is not supported: use http/protobuf or grpc", protocol)
	}
	if err != nil {
		return noop, fmt.Errorf("create otlp trace exporter: %w", err)
	}
	res, err := newResource(ctx, service, cfg.attrs)
	if err != nil {
		return noop, errors.Join(fmt.Errorf("build trace resource: %w", err), exporter.Shutdown(ctx))
	}
	if cfg.log != nil {
		log := cfg.log
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("opentelemetry", "error", err) }))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return func(ctx context.Context) error {
		if err := tp.Shutdown(ctx); err != nil {
			return fmt.Errorf("shut down tracer provider: %w", err)
		}
		return nil
	}, nil
}

// newResource describes this process: service.name (overridable by OTEL_SERVICE_NAME), service.version
// from the build, the caller's attributes, OTEL_RESOURCE_ATTRIBUTES, the SDK, host and Go runtime.
func newResource(ctx context.Context, service string, attrs []attribute.KeyValue) (*resource.Resource, error) {
	base := []attribute.KeyValue{semconv.ServiceName(service)}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		base = append(base, semconv.ServiceVersion(bi.Main.Version))
	}
	return resource.New(ctx,
		resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(append(base, attrs...)...),
		resource.WithFromEnv(), // later detectors win: the environment overrides the defaults above
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithProcessRuntimeName(),
		resource.WithProcessRuntimeVersion(),
	)
}

// flushTimeout bounds Flush.
const flushTimeout = 5 * time.Second

// Flush runs shutdown on a fresh context bounded to a few seconds, for a deferred call at exit:
// defer tracing.Flush(shutdown).
func Flush(shutdown func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	_ = shutdown(ctx)
}
