package tracing

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/sandbox"
)

// HTTPHandler returns h wrapped by otelhttp: each request gets a server span, named after the route
// pattern the http.ServeMux matched ("POST /v1/calls"), continuing the traceparent the client sent if
// any. Probes (/healthz, /readyz, /metrics) are not traced. h should be the mux, or a handler that
// passes the request it gets on to the mux unchanged (metrics.InstrumentHTTP does).
func HTTPHandler(h http.Handler) http.Handler {
	return otelhttp.NewHandler(h, "http.server", otelhttp.WithFilter(func(r *http.Request) bool {
		switch r.URL.Path {
		case "/healthz", "/readyz", "/metrics":
			return false
		}
		return true
	}))
}

// Policy is the dispatcher's policy, the shape of dispatcher.Policy.
type Policy interface {
	Decide(ctx context.Context, r policy.Request) policy.Decision
	ToolEnabled(tenant, tool string, requestTools map[string]bool) bool
	CheckImage(tenant, tool, ref string) (policy.ImageVerdict, error)
}

// TracePolicy returns next with a span "policy.evaluate" around each Decide, carrying the tenant, tool,
// action and rule. ToolEnabled and CheckImage are not traced.
func TracePolicy(next Policy) Policy { return tracedPolicy{next} }

type tracedPolicy struct{ Policy }

func (p tracedPolicy) Decide(ctx context.Context, r policy.Request) policy.Decision {
	ctx, span := Start(ctx, "policy.evaluate", AttrTenant.String(r.Tenant), AttrTool.String(r.Tool))
	d := p.Policy.Decide(ctx, r)
	span.SetAttributes(AttrAction.String(string(d.Action)), AttrRule.String(d.Rule))
	span.End()
	return d
}

// Publisher hands calls to the workers: the publishing half of queue.Calls, the shape of
// dispatcher.Publisher.
type Publisher interface {
	Publish(ctx context.Context, c *call.Call) error
}

// TracePublisher returns next with a producer span "publish" around each Publish, and sets
// c.TraceParent to that span's context before publishing, so that the worker's spans continue the trace
// under it. A call that carries the context of another trace already (one published again after its
// approval, whose TraceParent the accepting request set) keeps it, so that it stays in the one trace of
// its call; the publish span links to it instead. When ctx carries no trace, c.TraceParent is left as it
// is.
func TracePublisher(next Publisher) Publisher { return tracedPublisher{next} }

type tracedPublisher struct{ next Publisher }

func (p tracedPublisher) Publish(ctx context.Context, c *call.Call) (err error) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(append(CallAttributes(c),
		semconv.MessagingSystemKey.String("nats"), semconv.MessagingOperationTypeSend, semconv.MessagingMessageID(c.ID))...)}
	own := trace.SpanContextFromContext(Extract(context.Background(), c.TraceParent))
	other := own.IsValid() && own.TraceID() != trace.SpanContextFromContext(ctx).TraceID()
	if other {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: own}))
	}
	ctx, span := otelTracer().Start(ctx, "publish", opts...)
	defer func() { End(span, err) }()
	if tp := Inject(ctx); tp != "" && !other {
		c.TraceParent = tp
	}
	return p.next.Publish(ctx, c)
}

// TraceStore returns the dispatcher's call records next with spans "call.record" (Create), "call.update"
// (Update) and "call.wait" (Wait). Before a Create or Update it sets r.TraceID to ctx's trace id when r
// has none, so the result envelope names the call's trace. Get is not traced. The result keeps next's
// contract (queue.Records): errors and blocking are next's.
func TraceStore(next queue.Records) queue.Records { return tracedStore{next} }

type tracedStore struct{ queue.Records }

func (s tracedStore) Create(ctx context.Context, r *call.Result) (_ uint64, err error) {
	stamp(ctx, r)
	ctx, span := Start(ctx, "call.record", resultAttributes(r)...)
	defer func() { End(span, err) }()
	return s.Records.Create(ctx, r)
}

func (s tracedStore) Update(ctx context.Context, r *call.Result, rev uint64) (_ uint64, err error) {
	stamp(ctx, r)
	ctx, span := Start(ctx, "call.update", resultAttributes(r)...)
	defer func() { End(span, err) }()
	return s.Records.Update(ctx, r, rev)
}

func (s tracedStore) Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error) {
	ctx, span := Start(ctx, "call.wait", AttrCallID.String(id))
	r, err := s.Records.Wait(ctx, id, done)
	if r != nil {
		span.SetAttributes(AttrStatus.String(string(r.Status)))
	}
	spanErr := err
	if r != nil && ctx.Err() != nil {
		// The wait ran out before the call finished: the answer is the call's current state, not a failure.
		span.SetAttributes(attribute.Bool("toolpool.wait.timed_out", true))
		spanErr = nil
	}
	End(span, spanErr)
	return r, err
}

// TraceWorkerStore returns the worker's call records next with a span around the Updates that move a call: "claim" (the first
// Update to running within a delivery TraceHandler traces), "result.publish" (the final status) and
// "call.update" (anything else, such as handing a call that did not start back to the queue). Later
// Updates to running within the same delivery renew the worker's lease: they get no span, only a
// "lease.renew" event on the span in ctx, so that a long call does not make a span per heartbeat. Like
// TraceStore it sets r.TraceID when r has none. Create, Get and Wait are not traced.
func TraceWorkerStore(next queue.Records) queue.Records { return tracedWorkerStore{next} }

