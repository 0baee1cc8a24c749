package metrics

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/sandbox"
)

// WorkerMetrics are a worker's metrics. Build it once per process with NewWorker and wrap the worker's
// collaborators with ObserveWorkerStore, ObserveRuntime and InstrumentHandler. Safe for concurrent use.
type WorkerMetrics struct {
	common
	slots         *slotCollector
	cleanup       prometheus.Histogram
	sandboxErrors *prometheus.CounterVec
	egress        *egressMetrics
}

// NewWorker registers a worker's metrics, the Go and process collectors and toolpool_build_info on reg.
// It panics if reg has any of them already, like prometheus.MustRegister: a registry holds one
// WorkerMetrics.
func NewWorker(reg prometheus.Registerer, opts Options) *WorkerMetrics {
	m := &WorkerMetrics{
		common: newCommon(reg, opts),
		slots: &slotCollector{desc: prometheus.NewDesc(namespace+"_worker_slots",
			"The worker's call slots, by state: busy (running a call) or free.", []string{"state"}, nil)},
		cleanup: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "sandbox_cleanup_seconds",
			Help: "Time to kill and remove a call's container after its process ended.", Buckets: durationBuckets}),
		sandboxErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "sandbox_errors_total",
			Help: "Failures of the container runtime itself, by stage: start (nothing ran; the call is offered again) or run."},
			[]string{"stage"}),
	}
	m.egress = newEgressMetrics(reg)
	m.sandboxErrors.WithLabelValues("start")
	m.sandboxErrors.WithLabelValues("run")
	reg.MustRegister(m.slots, m.cleanup, m.sandboxErrors)
	return m
}

// WatchNATS makes each scrape run check (with the scrape timeout) and report toolpool_nats_connected: 1
// when it returns nil, 0 otherwise. check is typically the queue connection's Ready. Call it at most once.
func (m *WorkerMetrics) WatchNATS(check CheckFunc) { m.watchNATS(check) }

// WatchContainerd makes each scrape run check (with the scrape timeout) and report
// toolpool_containerd_up: 1 when it returns nil, 0 otherwise. check is typically the sandbox runtime's
// Ready. Call it at most once.
func (m *WorkerMetrics) WatchContainerd(check CheckFunc) {
	m.reg.MustRegister(newUpCollector(
		prometheus.NewDesc(namespace+"_containerd_up",
			"Whether the worker's containerd answers (1) or not (0), checked at scrape time.", nil, nil),
		check, m.opts.ScrapeTimeout))
}

// WatchQueue is DispatcherMetrics.WatchQueue, for a worker that should report the queue too (the
// dispatcher's report is enough for the alerts). Call it at most once.
func (m *WorkerMetrics) WatchQueue(state QueueStateFunc) { m.watchQueue(state) }

// InstrumentHandler returns handle, keeping toolpool_worker_slots{state="busy"} at the number of handle
// calls in progress and state="free" at slots minus that. slots must be the concurrency the consumer
// runs handle with (the worker's slot count). Use one InstrumentHandler per WorkerMetrics: the slot count
// of the last one wins. The returned function blocks as long as handle does.
func InstrumentHandler(slots int, handle func(context.Context, queue.Delivery), m *WorkerMetrics) func(context.Context, queue.Delivery) {
	m.slots.capacity.Store(int64(slots))
	return func(ctx context.Context, d queue.Delivery) {
		m.slots.busy.Add(1)
		defer m.slots.busy.Add(-1)
		handle(ctx, d)
	}
}

// slotCollector reports busy and free slots from one counter, so a scrape never sees them sum to anything
// but the capacity.
type slotCollector struct {
	desc     *prometheus.Desc
	capacity atomic.Int64
	busy     atomic.Int64
}

func (s *slotCollector) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }

func (s *slotCollector) Collect(ch chan<- prometheus.Metric) {
	capacity, busy := s.capacity.Load(), s.busy.Load()
	ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, float64(busy), "busy")
	ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, float64(max(capacity-busy, 0)), "free")
}

// ObserveRuntime returns next, timing each container's cleanup (toolpool_sandbox_cleanup_seconds) and
// counting the runtime's own failures (toolpool_sandbox_errors_total): stage "start" for a sandbox.
// ErrNotStarted, "run" for any other error. A Run that ends because ctx was cancelled is not a failure.
// It passes spec, ctx and the results through unchanged.
func ObserveRuntime(next sandbox.Runtime, m *WorkerMetrics) sandbox.Runtime {
	return &observedRuntime{next: next, m: m}
}

type observedRuntime struct {
	next sandbox.Runtime
	m    *WorkerMetrics
}

// ObserveCleanup records one container's removal, which a runtime may finish after Run returns (pass it
// as the runtime's cleanup hook): its duration, and a failure as stage "cleanup".
func (m *WorkerMetrics) ObserveCleanup(took time.Duration, err error) {
	m.cleanup.Observe(took.Seconds())
	if err != nil {
		m.sandboxErrors.WithLabelValues("cleanup").Inc()
	}
}

func (o *observedRuntime) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	out, err := o.next.Run(ctx, spec)
	if out.CleanupTime > 0 {
		o.m.cleanup.Observe(out.CleanupTime.Seconds())
	}
	if err != nil && ctx.Err() == nil {
		stage := "run"
		if errors.Is(err, sandbox.ErrNotStarted) {
			stage = "start"
		}
		o.m.sandboxErrors.WithLabelValues(stage).Inc()
	}
	return out, err
}
