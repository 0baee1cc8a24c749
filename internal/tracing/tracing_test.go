package tracing_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/toolpool/toolpool/internal/audit"
	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/dispatcher"
	"github.com/toolpool/toolpool/internal/metrics"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tracing"
	"github.com/toolpool/toolpool/internal/worker"
)

// record installs an SDK tracer provider that keeps every ended span in memory, and the W3C propagator,
// as the globals for the test's duration. Tests that use it must not run in parallel.
func record(t *testing.T) *tracetest.InMemoryExporter {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prevProp := otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetTextMapPropagator(prevProp)
	})
	return exp
}

// byName indexes spans by name, failing on a name that occurs twice.
func byName(t *testing.T, spans tracetest.SpanStubs) map[string]tracetest.SpanStub {
	t.Helper()
	m := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		if _, dup := m[s.Name]; dup {
			t.Errorf("span %q occurs twice", s.Name)
		}
		m[s.Name] = s
	}
	return m
}

func TestInjectExtract(t *testing.T) {
	record(t)
	if got := tracing.Inject(context.Background()); got != "" {
		t.Errorf("Inject without a span = %q, want empty", got)
	}
	ctx, span := tracing.Start(context.Background(), "request")
	defer span.End()
	tp := tracing.Inject(ctx)
	sc := span.SpanContext()
	if want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"; tp != want {
		t.Fatalf("Inject = %q, want %q", tp, want)
	}
	remote := tracing.Extract(context.Background(), tp)
	if got := tracing.TraceID(remote); got != sc.TraceID().String() {
		t.Errorf("TraceID after Extract = %q, want %q", got, sc.TraceID())
	}
	if !trace.SpanContextFromContext(remote).IsRemote() {
		t.Error("the extracted span context is not marked remote")
	}
	for _, bad := range []string{"", "garbage", "00-00000000000000000000000000000000-0000000000000000-01"} {
		if got := tracing.TraceID(tracing.Extract(context.Background(), bad)); got != "" {
			t.Errorf("Extract(%q) gave trace %q, want none", bad, got)
		}
	}
}

type fakeRuntime struct{ out sandbox.Outcome }

func (f fakeRuntime) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	return f.out, nil
}

var outcome = sandbox.Outcome{SandboxTime: 60 * time.Millisecond, RunTime: 250 * time.Millisecond, CleanupTime: 15 * time.Millisecond}

func TestTraceRuntimePhases(t *testing.T) {
	exp := record(t)
	ctx, parent := tracing.Start(context.Background(), "call.process")
	if _, err := tracing.TraceRuntime(fakeRuntime{out: outcome}).Run(ctx, sandbox.Spec{ID: "c_1"}); err != nil {
		t.Fatal(err)
	}
	parent.End()
	spans := byName(t, exp.GetSpans())
	sb := spans["sandbox"]
	if sb.Parent.SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("sandbox's parent is %s, want the caller's span", sb.Parent.SpanID())
	}
	at := sb.StartTime
	for _, phase := range []struct {
		name string
		d    time.Duration
	}{{"sandbox.create", outcome.SandboxTime}, {"sandbox.run", outcome.RunTime}, {"sandbox.cleanup", outcome.CleanupTime}} {
		s, ok := spans[phase.name]
		if !ok {
			t.Fatalf("no span %s", phase.name)
		}
		if s.Parent.SpanID() != sb.SpanContext.SpanID() {
			t.Errorf("%s's parent is not the sandbox span", phase.name)
		}
		if !s.StartTime.Equal(at) || s.EndTime.Sub(s.StartTime) != phase.d {
			t.Errorf("%s runs %v for %v, want from %v for %v", phase.name, s.StartTime, s.EndTime.Sub(s.StartTime), at, phase.d)
		}
		at = s.EndTime
	}
	if sb.EndTime.Before(at) {
		t.Errorf("the sandbox span ends at %v, before its last phase (%v)", sb.EndTime, at)
	}
}

