package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// QueueStateFunc reads the queue: how many calls wait for a worker, and how long the oldest of them has
// waited (0 when none does). It must honour ctx's deadline.
type QueueStateFunc func(ctx context.Context) (pending uint64, oldest time.Duration, err error)

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
}

func newQueueCollector(state QueueStateFunc, timeout time.Duration, errs prometheus.Counter) *queueCollector {
	return &queueCollector{state: state, timeout: timeout, errs: errs,
		pending: prometheus.NewDesc(namespace+"_queue_pending_calls",
			"Calls in the JetStream queue waiting for a worker, read at scrape time.", nil, nil),
		age: prometheus.NewDesc(namespace+"_queue_oldest_pending_age_seconds",
			"Age of the oldest call waiting for a worker (0 when none waits), read at scrape time.", nil, nil),
	}
}

func (q *queueCollector) Describe(ch chan<- *prometheus.Desc) { ch <- q.pending; ch <- q.age }

func (q *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
	defer cancel()
	pending, oldest, err := q.state(ctx)
	if err != nil {
		q.errs.Inc()
		return
	}
	ch <- prometheus.MustNewConstMetric(q.pending, prometheus.GaugeValue, float64(pending))
	ch <- prometheus.MustNewConstMetric(q.age, prometheus.GaugeValue, max(oldest, 0).Seconds())
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
