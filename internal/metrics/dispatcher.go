package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/felixge/httpsnoop"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolpool/toolpool/internal/call"
)

// DispatcherMetrics are the dispatcher's metrics. Build it once per process with NewDispatcher and wrap
// the dispatcher's collaborators with ObserveStore and InstrumentHTTP. Safe for concurrent use.
type DispatcherMetrics struct {
	common
	rules        *bounded
	decisions    *prometheus.CounterVec
	reloads      *prometheus.CounterVec
	reloadOK     prometheus.Gauge
	reloadTime   prometheus.Gauge
	httpRequests *prometheus.CounterVec
	httpDuration *prometheus.HistogramVec
}

// NewDispatcher registers the dispatcher's metrics, the Go and process collectors and
// toolpool_build_info on reg. It panics if reg has any of them already, like prometheus.MustRegister: a
// registry holds one DispatcherMetrics. The policy counts as loaded successfully now (the dispatcher
// does not start without a valid policy).
func NewDispatcher(reg prometheus.Registerer, opts Options) *DispatcherMetrics {
	m := &DispatcherMetrics{
		common: newCommon(reg, opts),
		rules:  newBounded(maxRules),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "policy_decisions_total",
			Help: "Policy decisions on calls as they were accepted, by tenant, tool, action (allow, ask, deny) and the rule that decided."},
			[]string{"tenant", "tool", "action", "rule"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "policy_reloads_total",
			Help: "Reloads of the policy file after it changed, by result (success, failure)."}, []string{"result"}),
		reloadOK: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "policy_last_reload_successful",
			Help: "Whether the last policy reload succeeded (1) or failed and the previous policy is still in force (0)."}),
		reloadTime: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "policy_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful policy load."}),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "http_requests_total",
			Help: "HTTP requests answered, by route pattern and status code."}, []string{"handler", "code"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "http_request_duration_seconds",
			Help:    "Time to answer an HTTP request (a waiting POST or long poll includes the wait), by route pattern.",
			Buckets: durationBuckets}, []string{"handler"}),
	}
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	m.reloadOK.Set(1)
	m.reloadTime.SetToCurrentTime()
	reg.MustRegister(m.decisions, m.reloads, m.reloadOK, m.reloadTime, m.httpRequests, m.httpDuration)
	return m
}

// PolicyReload records the result of a policy reload: err is nil when the new policy is in force. It fits
// policy.Store.Watch's onResult.
func (m *DispatcherMetrics) PolicyReload(err error) {
	if err != nil {
		m.reloads.WithLabelValues("failure").Inc()
		m.reloadOK.Set(0)
		return
	}
	m.reloads.WithLabelValues("success").Inc()
	m.reloadOK.Set(1)
	m.reloadTime.SetToCurrentTime()
}

// WatchApprovals makes each scrape read the number of calls waiting for a person's approval (with the
// scrape timeout) as toolpool_approvals_pending. When pending fails the gauge is left out of that scrape
// and toolpool_metrics_scrape_errors_total{source="approvals"} counts it. Call it at most once.
func (m *DispatcherMetrics) WatchApprovals(pending CountFunc) {
	m.reg.MustRegister(&countCollector{count: pending, timeout: m.opts.ScrapeTimeout,
		errs: m.scrape.WithLabelValues("approvals"),
		desc: prometheus.NewDesc(namespace+"_approvals_pending",
			"Calls waiting for a person's approval, read at scrape time.", nil, nil)})
}

// WatchNATS makes each scrape run check (with the scrape timeout) and report toolpool_nats_connected: 1
// when it returns nil, 0 otherwise. check is typically the queue connection's Ready. Call it at most once.
func (m *DispatcherMetrics) WatchNATS(check CheckFunc) { m.watchNATS(check) }

// WatchQueue makes each scrape read the queue's state (with the scrape timeout) and report
// toolpool_queue_pending_calls, toolpool_queue_oldest_pending_age_seconds and
// toolpool_queue_lane_pending_calls{lane}. When state fails, these gauges are left out of that scrape and toolpool_metrics_scrape_errors_total{source="queue"} counts it.
// Call it at most once.
func (m *DispatcherMetrics) WatchQueue(state QueueStateFunc) { m.watchQueue(state) }

// created records a call that has just been accepted and stored.
func (m *DispatcherMetrics) created(r *call.Result) {
	action, rule := "none", "none"
	if r.Decision != nil {
		action = oneOf(r.Decision.Action, "none", knownActions)
		if r.Decision.Rule != "" {
			rule = m.rules.value(r.Decision.Rule)
		}
	}
	m.decisions.WithLabelValues(m.tenant(r.Tenant), m.tool(r.Tool), action, rule).Inc()
}

// InstrumentHTTP returns next, counting and timing every request by its route pattern (r.Pattern, never
// the raw path, so ids in paths add no series) and status code. next must be the http.ServeMux itself, or
// a handler that passes the very *http.Request it got on to the mux: the mux sets the pattern on that
// request, and this reads it after next returns. A request no pattern matched is labelled "unmatched".
func (m *DispatcherMetrics) InstrumentHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		code := http.StatusOK
		wrapped := httpsnoop.Wrap(w, httpsnoop.Hooks{
			WriteHeader: func(next httpsnoop.WriteHeaderFunc) httpsnoop.WriteHeaderFunc {
				wrote := false
				return func(c int) {
					if !wrote && c >= 200 {
						code, wrote = c, true
					}
					next(c)
				}
			},
		})
		defer func() {
			p := recover()
			if p != nil {
				code = http.StatusInternalServerError // net/http aborts the response
			}
			handler := r.Pattern
			if handler == "" {
				handler = "unmatched"
			}
			m.httpRequests.WithLabelValues(handler, strconv.Itoa(code)).Inc()
			m.httpDuration.WithLabelValues(handler).Observe(time.Since(start).Seconds())
			if p != nil {
				panic(p)
			}
		}()
		next.ServeHTTP(wrapped, r)
	})
}

// WatchRouting makes each scrape report toolpool_calls_routed_total{to}: the calls this dispatcher
// queued for their workspace's resident worker (to="resident") and on the shared lanes (to="shared"),
// from counts (dispatcher.HomeRouter's Counts). Call it at most once.
func (m *DispatcherMetrics) WatchRouting(counts func() (resident, shared uint64)) {
	const help = "Calls queued, by where: for their workspace's resident worker (resident) or on the shared lanes (shared)."
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: "calls_routed_total", Help: help,
			ConstLabels: prometheus.Labels{"to": "resident"}}, func() float64 { r, _ := counts(); return float64(r) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: "calls_routed_total", Help: help,
			ConstLabels: prometheus.Labels{"to": "shared"}}, func() float64 { _, s := counts(); return float64(s) }))
}