// TestTraceRuntimeSteps checks that the steps the runtime timed are attributes of the sandbox span.
func TestTraceRuntimeSteps(t *testing.T) {
	exp := record(t)
	out := sandbox.Outcome{Warm: true, Steps: []sandbox.Step{{Name: "claim", Took: 250 * time.Microsecond}, {Name: "request", Took: 2 * time.Millisecond}}}
	if _, err := tracing.TraceRuntime(fakeRuntime{out: out}).Run(context.Background(), sandbox.Spec{ID: "c_1"}); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range byName(t, exp.GetSpans())["sandbox"].Attributes {
		got[string(kv.Key)] = kv.Value.Emit()
	}
	for k, want := range map[string]string{"toolpool.sandbox.step.claim_ms": "0.25", "toolpool.sandbox.step.request_ms": "2", "toolpool.sandbox.warm": "true"} {
		if got[k] != want {
			t.Errorf("attribute %s = %q, want %q (all: %v)", k, got[k], want, got)
		}
	}
}

// countingDelivery counts how often its call is decoded.
type countingDelivery struct {
	queue.Delivery
	c       call.Call
	decodes atomic.Int32
}

func (d *countingDelivery) Call() (*call.Call, error) {
	d.decodes.Add(1)
	c := d.c
	return &c, nil
}

func (d *countingDelivery) Attempt() uint64 { return 2 }

func TestTraceHandlerContinuesTheCallsTrace(t *testing.T) {
	exp := record(t)
	ctx, dispatcherSpan := tracing.Start(context.Background(), "publish")
	d := &countingDelivery{c: call.Call{ID: "c_1", Tenant: "acme", Tool: "read_file", TraceParent: tracing.Inject(ctx)}}
	dispatcherSpan.End()
	var handled context.Context
	tracing.TraceHandler(func(ctx context.Context, d queue.Delivery) {
		handled = ctx
		for range 2 {
			if c, err := d.Call(); err != nil || c.ID != "c_1" {
				t.Errorf("Call = %v, %v", c, err)
			}
		}
	})(context.Background(), d)
	if n := d.decodes.Load(); n != 1 {
		t.Errorf("the call was decoded %d times, want once", n)
	}
	if got, want := tracing.TraceID(handled), dispatcherSpan.SpanContext().TraceID().String(); got != want {
		t.Errorf("the handler runs in trace %q, want the dispatcher's %q", got, want)
	}
	process := byName(t, exp.GetSpans())["call.process"]
	if process.SpanKind != trace.SpanKindConsumer || process.Parent.SpanID() != dispatcherSpan.SpanContext().SpanID() || !process.Parent.IsRemote() {
		t.Errorf("call.process: kind %v, parent %v (remote %v); want a consumer span under the publish span", process.SpanKind, process.Parent.SpanID(), process.Parent.IsRemote())
	}
}

func TestTraceStoreStampsTheTraceID(t *testing.T) {
	record(t)
	ctx, span := tracing.Start(context.Background(), "request")
	defer span.End()
	store := tracing.TraceWorkerStore(memStore{})
	r := &call.Result{ID: "c_1", Status: call.StatusRunning}
	if _, err := store.Update(ctx, r, 1); err != nil {
		t.Fatal(err)
	}
	if r.TraceID != span.SpanContext().TraceID().String() {
		t.Errorf("TraceID = %q, want the context's %s", r.TraceID, span.SpanContext().TraceID())
	}
	r2 := &call.Result{ID: "c_2", Status: call.StatusOK, TraceID: "0af7651916cd43dd8448eb211c80319c"}
	if _, err := store.Update(ctx, r2, 1); err != nil {
		t.Fatal(err)
	}
	if r2.TraceID != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("a trace id the record had was replaced by %q", r2.TraceID)
	}
}

type pubFunc func(ctx context.Context, c *call.Call) error

func (f pubFunc) Publish(ctx context.Context, c *call.Call) error { return f(ctx, c) }

func TestTracePublisher(t *testing.T) {
	exp := record(t)
	var published string
	pub := tracing.TracePublisher(pubFunc(func(ctx context.Context, c *call.Call) error {
		published = c.TraceParent
		return nil
	}))
	// An earlier request of another trace, like the one that accepted a call parked for approval.
	first, firstSpan := tracing.Start(context.Background(), "POST /v1/calls")
	firstSpan.End()
	original := tracing.Inject(first)

	for _, tc := range []struct {
		name      string
		parent    string
		want      func(publishSpan tracetest.SpanStub) string
		wantLinks int
	}{
		{"first publish carries the publish span", "", func(s tracetest.SpanStub) string {
			return "00-" + s.SpanContext.TraceID().String() + "-" + s.SpanContext.SpanID().String() + "-01"
		}, 0},
		{"a call of another trace stays in it", original, func(tracetest.SpanStub) string { return original }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exp.Reset()
			ctx, span := tracing.Start(context.Background(), "POST /v1/approvals/{id}")
			defer span.End()
			if err := pub.Publish(ctx, &call.Call{ID: "c_1", TraceParent: tc.parent}); err != nil {
				t.Fatal(err)
			}
			var publish tracetest.SpanStub
			for _, s := range exp.GetSpans() {
				if s.Name == "publish" {
					publish = s
				}
			}
			if want := tc.want(publish); published != want {
				t.Errorf("published traceparent %q, want %q", published, want)
			}
			if len(publish.Links) != tc.wantLinks {
				t.Errorf("publish has %d links, want %d", len(publish.Links), tc.wantLinks)
			}
		})
	}
}

