package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/toolpool/toolpool/internal/call"
)

// otlpReceiver is an OTLP/HTTP trace receiver (POST /v1/traces, protobuf) on a free loopback port, standing
// for a collector: it keeps every span exported to it with its resource's attributes.
type otlpReceiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []exportedSpan
	bad []string // requests it could not decode
}

// exportedSpan is one received span and the resource (the process) that exported it.
type exportedSpan struct {
	resource map[string]string
	span     *tracepb.Span
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() {
		r.srv.Close()
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, b := range r.bad {
			t.Errorf("the OTLP receiver got a request it could not decode: %s", b)
		}
	})
	return r
}

func (r *otlpReceiver) serve(w http.ResponseWriter, req *http.Request) {
	fail := func(code int, msg string) {
		r.mu.Lock()
		r.bad = append(r.bad, req.Method+" "+req.URL.Path+": "+msg)
		r.mu.Unlock()
		http.Error(w, msg, code)
	}
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		fail(http.StatusNotFound, "not the OTLP/HTTP traces endpoint")
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		fail(http.StatusUnsupportedMediaType, "Content-Type "+ct)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			fail(http.StatusBadRequest, err.Error())
			return
		}
		body = zr
	}
	data, err := io.ReadAll(body)
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	var export coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(data, &export); err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	r.mu.Lock()
	for _, rs := range export.GetResourceSpans() {
		res := attributes(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.got = append(r.got, exportedSpan{resource: res, span: s})
			}
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// attributes flattens OTLP attributes to their string form.
func attributes(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		switch x := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = strconv.FormatInt(x.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = strconv.FormatBool(x.BoolValue)
		default:
			m[kv.GetKey()] = fmt.Sprint(kv.GetValue())
		}
	}
	return m
}

