package metrics

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// The closed sets of label values that come from a call record. A value outside its set is counted as
// Overflow, so that a record written by a newer version, or a tool that invents an error type, cannot
// add series.
var (
	knownStatuses = setOf(call.StatusQueued, call.StatusPendingApproval, call.StatusRunning, call.StatusOK,
		call.StatusError, call.StatusTimeout, call.StatusDenied, call.StatusCancelled, call.StatusExpired, call.StatusLost)
	knownActions    = setOf("allow", "ask", "deny")
	knownErrorTypes = setOf(call.ErrInvalidParams, call.ErrNotFound, call.ErrPermissionDenied, call.ErrPolicyDenied,
		call.ErrTimeout, call.ErrOOM, call.ErrExitCode, call.ErrQuota, call.ErrCancelled, call.ErrExpired, call.ErrLost,
		call.ErrInternal)
)

func setOf[T ~string](vs ...T) map[string]bool {
	m := make(map[string]bool, len(vs))
	for _, v := range vs {
		m[string(v)] = true
	}
	return m
}

// callMetrics are the per-call metrics, recorded when a call's final state is written. Both processes
// write final states (the dispatcher for denied, cancelled-while-queued and unpublishable calls, the worker
// for the rest), and exactly one write records each call's final state, so summing a metric over every
// process counts each call once.
type callMetrics struct {
	calls        *prometheus.CounterVec
	errors       *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	queueWait    *prometheus.HistogramVec
	sandboxStart *prometheus.HistogramVec
	run          *prometheus.HistogramVec
	timeouts     *prometheus.CounterVec
	ooms         *prometheus.CounterVec
	truncations  *prometheus.CounterVec
	outputBytes  *prometheus.CounterVec
}

func newCallMetrics() *callMetrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help,
			Buckets: durationBuckets}, labels)
	}
	return &callMetrics{
		calls: counter("calls_total",
			"Calls that reached a final status, by tenant, tool, policy decision (allow, ask, deny) and final status.",
			"tenant", "tool", "decision", "status"),
		errors: counter("call_errors_total",
			"Calls that ended with an error, by tool and error type (internal and lost are toolpool's own failures).",
			"tool", "type"),
		duration: histogram("call_duration_seconds",
			"Time from a call's acceptance to its final status, including queueing, approval and sandbox time.",
			"tool", "status"),
		queueWait: histogram("call_queue_wait_seconds",
			"Time a call waited between its acceptance and a worker claiming it.", "tenant"),
		sandboxStart: histogram("sandbox_start_seconds",
			"Time to create and start a call's container (path cold) or to claim one from the worker's warm pool and start it (path warm).", "tool", "path"),
		run: histogram("call_run_seconds",
			"Time a call's process ran in its container.", "tool"),
		timeouts: counter("call_timeouts_total",
			"Calls killed at their timeout.", "tenant", "tool"),
		ooms: counter("call_oom_kills_total",
			"Calls whose container was killed for running out of memory.", "tenant", "tool"),
		truncations: counter("call_output_truncations_total",
			"Calls whose output was cut to the output cap.", "tenant", "tool"),
		outputBytes: counter("call_output_bytes_total",
			"Bytes of output the calls' processes printed, before truncation.", "tenant", "tool"),
	}
}

func (m *callMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.calls, m.errors, m.duration, m.queueWait, m.sandboxStart, m.run, m.timeouts,
		m.ooms, m.truncations, m.outputBytes}
}

