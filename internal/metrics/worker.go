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
	sandboxStarts *prometheus.CounterVec
	sandboxSteps  *prometheus.HistogramVec
	egress        *egressMetrics
	images        *imageMetrics
	checkpoints   *checkpointMetrics
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
	m.sandboxStarts = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "sandbox_starts_total",
		Help: "Containers started for calls, by path: warm (claimed from the warm pool) or cold (created for the call), and for cold, why: none (the worker has no pool), empty, mounts, limits, profiles, broken, disabled, draining, runtime, or other."},
		[]string{"path", "cold_reason"})
	m.sandboxSteps = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "sandbox_step_seconds",
		Help:    "Each step of running a call's container and of removing it afterwards (sandbox.Outcome.Steps), by step: image (finding or pulling a call's image), claim, create_container, create_task, bind_workspace, limits, request, wait, start, run, drain_io, usage, workspace_size; delete_task, delete_container, slot; or other.",
		Buckets: stepBuckets}, []string{"step"})
	m.egress = newEgressMetrics(reg)
	m.images = newImageMetrics(reg)
	m.checkpoints = newCheckpointMetrics(reg)
	m.sandboxErrors.WithLabelValues("start")
	m.sandboxErrors.WithLabelValues("run")
	m.sandboxStarts.WithLabelValues("warm", "")
	reg.MustRegister(m.slots, m.cleanup, m.sandboxErrors, m.sandboxStarts, m.sandboxSteps)
	return m
}

// stepBuckets are finer than durationBuckets: most steps of a warm call take well under 5 ms.
var stepBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// steps are the values of sandbox_step_seconds's step label (sandbox.Outcome.Steps and the removal's steps
// of the containerd runtime); any other name counts as Overflow.
var steps = setOf("image", "claim", "create_container", "create_task", "bind_workspace", "limits", "request", "wait", "start", "run",
	"drain_io", "usage", "workspace_size", "delete_task", "delete_container", "slot")

func (m *WorkerMetrics) observeSteps(list []sandbox.Step) {
	for _, s := range list {
		m.sandboxSteps.WithLabelValues(oneOf(s.Name, Overflow, steps)).Observe(s.Took.Seconds())
	}
}

// coldReasons are the values of sandbox_starts_total's cold_reason label (sandbox.Outcome.ColdReason of
// the containerd runtime, and "none" for a runtime without a pool); any other value counts as Overflow.
var coldReasons = setOf("empty", "mounts", "limits", "profiles", "broken", "disabled", "draining", "runtime")

// PoolState is what WatchPool reports of a warm pool at scrape time.
type PoolState struct {
	Ready, Creating, Target int
	MemoryBytes             int64
	OldestAge               time.Duration
	// Created counts the containers made for the pool, CreateFailures the attempts that failed, Discarded
	// those destroyed without serving a call, by reason (max_age, shrink, drain).
	Created, CreateFailures uint64
	Discarded               map[string]uint64
}

// WatchPool makes each scrape report the warm pool that state describes: toolpool_pool_containers (ready
// and creating), toolpool_pool_target_containers, toolpool_pool_memory_bytes,
// toolpool_pool_oldest_age_seconds, toolpool_pool_created_total, toolpool_pool_create_failures_total and
// toolpool_pool_discarded_total{reason}. state must be cheap and safe for concurrent use. Call it at most
// once.
func (m *WorkerMetrics) WatchPool(state func() PoolState) {
	m.reg.MustRegister(&poolCollector{state: state})
}