// trace polls until the spans of traceID include every name in want, and returns them by name; it fails
// on a name that occurs twice, and after a deadline. Spans arrive in batches from two processes.
func (r *otlpReceiver) trace(t *testing.T, traceID string, want []string) map[string]exportedSpan {
	t.Helper()
	id, err := hex.DecodeString(traceID)
	if err != nil || len(id) != 16 {
		t.Fatalf("trace id %q: %v", traceID, err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r.mu.Lock()
		got := map[string]exportedSpan{}
		var dups []string
		for _, s := range r.got {
			if bytes.Equal(s.span.GetTraceId(), id) {
				if _, dup := got[s.span.GetName()]; dup {
					dups = append(dups, s.span.GetName())
				}
				got[s.span.GetName()] = s
			}
		}
		r.mu.Unlock()
		missing := false
		for _, name := range want {
			if _, ok := got[name]; !ok {
				missing = true
			}
		}
		if !missing {
			if len(dups) > 0 {
				t.Errorf("spans %v occur more than once in trace %s", dups, traceID)
			}
			return got
		}
		if time.Now().After(deadline) {
			var names []string
			for n := range got {
				names = append(names, n)
			}
			sort.Strings(names)
			t.Fatalf("trace %s has spans %v, want %v", traceID, names, want)
		}
	}
}

// TestTrace runs the real binaries with the standard OTEL_* variables pointing to an OTLP/HTTP receiver,
// makes one call, and follows its one trace from the dispatcher's HTTP request through NATS into the
// worker and its container's lifecycle.
func TestTrace(t *testing.T) {
	otlp := startOTLPReceiver(t) // first, so that it outlives the processes' final flush
	for k, v := range map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.srv.URL, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
		"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SDK_DISABLED": "false",
		"OTEL_TRACES_SAMPLER": "parentbased_always_on", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "", "OTEL_SERVICE_NAME": "",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "", "OTEL_RESOURCE_ATTRIBUTES": "",
	} {
		t.Setenv(k, v) // the binaries inherit the test's environment
	}
	s := startStack(t)

	r := s.shell(t, "dev-token", "ws1", "echo traced", nil)
	res := r.result(t)
	if r.code != http.StatusOK || res.Status != call.StatusOK || len(res.TraceID) != 32 {
		t.Fatalf("HTTP %d: %s", r.code, r.body)
	}
	// The real runtime removes a container after Run returns, so the trace has no sandbox.cleanup span.
	dispatcherSpans := []string{"POST /v1/calls", "authenticate", "policy.evaluate", "call.record", "publish", "call.wait"}
	workerSpans := []string{"call.process", "claim", "sandbox", "sandbox.create", "sandbox.run", "result.publish"}
	spans := otlp.trace(t, res.TraceID, append(append([]string(nil), dispatcherSpans...), workerSpans...))

	for _, name := range dispatcherSpans {
		if svc := spans[name].resource["service.name"]; svc != "toolpool-dispatcher" {
			t.Errorf("span %s comes from service %q, want toolpool-dispatcher", name, svc)
		}
	}
	for _, name := range workerSpans {
		res := spans[name].resource
		if res["service.name"] != "toolpool-worker" || res["service.instance.id"] != "e2e-worker" {
			t.Errorf("span %s comes from %q instance %q, want toolpool-worker e2e-worker", name, res["service.name"], res["service.instance.id"])
		}
	}
	root := spans["POST /v1/calls"].span
	if len(root.GetParentSpanId()) != 0 || root.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("the HTTP span has parent %x and kind %v, want a server root span", root.GetParentSpanId(), root.GetKind())
	}
	for child, parent := range map[string]string{
		"authenticate": "POST /v1/calls", "policy.evaluate": "POST /v1/calls", "call.record": "POST /v1/calls",
		"publish": "POST /v1/calls", "call.wait": "POST /v1/calls",
		"call.process": "publish", "claim": "call.process", "sandbox": "call.process", "result.publish": "call.process",
		"sandbox.create": "sandbox", "sandbox.run": "sandbox",
	} {
		if got, want := spans[child].span.GetParentSpanId(), spans[parent].span.GetSpanId(); !bytes.Equal(got, want) {
			t.Errorf("%s's parent is %x, want %s (%x)", child, got, parent, want)
		}
	}
	if k := spans["call.process"].span.GetKind(); k != tracepb.Span_SPAN_KIND_CONSUMER {
		t.Errorf("call.process is a %v span, want consumer", k)
	}
	for _, a := range []struct{ span, key, want string }{
		{"publish", "toolpool.call.id", res.ID},
		{"publish", "messaging.system", "nats"},
		{"call.process", "toolpool.tenant", "dev"},
		{"call.process", "toolpool.delivery.attempt", "1"},
		{"sandbox", "container.id", res.ID},
		{"sandbox", "toolpool.sandbox.exit_code", "0"},
		{"result.publish", "toolpool.call.status", "ok"},
	} {
		if got := attributes(spans[a.span].span.GetAttributes())[a.key]; got != a.want {
			t.Errorf("%s has %s=%q, want %q", a.span, a.key, got, a.want)
		}
	}
	// The container's phases lie within the sandbox span, one after the other.
	sb, create, run := spans["sandbox"].span, spans["sandbox.create"].span, spans["sandbox.run"].span
	if create.GetStartTimeUnixNano() < sb.GetStartTimeUnixNano() || create.GetEndTimeUnixNano() != run.GetStartTimeUnixNano() ||
		run.GetEndTimeUnixNano() > sb.GetEndTimeUnixNano() || run.GetEndTimeUnixNano() <= run.GetStartTimeUnixNano() {
		t.Errorf("sandbox [%d, %d] create [%d, %d] run [%d, %d]: the phases are not back to back within the sandbox span",
			sb.GetStartTimeUnixNano(), sb.GetEndTimeUnixNano(), create.GetStartTimeUnixNano(), create.GetEndTimeUnixNano(),
			run.GetStartTimeUnixNano(), run.GetEndTimeUnixNano())
	}
}
