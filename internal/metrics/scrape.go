package metrics

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// QueueState is the queue as a scrape reads it.
type QueueState struct {
	Pending uint64        // calls waiting for a worker
	Oldest  time.Duration // how long the oldest of them has waited (0 when none does)
	Lanes   []uint64      // calls waiting in each lane, indexed by lane (nil: not known)
}

// QueueStateFunc reads the queue. It must honour ctx's deadline.
type QueueStateFunc func(ctx context.Context) (QueueState, error)

// CountFunc reads a count, such as the calls waiting for approval. It must honour ctx's deadline.
type CountFunc func(ctx context.Context) (int, error)

// CheckFunc reports whether a dependency can serve: nil when it can. It must honour ctx's deadline.
type CheckFunc func(ctx context.Context) error

func newScrapeErrors() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "metrics_scrape_errors_total",
		Help: "Scrapes that could not read a source of metrics (queue, approvals); its gauges are left out of that scrape.",
	}, []string{"source"})
}

// queueCollector reads the queue's state at scrape time.
type queueCollector struct {
	state   QueueStateFunc
	timeout time.Duration
	errs    prometheus.Counter
	pending *prometheus.Desc
	age     *prometheus.Desc
	lane    *prometheus.Desc
}

func newQueueCollector(state QueueStateFunc, timeout time.Duration, errs prometheus.Counter) *queueCollector {
	return &queueCollector{state: state, timeout: timeout, errs: errs,
		pending: prometheus.NewDesc(namespace+"_queue_pending_calls",
			"Calls in the JetStream queue waiting for a worker, read at scrape time.", nil, nil),
		age: prometheus.NewDesc(namespace+"_queue_oldest_pending_age_seconds",
			"Age of the oldest call waiting for a worker (0 when none waits), read at scrape time.", nil, nil),
		lane: prometheus.NewDesc(namespace+"_queue_lane_pending_calls",
			"Calls waiting for a worker in one lane (tenants are hashed over the lanes), read at scrape time.", []string{"lane"}, nil),
	}
}

func (q *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- q.pending
	ch <- q.age
	ch <- q.lane
}

func (q *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
	defer cancel()
	st, err := q.state(ctx)
	if err != nil {
		q.errs.Inc()
		return
	}
	ch <- prometheus.MustNewConstMetric(q.pending, prometheus.GaugeValue, float64(st.Pending))
	ch <- prometheus.MustNewConstMetric(q.age, prometheus.GaugeValue, max(st.Oldest, 0).Seconds())
	for l, n := range st.Lanes {
		ch <- prometheus.MustNewConstMetric(q.lane, prometheus.GaugeValue, float64(n), strconv.Itoa(l))
	}
}

// countCollector reports a count read at scrape time as a gauge.
type countCollector struct {
	count   CountFunc
	timeout time.Duration
	errs    prometheus.Counter
	desc    *prometheus.Desc
}

func (c *countCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *countCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	n, err := c.count(ctx)
	if err != nil {
		c.errs.Inc()
		return
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n))
}

// upCollector reports 1 when a check passes at scrape time and 0 when it fails or times out.
type upCollector struct {
	desc    *prometheus.Desc
	check   CheckFunc
	timeout time.Duration
}

func newUpCollector(desc *prometheus.Desc, check CheckFunc, timeout time.Duration) *upCollector {
	return &upCollector{desc: desc, check: check, timeout: timeout}
}

func (u *upCollector) Describe(ch chan<- *prometheus.Desc) { ch <- u.desc }

func (u *upCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), u.timeout)
	defer cancel()
	v := 0.0
	if u.check(ctx) == nil {
		v = 1
	}
	ch <- prometheus.MustNewConstMetric(u.desc, prometheus.GaugeValue, v)
}
