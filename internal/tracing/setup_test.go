package tracing

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

func TestEnabled(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"nothing set", nil, false},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{"exporter otlp", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{"exporter none wins", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{"sdk disabled wins", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{"only the protocol", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := enabled(func(k string) string { return tc.env[k] }); got != tc.want {
				t.Errorf("enabled = %v, want %v", got, tc.want)
			}
		})
	}
}

// clearOTELEnv unsets every variable Setup looks at, for the test's duration.
func clearOTELEnv(t *testing.T) {
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		t.Setenv(k, "")
	}
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })
}

func TestSetupOffLeavesTheNoopProvider(t *testing.T) {
	clearOTELEnv(t)
	otel.SetTracerProvider(noop.NewTracerProvider())
	shutdown, err := Setup(context.Background(), "toolpool-test")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); ok {
		t.Error("Setup installed the SDK although no OTEL_* variable asks for it")
	}
	_, span := Start(context.Background(), "x")
	if span.IsRecording() {
		t.Error("a span records with tracing off")
	}
	span.End()
	if err := shutdown(context.Background()); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

func TestSetupExporters(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		wantErr bool
	}{
		{"http/protobuf by default", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, false},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false},
		{"traces protocol wins", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "bogus",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, false},
		{"unsupported protocol", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, true},
		{"unsupported exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearOTELEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			shutdown, err := Setup(context.Background(), "toolpool-test")
			if tc.wantErr {
				if err == nil {
					t.Fatal("Setup succeeded, want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); !ok {
				t.Errorf("the global tracer provider is %T, want the SDK's", otel.GetTracerProvider())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := shutdown(ctx); err != nil { // no span was made, so nothing is exported
				t.Errorf("shutdown: %v", err)
			}
		})
	}
}