type tracedWorkerStore struct{ queue.Records }

func (s tracedWorkerStore) Update(ctx context.Context, r *call.Result, rev uint64) (_ uint64, err error) {
	name := "call.update"
	switch {
	case r.Status == call.StatusRunning:
		if d, ok := ctx.Value(deliveryKey{}).(*deliveryState); ok && d.claimed.Swap(true) {
			trace.SpanFromContext(ctx).AddEvent("lease.renew")
			return s.Records.Update(ctx, r, rev)
		}
		name = "claim"
	case r.Status.Terminal():
		name = "result.publish"
	}
	stamp(ctx, r)
	ctx, span := Start(ctx, name, resultAttributes(r)...)
	defer func() { End(span, err) }()
	return s.Records.Update(ctx, r, rev)
}

func stamp(ctx context.Context, r *call.Result) {
	if r.TraceID == "" {
		r.TraceID = TraceID(ctx)
	}
}

// TraceHandler returns handle continuing each delivered call's trace: it decodes the call once, extracts
// its TraceParent and runs handle under a consumer span "call.process" (with the call's id, tenant,
// workspace, tool and delivery attempt), so that every span and log line of the call's run joins the
// dispatcher's trace. The Delivery that handle gets answers Call with a copy of that one decoded call; a call
// that does not decode is passed to handle untraced, to be settled there.
func TraceHandler(handle func(context.Context, queue.Delivery)) func(context.Context, queue.Delivery) {
	return func(ctx context.Context, d queue.Delivery) {
		c, err := d.Call()
		if err != nil {
			handle(ctx, d)
			return
		}
		ctx = Extract(ctx, c.TraceParent)
		ctx, span := start(ctx, "call.process", trace.SpanKindConsumer, append(CallAttributes(c),
			semconv.MessagingSystemKey.String("nats"), semconv.MessagingOperationTypeProcess, semconv.MessagingMessageID(c.ID),
			AttrAttempt.Int64(int64(d.Attempt())))...)
		defer span.End()
		handle(context.WithValue(ctx, deliveryKey{}, &deliveryState{}), decoded{Delivery: d, c: c})
	}
}

// deliveryKey marks a context as one delivery's, for TraceWorkerStore to tell its claim from the lease
// renewals that follow.
type deliveryKey struct{}

type deliveryState struct{ claimed atomic.Bool }

// decoded is a Delivery whose call was decoded already.
type decoded struct {
	queue.Delivery
	c *call.Call
}

func (d decoded) Call() (*call.Call, error) {
	c := *d.c
	return &c, nil
}

// TraceRuntime returns next with a span "sandbox" around each Run and, under it, spans "sandbox.create"
// (creating and starting the container), "sandbox.run" (the process's life) and "sandbox.cleanup"
// (killing and removing the container), laid out from the Outcome's SandboxTime, RunTime and CleanupTime
// with explicit timestamps, since the runtime reports them only when Run returns. The sandbox span carries
// each step the runtime timed (Outcome.Steps) as toolpool.sandbox.step.<name>_ms, and
// toolpool.sandbox.warm. The phases are placed
// back to back from the start of Run, and the parent span ends no earlier than the last of them. With
// tracing off only the no-op parent span is made.
func TraceRuntime(next sandbox.Runtime) sandbox.Runtime { return tracedRuntime{next} }

type tracedRuntime struct{ next sandbox.Runtime }

func (t tracedRuntime) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	begin := time.Now()
	ctx, span := otelTracer().Start(ctx, "sandbox", trace.WithTimestamp(begin), trace.WithAttributes(semconv.ContainerID(spec.ID),
		attribute.Int64("toolpool.sandbox.timeout_ms", spec.Limits.Timeout.Milliseconds())))
	out, err := t.next.Run(ctx, spec)
	if !span.IsRecording() {
		span.End()
		return out, err
	}
	span.SetAttributes(
		attribute.Int("toolpool.sandbox.exit_code", out.ExitCode),
		attribute.Bool("toolpool.sandbox.timed_out", out.TimedOut),
		attribute.Bool("toolpool.sandbox.oom_killed", out.OOMKilled),
		attribute.Int64("toolpool.sandbox.max_rss_bytes", out.MaxRSSBytes),
		attribute.Int64("toolpool.sandbox.stdout_bytes", out.Stdout.Total),
		attribute.Int64("toolpool.sandbox.stderr_bytes", out.Stderr.Total),
	)
	if out.Signal != "" {
		span.SetAttributes(attribute.String("toolpool.sandbox.signal", out.Signal))
	}
	for _, step := range out.Steps {
		span.SetAttributes(attribute.Float64("toolpool.sandbox.step."+step.Name+"_ms", float64(step.Took.Microseconds())/1000))
	}
	span.SetAttributes(attribute.Bool("toolpool.sandbox.warm", out.Warm))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	at := begin
	for _, phase := range []struct {
		name string
		d    time.Duration
	}{{"sandbox.create", out.SandboxTime}, {"sandbox.run", out.RunTime}, {"sandbox.cleanup", out.CleanupTime}} {
		if phase.d <= 0 {
			continue
		}
		_, s := otelTracer().Start(ctx, phase.name, trace.WithTimestamp(at))
		at = at.Add(phase.d)
		s.End(trace.WithTimestamp(at))
	}
	// The phases as the runtime measured them can add up to a little more than the wall time seen here;
	// the parent span always encloses them.
	span.End(trace.WithTimestamp(maxTime(time.Now(), at)))
	return out, err
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
