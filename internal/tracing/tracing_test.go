package tracing_test

import (
	"bytes"
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

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/metrics"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tracing"
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

func (memStore) Get(ctx context.Context, id string) (queue.Record, error) { return queue.Record{}, nil }
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

// allowAll is a policy that allows every call.
type allowAll struct{}

func (allowAll) Decide(ctx context.Context, r policy.Request) policy.Decision {
	return policy.Decision{Action: policy.Allow, Rule: policy.RuleToolAction}
}
func (allowAll) ToolEnabled(tenant, tool string, requestTools map[string]bool) bool { return true }

// TestOneTracePerCall is the end-to-end proof: a call accepted over HTTP by dispatcher-side code wrapped
// the way cmd/dispatcher wraps it (metrics and tracing decorators, /metrics beside the API), published
// through a real JetStream (the trace context crosses in the message), and run by worker-side code wrapped
// the way cmd/worker wraps it, makes one trace, with every span under its proper parent; the trace id
// lands in the call's record; and the metrics count the call once.
func TestOneTracePerCall(t *testing.T) {
	exp := record(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	srv, err := jetstream.StartEmbedded(jetstream.EmbeddedConfig{Listen: "127.0.0.1:-1", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	cfg := jetstream.DefaultConfig()
	cfg.URL, cfg.Name, cfg.Provision = srv.URL(), "tracing-test", true
	conn, err := jetstream.Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)

	// The dispatcher side, as cmd/dispatcher assembles it.
	dreg := prometheus.NewRegistry()
	dm := metrics.NewDispatcher(dreg, metrics.Options{TenantLabel: true})
	store := tracing.TraceStore(metrics.ObserveStore(conn, dm))
	pub, pol := tracing.TracePublisher(conn), tracing.TracePolicy(allowAll{})
	api := http.NewServeMux() // stands for dispatcher.Server.Handler()
	api.HandleFunc("POST /v1/calls", func(w http.ResponseWriter, r *http.Request) {
		_, span := tracing.Start(r.Context(), "authenticate") // a sibling of what follows, as in server.auth
		tracing.End(span, nil)
		ctx := r.Context()
		dec := pol.Decide(ctx, policy.Request{Tenant: "acme", Tool: "run_shell"})
		c := &call.Call{ID: call.NewID(), Tenant: "acme", Workspace: "ws1", Tool: "run_shell", Args: json.RawMessage(`{"command":"true"}`),
			CreatedAt: time.Now().UTC(), Decision: &call.Decision{Action: string(dec.Action), Rule: dec.Rule},
			TraceParent: tracing.Inject(ctx)}
		if _, err := store.Create(ctx, call.NewResult(c, call.StatusQueued)); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if err := pub.Publish(ctx, c); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"id": c.ID})
	})
	root := http.NewServeMux()
	root.Handle("GET /metrics", metrics.Handler(dreg))
	root.Handle("/", tracing.HTTPHandler(dm.InstrumentHTTP(api)))
	dispatcher := httptest.NewServer(root)
	defer dispatcher.Close()
	resp, err := http.Post(dispatcher.URL+"/v1/calls", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	var accepted struct{ ID string }
	err = json.NewDecoder(resp.Body).Decode(&accepted)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/calls: %d, %v", resp.StatusCode, err)
	}

	// The worker side, as cmd/worker assembles it; the handler does what worker.Handle does.
	wreg := prometheus.NewRegistry()
	wm := metrics.NewWorker(wreg, metrics.Options{TenantLabel: true})
	wstore := tracing.TraceWorkerStore(metrics.ObserveWorkerStore(conn, wm))
	rt := tracing.TraceRuntime(metrics.ObserveRuntime(fakeRuntime{out: outcome}, wm))
	done := make(chan string, 1)
	handle := metrics.InstrumentHandler(1, tracing.TraceHandler(func(ctx context.Context, d queue.Delivery) {
		c, err := d.Call()
		if err != nil {
			t.Errorf("decode delivered call: %v", err)
			return
		}
		rec, err := wstore.Get(ctx, c.ID)
		if err != nil {
			t.Errorf("get record: %v", err)
			return
		}
		r := rec.Result
		r.Status, r.Worker, r.StartedAt = call.StatusRunning, "w1", time.Now().UTC()
		rev, err := wstore.Update(ctx, r, rec.Revision) // claim
		if err != nil {
			t.Errorf("claim: %v", err)
			return
		}
		r.LeaseUntil = time.Now().Add(time.Minute)
		if rev, err = wstore.Update(ctx, r, rev); err != nil { // a lease renewal
			t.Errorf("renew lease: %v", err)
			return
		}
		out, err := rt.Run(ctx, sandbox.Spec{ID: c.ID})
		if err != nil {
			t.Errorf("run: %v", err)
		}
		r.Status, r.FinishedAt = call.StatusOK, time.Now().UTC()
		r.Timing = call.Timing{QueuedMS: r.StartedAt.Sub(c.CreatedAt).Milliseconds(), SandboxMS: out.SandboxTime.Milliseconds(),
			RunMS: out.RunTime.Milliseconds(), TotalMS: r.FinishedAt.Sub(c.CreatedAt).Milliseconds()}
		if _, err := wstore.Update(ctx, r, rev); err != nil {
			t.Errorf("record result: %v", err)
		}
		_ = d.Ack(ctx)
		done <- c.ID
	}), wm)
	consumeCtx, stopConsume := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() { consumed <- conn.Consume(consumeCtx, 1, handle) }()
	select {
	case id := <-done:
		if id != accepted.ID {
			t.Fatalf("the worker ran %s, want %s", id, accepted.ID)
		}
	case <-ctx.Done():
		t.Fatal("the worker got no call within the deadline")
	}
	stopConsume()
	if err := <-consumed; err != nil {
		t.Fatalf("Consume: %v", err)
	}

	want := []string{"POST /v1/calls", "authenticate", "policy.evaluate", "call.record", "publish", "call.process",
		"claim", "sandbox", "sandbox.create", "sandbox.run", "sandbox.cleanup", "result.publish"}
	var spans map[string]tracetest.SpanStub
	for deadline := time.Now().Add(10 * time.Second); ; {
		// The server span ends after the response is written: poll for it.
		if spans = byName(t, exp.GetSpans()); len(spans) >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, name := range want {
		if _, ok := spans[name]; !ok {
			t.Fatalf("no span %q; got %v", name, names(spans))
		}
	}
	if len(spans) != len(want) {
		t.Errorf("spans %v, want exactly %v", names(spans), want)
	}

	root0 := spans["POST /v1/calls"]
	traceID := root0.SpanContext.TraceID()
	for name, s := range spans {
		if s.SpanContext.TraceID() != traceID {
			t.Errorf("span %s is in trace %s, want %s", name, s.SpanContext.TraceID(), traceID)
		}
	}
	if root0.Parent.IsValid() || root0.SpanKind != trace.SpanKindServer {
		t.Errorf("the HTTP span has parent %v and kind %v, want a server root span", root0.Parent, root0.SpanKind)
	}
	for child, parent := range map[string]string{
		"authenticate": "POST /v1/calls", "policy.evaluate": "POST /v1/calls", "call.record": "POST /v1/calls",
		"publish": "POST /v1/calls", "call.process": "publish", "claim": "call.process", "sandbox": "call.process",
		"result.publish": "call.process", "sandbox.create": "sandbox", "sandbox.run": "sandbox", "sandbox.cleanup": "sandbox",
	} {
		if got, want := spans[child].Parent.SpanID(), spans[parent].SpanContext.SpanID(); got != want {
			t.Errorf("%s's parent is %s, want %s (%s)", child, got, parent, want)
		}
	}
	if !spans["call.process"].Parent.IsRemote() {
		t.Error("call.process's parent did not come from the message")
	}

	rec, err := conn.Get(ctx, accepted.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Result.TraceID != traceID.String() || rec.Result.Status != call.StatusOK {
		t.Errorf("the record has status %s and trace id %q, want ok and %s", rec.Result.Status, rec.Result.TraceID, traceID)
	}

	// The metrics saw the call once, each on its own process.
	resp, err = http.Get(dispatcher.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{
		`toolpool_http_requests_total{code="200",handler="POST /v1/calls"} 1`,
		`toolpool_policy_decisions_total{action="allow",rule="tool-action",tenant="acme",tool="run_shell"} 1`,
	} {
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("the dispatcher's /metrics lacks %s", line)
		}
	}
	if strings.Contains(string(body), "toolpool_calls_total{") {
		t.Error("the dispatcher counted a call the worker finished")
	}
	mfs, err := wreg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var calls, slotsBusy float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "toolpool_calls_total":
				calls += m.GetCounter().GetValue()
			case "toolpool_worker_slots":
				if m.GetLabel()[0].GetValue() == "busy" {
					slotsBusy = m.GetGauge().GetValue()
				}
			}
		}
	}
	if calls != 1 || slotsBusy != 0 {
		t.Errorf("the worker counted %v calls with %v slots busy after, want 1 and 0", calls, slotsBusy)
	}
}

func names(spans map[string]tracetest.SpanStub) []string {
	var out []string
	for n := range spans {
		out = append(out, n)
	}
	return out
}