func TestTracePublisherWithTracingOff(t *testing.T) {
	otel.SetTracerProvider(noop.NewTracerProvider())
	var published string
	pub := tracing.TracePublisher(pubFunc(func(ctx context.Context, c *call.Call) error {
		published = c.TraceParent
		return nil
	}))
	if err := pub.Publish(context.Background(), &call.Call{ID: "c_1"}); err != nil {
		t.Fatal(err)
	}
	if published != "" {
		t.Errorf("with tracing off and no trace, the call got traceparent %q", published)
	}
	// A client's traceparent still flows.
	client := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if err := pub.Publish(tracing.Extract(context.Background(), client), &call.Call{ID: "c_2"}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(published, "00-4bf92f3577b34da6a3ce929d0e0e4736-") {
		t.Errorf("with tracing off, the client's trace was lost: published %q", published)
	}
}

type memStore struct{}

func (memStore) Create(ctx context.Context, r *call.Result) (uint64, error) { return 1, nil }
func (memStore) Get(ctx context.Context, id string) (queue.Record, error)   { return queue.Record{}, nil }
func (memStore) Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error) {
	return rev + 1, nil
}
func (memStore) Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error) {
	return nil, nil
}

func TestTraceWorkerStoreTellsTheClaimFromLeaseRenewals(t *testing.T) {
	exp := record(t)
	store := tracing.TraceWorkerStore(memStore{})
	d := &countingDelivery{c: call.Call{ID: "c_1", Tenant: "acme", Tool: "run_shell"}}
	tracing.TraceHandler(func(ctx context.Context, d queue.Delivery) {
		for _, st := range []call.Status{call.StatusRunning, call.StatusRunning, call.StatusRunning, call.StatusOK} {
			if _, err := store.Update(ctx, &call.Result{ID: "c_1", Status: st}, 1); err != nil {
				t.Fatal(err)
			}
		}
	})(context.Background(), d)
	spans := byName(t, exp.GetSpans())
	if _, ok := spans["claim"]; !ok || len(spans) != 3 {
		t.Errorf("spans %v, want call.process, one claim and result.publish", names(spans))
	}
	renewals := 0
	for _, ev := range spans["call.process"].Events {
		if ev.Name == "lease.renew" {
			renewals++
		}
	}
	if renewals != 2 {
		t.Errorf("call.process has %d lease.renew events, want 2", renewals)
	}
}

func TestLogHandlerAddsTheTraceID(t *testing.T) {
	record(t)
	var buf bytes.Buffer
	log := slog.New(tracing.LogHandler(slog.NewJSONHandler(&buf, nil))).With("worker", "w1")
	ctx, span := tracing.Start(context.Background(), "call.process")
	log.InfoContext(ctx, "call finished", "call_id", "c_1")
	span.End()
	log.Info("no context")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d log lines, want 2:\n%s", len(lines), buf.String())
	}
	var first, second map[string]any
	_ = json.Unmarshal([]byte(lines[0]), &first)
	_ = json.Unmarshal([]byte(lines[1]), &second)
	if first["trace_id"] != span.SpanContext().TraceID().String() || first["span_id"] != span.SpanContext().SpanID().String() || first["worker"] != "w1" {
		t.Errorf("line with a traced context = %s", lines[0])
	}
	if _, ok := second["trace_id"]; ok {
		t.Errorf("line without a context has a trace_id: %s", lines[1])
	}
}

// stack is the dispatcher and a worker assembled with their decorators as cmd/dispatcher and cmd/worker
// assemble them (audit, metrics and tracing around the store; tracing and metrics around the publisher,
// policy, runtime, handler and HTTP), on a real in-process JetStream, the shipped default policy, and a
// fake container runtime.
type stack struct {
	url     string // the dispatcher's HTTP server
	conn    *jetstream.Conn
	wreg    *prometheus.Registry
	runtime *fakeRuntime // the worker's
}