// Describe implements prometheus.Collector.
func (m *callMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *callMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// finished records a call whose final state r has just been written.
func (c *common) finished(r *call.Result) {
	m := c.calls
	tenant, tool := c.tenant(r.Tenant), c.tool(r.Tool)
	status := oneOf(string(r.Status), "unknown", knownStatuses)
	decision := "none"
	if r.Decision != nil {
		decision = oneOf(r.Decision.Action, "none", knownActions)
	}
	m.calls.WithLabelValues(tenant, tool, decision, status).Inc()
	if r.Error != nil {
		m.errors.WithLabelValues(tool, oneOf(r.Error.Type, "unknown", knownErrorTypes)).Inc()
	}
	traceID := validTraceID(r.TraceID)
	switch {
	case r.Timing.TotalMS > 0:
		observe(m.duration.WithLabelValues(tool, status), ms(r.Timing.TotalMS), traceID)
	case !r.CreatedAt.IsZero() && !r.FinishedAt.IsZero() && !r.FinishedAt.Before(r.CreatedAt):
		observe(m.duration.WithLabelValues(tool, status), r.FinishedAt.Sub(r.CreatedAt).Seconds(), traceID)
	}
	if !r.StartedAt.IsZero() {
		observe(m.queueWait.WithLabelValues(tenant), ms(max(r.Timing.QueuedMS, 0)), traceID)
	}
	// A container takes milliseconds to start at the least, so SandboxMS > 0 says one was made; a call that
	// failed before (unknown tool, arguments its plan rejects) has no sandbox or run time to report.
	if r.Timing.SandboxMS > 0 {
		path := "cold"
		if r.Timing.Warm {
			path = "warm"
		}
		observe(m.sandboxStart.WithLabelValues(tool, path), ms(r.Timing.SandboxMS), traceID)
		observe(m.run.WithLabelValues(tool), ms(max(r.Timing.RunMS, 0)), traceID)
	}
	if r.Status == call.StatusTimeout {
		m.timeouts.WithLabelValues(tenant, tool).Inc()
	}
	if r.Error != nil && r.Error.Type == call.ErrOOM {
		m.ooms.WithLabelValues(tenant, tool).Inc()
	}
	if r.Truncated {
		m.truncations.WithLabelValues(tenant, tool).Inc()
	}
	if r.OutputBytes > 0 {
		m.outputBytes.WithLabelValues(tenant, tool).Add(float64(r.OutputBytes))
	}
}

func ms(v int64) float64 { return float64(v) / 1000 }

func observe(o prometheus.Observer, v float64, traceID string) {
	if eo, ok := o.(prometheus.ExemplarObserver); ok && traceID != "" {
		eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": traceID})
		return
	}
	o.Observe(v)
}

// validTraceID returns id when it is a W3C trace id (32 lowercase hex digits, not all zero), and "" so
// that a malformed one never reaches an exemplar (which would panic on an invalid label).
func validTraceID(id string) string {
	if len(id) != 32 {
		return ""
	}
	zero := true
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return ""
		}
		if c != '0' {
			zero = false
		}
	}
	if zero {
		return ""
	}
	return id
}

// ObserveStore returns the dispatcher's call records next, recording every call it creates (toolpool_policy_decisions_total) and every
// final state it writes (toolpool_calls_total, the call histograms and the timeout, OOM, truncation and
// output counters). Only writes that succeed count: a compare-and-set that loses counts nothing, because
// the writer that won records the final state. It adds no calls to next and changes no argument: the
// result keeps next's contract (queue.Records).
func ObserveStore(next queue.Records, m *DispatcherMetrics) queue.Records {
	return &observedStore{Records: next, m: m}
}

type observedStore struct {
	queue.Records
	m *DispatcherMetrics
}

func (s *observedStore) Create(ctx context.Context, r *call.Result) (uint64, error) {
	rev, err := s.Records.Create(ctx, r)
	if err == nil {
		s.m.created(r)
		if r.Status.Terminal() {
			s.m.finished(r)
		}
	}
	return rev, err
}

func (s *observedStore) Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error) {
	next, err := s.Records.Update(ctx, r, rev)
	if err == nil && r.Status.Terminal() {
		s.m.finished(r)
	}
	return next, err
}

// ObserveWorkerStore is ObserveStore for the worker's call records: every final state it writes with
// Update is recorded once, on the worker's /metrics (Create, which a worker calls through its own
// Creator, is passed through).
func ObserveWorkerStore(next queue.Records, m *WorkerMetrics) queue.Records {
	return &observedWorkerStore{Records: next, m: m}
}

type observedWorkerStore struct {
	queue.Records
	m *WorkerMetrics
}

func (s *observedWorkerStore) Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error) {
	next, err := s.Records.Update(ctx, r, rev)
	if err == nil && r.Status.Terminal() {
		s.m.finished(r)
		s.m.egress.finished(r)
	}
	return next, err
}