var (
	poolContainersDesc = prometheus.NewDesc(namespace+"_pool_containers",
		"Containers of the warm pool, by state: ready (waiting for a call) or creating.", []string{"state"}, nil)
	poolTargetDesc = prometheus.NewDesc(namespace+"_pool_target_containers",
		"How many ready containers the warm pool aims to keep now, after its maximum size and memory budget.", nil, nil)
	poolMemoryDesc = prometheus.NewDesc(namespace+"_pool_memory_bytes",
		"Memory the warm pool's ready containers hold (their cgroups and their share of the shims), as last measured.", nil, nil)
	poolAgeDesc = prometheus.NewDesc(namespace+"_pool_oldest_age_seconds",
		"Age of the oldest ready container of the warm pool.", nil, nil)
	poolCreatedDesc = prometheus.NewDesc(namespace+"_pool_created_total",
		"Containers created for the warm pool.", nil, nil)
	poolFailuresDesc = prometheus.NewDesc(namespace+"_pool_create_failures_total",
		"Attempts to create a container for the warm pool that failed.", nil, nil)
	poolDiscardedDesc = prometheus.NewDesc(namespace+"_pool_discarded_total",
		"Ready containers destroyed without serving a call, by reason: max_age, shrink or drain.", []string{"reason"}, nil)
)

type poolCollector struct{ state func() PoolState }

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolContainersDesc, poolTargetDesc, poolMemoryDesc, poolAgeDesc, poolCreatedDesc, poolFailuresDesc, poolDiscardedDesc} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.state()
	ch <- prometheus.MustNewConstMetric(poolContainersDesc, prometheus.GaugeValue, float64(st.Ready), "ready")
	ch <- prometheus.MustNewConstMetric(poolContainersDesc, prometheus.GaugeValue, float64(st.Creating), "creating")
	ch <- prometheus.MustNewConstMetric(poolTargetDesc, prometheus.GaugeValue, float64(st.Target))
	ch <- prometheus.MustNewConstMetric(poolMemoryDesc, prometheus.GaugeValue, float64(st.MemoryBytes))
	ch <- prometheus.MustNewConstMetric(poolAgeDesc, prometheus.GaugeValue, st.OldestAge.Seconds())
	ch <- prometheus.MustNewConstMetric(poolCreatedDesc, prometheus.CounterValue, float64(st.Created))
	ch <- prometheus.MustNewConstMetric(poolFailuresDesc, prometheus.CounterValue, float64(st.CreateFailures))
	for _, reason := range []string{"max_age", "shrink", "drain"} {
		ch <- prometheus.MustNewConstMetric(poolDiscardedDesc, prometheus.CounterValue, float64(st.Discarded[reason]), reason)
	}
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
// each step of its Run (toolpool_sandbox_step_seconds, from Outcome.Steps), counting its starts, warm and cold apart (toolpool_sandbox_starts_total), and counting the runtime's own failures
// (toolpool_sandbox_errors_total): stage "start" for a sandbox.ErrNotStarted, "run" for any other error. A Run that ends because ctx was cancelled is not a failure.
// It passes spec, ctx and the results through unchanged.
func ObserveRuntime(next sandbox.Runtime, m *WorkerMetrics) sandbox.Runtime {
	return &observedRuntime{next: next, m: m}
}

type observedRuntime struct {
	next sandbox.Runtime
	m    *WorkerMetrics
}

// ObserveCleanup records one container's removal, which a runtime may finish after Run returns (pass it
// as the runtime's cleanup hook): its duration, its steps, and a failure as stage "cleanup".
func (m *WorkerMetrics) ObserveCleanup(took time.Duration, steps []sandbox.Step, err error) {
	m.cleanup.Observe(took.Seconds())
	m.observeSteps(steps)
	if err != nil {
		m.sandboxErrors.WithLabelValues("cleanup").Inc()
	}
}

func (o *observedRuntime) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	out, err := o.next.Run(ctx, spec)
	o.m.observeSteps(out.Steps)
	if out.CleanupTime > 0 {
		o.m.cleanup.Observe(out.CleanupTime.Seconds())
	}
	if out.SandboxTime > 0 {
		path, reason := "warm", ""
		if !out.Warm {
			path, reason = "cold", oneOf(out.ColdReason, "none", coldReasons)
		}
		o.m.sandboxStarts.WithLabelValues(path, reason).Inc()
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