const traceToken = "acme-token"

func startStack(t *testing.T) *stack {
	t.Helper()
	nats := jstest.Server(t, "")
	conn := jstest.Connect(t, nats.URL(), "dispatcher", true)
	reg, err := tools.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(tracing.LogHandler(slog.NewTextHandler(io.Discard, nil)))

	// The dispatcher, as cmd/dispatcher wires it.
	dreg := prometheus.NewRegistry()
	dm := metrics.NewDispatcher(dreg, metrics.Options{TenantLabel: true})
	pstore := policy.NewStore(policy.Default(), policy.KnownTools(reg.Names()...))
	audited := audit.Wrap(conn.Records(), conn.Audit(), func(err error) { t.Errorf("write audit event: %v", err) })
	cfg := dispatcher.DefaultConfig()
	cfg.Tenants = []dispatcher.Tenant{{Name: "acme", Tokens: []dispatcher.Token{{Token: traceToken, Role: dispatcher.RoleApprover}}}}
	api, err := dispatcher.New(cfg,
		dispatcher.Deps{
			Store:     tracing.TraceStore(metrics.ObserveStore(audited, dm)),
			Publisher: tracing.TracePublisher(conn.Calls()),
			Tools:     reg,
			Policy:    tracing.TracePolicy(pstore),
			Approvals: conn.Approvals(),
			Log:       log,
		},
		dispatcher.WithReadyChecks(conn.Ready),
		dispatcher.WithAudit(conn.Audit(), audited),
		dispatcher.WithRuleBook(dispatcher.NewSharedRules(conn.SharedState(), "allow_rules", pstore), nil),
	)
	if err != nil {
		t.Fatal(err)
	}
	root := http.NewServeMux()
	root.Handle("GET /metrics", metrics.Handler(dreg))
	root.Handle("/", tracing.HTTPHandler(dm.InstrumentHTTP(api.Handler())))
	httpSrv := httptest.NewServer(root)
	t.Cleanup(httpSrv.Close)

	// A worker, as cmd/worker wires it, on its own connection.
	wconn := jstest.Connect(t, nats.URL(), "worker-1", false)
	s := &stack{url: httpSrv.URL, conn: conn, wreg: prometheus.NewRegistry(), runtime: &fakeRuntime{out: outcome}}
	wm := metrics.NewWorker(s.wreg, metrics.Options{TenantLabel: true})
	wstore := tracing.TraceWorkerStore(metrics.ObserveWorkerStore(
		audit.Wrap(wconn.Records(), wconn.Audit(), func(err error) { t.Errorf("write audit event: %v", err) }), wm))
	// Lease renewals go to the leases bucket, outside the traced store: they add nothing to the trace.
	w, err := worker.New(worker.Config{ID: "worker-1", WorkspacesDir: t.TempDir(), Heartbeat: wconn.AckWait() / 3,
		AckWait: wconn.AckWait(), MaxDeliver: wconn.MaxDeliver(), Now: wconn.Now, UID: 65532, GID: 65532},
		tracing.TraceRuntime(metrics.ObserveRuntime(s.runtime, wm)), wstore, reg, log, worker.WithLeases(wconn.Leases()), worker.WithOutputs(wconn.Outputs()))
	if err != nil {
		t.Fatal(err)
	}
	const slots = 2
	ctx, stop := context.WithCancel(context.Background())
	consumed := make(chan error, 1)
	go func() {
		consumed <- wconn.Calls().ConsumeWith(ctx, ctx, slots, metrics.InstrumentHandler(slots, tracing.TraceHandler(w.Handle), wm))
	}()
	t.Cleanup(func() {
		stop()
		if err := <-consumed; err != nil {
			t.Errorf("consume: %v", err)
		}
	})
	return s
}

// post sends an API request with the tenant's token and extra header pairs, and decodes the result
// envelope it answers.
func (s *stack) post(t *testing.T, path, body string, header ...string) (int, *call.Result) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+traceToken)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var res call.Result
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || res.ID == "" {
		t.Fatalf("POST %s: HTTP %d is no result envelope: %v", path, resp.StatusCode, err)
	}
	return resp.StatusCode, &res
}

// spansOf polls exp until the spans of trace traceID hold every name in want, and returns them by name;
// it fails on a name that occurs twice. The HTTP server span ends after its response is written, and the
// worker's call.process after its delivery is acknowledged: both can end after the client has its answer.
func spansOf(t *testing.T, exp *tracetest.InMemoryExporter, traceID trace.TraceID, want []string) map[string]tracetest.SpanStub {
	t.Helper()
	var got map[string]tracetest.SpanStub
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		in := spansOfTrace(exp, traceID)
		got = map[string]tracetest.SpanStub{}
		for _, s := range in {
			got[s.Name] = s
		}
		missing := false
		for _, name := range want {
			if _, ok := got[name]; !ok {
				missing = true
			}
		}
		if !missing {
			return byName(t, in)
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace %s has spans %v, want %v", traceID, names(got), want)
		}
	}
}

func attr(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// TestOneTracePerCall drives the real dispatcher.Server and worker.Worker, wired with their decorators
// as cmd/* wires them, through a real JetStream: one call makes one trace from the HTTP request through
// NATS into the worker and its container's lifecycle, each span under its parent with the attributes
// docs/observability.md lists and none of the call's arguments, output or token.
func TestOneTracePerCall(t *testing.T) {
	exp := record(t)
	s := startStack(t)
	const command = "echo secret-argument"
	clientTrace := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tests := []struct {
		name   string
		header []string
		// wantParent is the root span's parent: none, or the client's span.
		wantParent string
	}{
		{name: "a request without trace context starts the trace"},
		{name: "a request's traceparent is continued", header: []string{"traceparent", clientTrace}, wantParent: "00f067aa0ba902b7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, res := s.post(t, "/v1/calls", `{"tool":"run_shell","args":{"command":"`+command+`"},"workspace":"ws1"}`, tt.header...)
			if code != http.StatusOK || res.Status != call.StatusOK || res.TraceID == "" {
				t.Fatalf("HTTP %d status %s trace %q", code, res.Status, res.TraceID)
			}
			traceID, err := trace.TraceIDFromHex(res.TraceID)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantParent != "" && res.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
				t.Errorf("the call's trace is %s, not the client's", res.TraceID)
			}
			want := []string{"POST /v1/calls", "authenticate", "policy.evaluate", "call.record", "publish", "call.wait",
				"call.process", "claim", "sandbox", "sandbox.create", "sandbox.run", "sandbox.cleanup", "result.publish"}
			spans := spansOf(t, exp, traceID, want)
			if len(spans) != len(want) {
				t.Errorf("trace has spans %v, want exactly %v", names(spans), want)
			}

			root := spans["POST /v1/calls"]
			if root.SpanKind != trace.SpanKindServer || root.Parent.SpanID().String() != cmp.Or(tt.wantParent, "0000000000000000") {
				t.Errorf("the HTTP span is %v with parent %s, want a server span under %q", root.SpanKind, root.Parent.SpanID(), tt.wantParent)
			}
			for child, parent := range map[string]string{
				"authenticate": "POST /v1/calls", "policy.evaluate": "POST /v1/calls", "call.record": "POST /v1/calls",
				"publish": "POST /v1/calls", "call.wait": "POST /v1/calls",
				"call.process": "publish", "claim": "call.process", "sandbox": "call.process", "result.publish": "call.process",
				"sandbox.create": "sandbox", "sandbox.run": "sandbox", "sandbox.cleanup": "sandbox",
			} {
				if got, want := spans[child].Parent.SpanID(), spans[parent].SpanContext.SpanID(); got != want {
					t.Errorf("%s's parent is %s, want %s (%s)", child, got, parent, want)
				}
			}
			if p := spans["call.process"]; !p.Parent.IsRemote() || p.SpanKind != trace.SpanKindConsumer || spans["publish"].SpanKind != trace.SpanKindProducer {
				t.Errorf("call.process (kind %v) did not continue the producer span (kind %v) from the message", p.SpanKind, spans["publish"].SpanKind)
			}
			for _, a := range []struct{ span, key, want string }{
				{"policy.evaluate", "toolpool.policy.action", "allow"},
				{"policy.evaluate", "toolpool.tenant", "acme"},
				{"call.record", "toolpool.call.id", res.ID},
				{"call.record", "toolpool.call.status", "queued"},
				{"publish", "messaging.system", "nats"},
				{"publish", "toolpool.call.id", res.ID},
				{"publish", "toolpool.workspace", "ws1"},
				{"call.wait", "toolpool.call.status", "ok"},
				{"call.process", "toolpool.delivery.attempt", "1"},
				{"call.process", "toolpool.tool", "run_shell"},
				{"claim", "toolpool.call.status", "running"},
				{"sandbox", "container.id", res.ID},
				{"sandbox", "toolpool.sandbox.exit_code", "0"},
				{"result.publish", "toolpool.call.status", "ok"},
			} {
				if got := attr(spans[a.span], a.key); got != a.want {
					t.Errorf("%s has %s=%q, want %q", a.span, a.key, got, a.want)
				}
			}
			for name, span := range spans {
				for _, kv := range span.Attributes {
					if v := kv.Value.Emit(); strings.Contains(v, "secret-argument") || strings.Contains(v, traceToken) {
						t.Errorf("span %s records %s=%q: arguments and tokens never go into a trace", name, kv.Key, v)
					}
				}
			}
			rec, err := s.conn.Records().Get(context.Background(), res.ID)
			if err != nil || rec.Result.TraceID != res.TraceID {
				t.Errorf("the record names trace %q (%v), want %s", rec.Result.TraceID, err, res.TraceID)
			}
		})
	}

	// Each process's metrics counted each call once.
	resp, err := http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{
		`toolpool_http_requests_total{code="200",handler="POST /v1/calls"} 2`,
		`toolpool_policy_decisions_total{action="allow",rule="read-only-commands",tenant="acme",tool="run_shell"} 2`,
	} {
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("the dispatcher's /metrics lacks %s", line)
		}
	}
	if strings.Contains(string(body), "toolpool_calls_total{") {
		t.Error("the dispatcher counted calls the worker finished")
	}
	if calls := counterSum(t, s.wreg, "toolpool_calls_total"); calls != 2 {
		t.Errorf("the worker counted %v calls, want 2", calls)
	}
}

func counterSum(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestApprovedCallStaysInItsTrace: a call parked for approval runs in the trace of the request that made
// it; the approving request's publish span, in its own trace, links to it.
func TestApprovedCallStaysInItsTrace(t *testing.T) {
	exp := record(t)
	s := startStack(t)
	code, parked := s.post(t, "/v1/calls", `{"tool":"run_shell","args":{"command":"mkdir build"}}`)
	if code != http.StatusAccepted || parked.Status != call.StatusPendingApproval {
		t.Fatalf("HTTP %d status %s, want 202 pending_approval", code, parked.Status)
	}
	first, err := trace.TraceIDFromHex(parked.TraceID)
	if err != nil {
		t.Fatal(err)
	}
	code, approved := s.post(t, "/v1/approvals/"+parked.ID, `{"decision":"approve"}`)
	if code != http.StatusAccepted || approved.Status != call.StatusQueued {
		t.Fatalf("approve: HTTP %d status %s", code, approved.Status)
	}
	spans := spansOf(t, exp, first, []string{"POST /v1/calls", "call.process", "claim", "sandbox", "result.publish"})
	if got, want := spans["call.process"].Parent.SpanID(), spans["POST /v1/calls"].SpanContext.SpanID(); got != want {
		t.Errorf("call.process's parent is %s, want the first request's span %s", got, want)
	}
	var publish *tracetest.SpanStub
	for _, sp := range exp.GetSpans() {
		if sp.Name == "publish" {
			publish = &sp
		}
	}
	if publish == nil || publish.SpanContext.TraceID() == first {
		t.Fatalf("no publish span of the approving request: %+v", publish)
	}
	if len(publish.Links) != 1 || publish.Links[0].SpanContext.TraceID() != first {
		t.Errorf("the approval's publish span links to %+v, want the call's trace %s", publish.Links, first)
	}
	if parent := byName(t, spansOfTrace(exp, publish.SpanContext.TraceID()))["POST /v1/approvals/{id}"]; parent.SpanContext.SpanID() != publish.Parent.SpanID() {
		t.Errorf("the publish span's parent is %s, want the approving request's span %s", publish.Parent.SpanID(), parent.SpanContext.SpanID())
	}
}

func spansOfTrace(exp *tracetest.InMemoryExporter, id trace.TraceID) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

func names(spans map[string]tracetest.SpanStub) []string {
	var out []string
	for n := range spans {
		out = append(out, n)
	}
	return out
}
