// Package metrics exposes toolpool's Prometheus metrics (client_golang) as decorators around the seams the
// services already have: the call Store, the sandbox Runtime, the queue's delivery handler and the HTTP
// handler. cmd/* builds a DispatcherMetrics or a WorkerMetrics on its own registry and wraps its
// implementations with them; the services themselves know nothing of Prometheus.
//
// Every metric is named, typed and documented as Prometheus prescribes (base units, _total, _seconds and
// _bytes suffixes, HELP on every family); docs/observability.md lists them. Every label value is bounded:
// statuses, decisions and error types are mapped onto closed sets, and tenant, tool and rule names are
// capped in distinct values, the excess reported as "other".
package metrics

import (
	"net/http"
	"runtime"
	"runtime/debug"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const namespace = "toolpool"

// Defaults of Options.
const (
	DefaultMaxTenants    = 100
	DefaultScrapeTimeout = 2 * time.Second
	// maxTools and maxRules cap the distinct tool and policy rule label values. Both come from the
	// operator's configuration, so the caps only guard against a misconfiguration.
	maxTools = 256
	maxRules = 128
	// maxLabelLen is the longest label value kept; a longer one counts as "other".
	maxLabelLen = 128
)

// Overflow is the label value that stands for every value past a cap, and for values that are not valid
// label values (not UTF-8, too long).
const Overflow = "other"

// Options configures the metric sets.
type Options struct {
	// TenantLabel fills the tenant label with the call's tenant. Off, the label is always empty, which
	// Prometheus stores as no label at all.
	TenantLabel bool `yaml:"tenant_label"`
	// MaxTenants caps the distinct tenant label values: the first MaxTenants tenants seen keep their
	// name, later ones are counted as "other". Zero means DefaultMaxTenants.
	MaxTenants int `yaml:"max_tenants"`
	// ScrapeTimeout bounds each read a scrape makes of JetStream, containerd or the approvals store.
	// Zero means DefaultScrapeTimeout.
	ScrapeTimeout time.Duration `yaml:"scrape_timeout"`
}

// DefaultOptions are the options the dispatcher and the worker run with unless configured: tenants
// labelled, at most DefaultMaxTenants of them, scrapes bounded by DefaultScrapeTimeout.
func DefaultOptions() Options { return Options{TenantLabel: true}.withDefaults() }

func (o Options) withDefaults() Options {
	if o.MaxTenants <= 0 {
		o.MaxTenants = DefaultMaxTenants
	}
	if o.ScrapeTimeout <= 0 {
		o.ScrapeTimeout = DefaultScrapeTimeout
	}
	return o
}

// durationBuckets are the histogram buckets, in seconds, of every toolpool duration: from 5 milliseconds
// (a warm sandbox start, a cached read) to an hour (a call that waited for a person's approval).
var durationBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// Handler serves the metrics of g in the Prometheus text format, or OpenMetrics (with exemplars that
// carry the trace_id of a call) to a scraper that asks for it.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{EnableOpenMetrics: true})
}

// common is what both processes expose: build info, the Go and process collectors, the per-call metrics
// recorded at the call's final write, and the scrape-time reads of JetStream.
type common struct {
	reg     prometheus.Registerer
	opts    Options
	tenants *bounded
	tools   *bounded
	calls   *callMetrics
	scrape  *prometheus.CounterVec
}

func newCommon(reg prometheus.Registerer, opts Options) common {
	opts = opts.withDefaults()
	c := common{reg: reg, opts: opts, tenants: newBounded(opts.MaxTenants), tools: newBounded(maxTools)}
	c.calls = newCallMetrics()
	c.scrape = newScrapeErrors()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newBuildInfo(),
		c.calls,
		c.scrape,
	)
	return c
}

// tenant is the label value for tenant t.
func (c *common) tenant(t string) string {
	if !c.opts.TenantLabel {
		return ""
	}
	return c.tenants.value(t)
}

func (c *common) tool(t string) string { return c.tools.value(t) }

func (c *common) watchNATS(check CheckFunc) {
	c.reg.MustRegister(newUpCollector(
		prometheus.NewDesc(namespace+"_nats_connected",
			"Whether this process is connected to NATS JetStream (1) or not (0), checked at scrape time.", nil, nil),
		check, c.opts.ScrapeTimeout))
}

func (c *common) watchQueue(state QueueStateFunc) {
	c.reg.MustRegister(newQueueCollector(state, c.opts.ScrapeTimeout, c.scrape.WithLabelValues("queue")))
}

// bounded maps label values onto at most max distinct values: the first max values seen are kept, later
// ones, and any that is not a valid label value, become Overflow. Safe for concurrent use.
type bounded struct {
	mu   sync.Mutex
	max  int
	seen map[string]struct{}
}

func newBounded(max int) *bounded { return &bounded{max: max, seen: map[string]struct{}{}} }

func (b *bounded) value(v string) string {
	if v == "" {
		return "unknown"
	}
	if len(v) > maxLabelLen || !utf8.ValidString(v) {
		return Overflow
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.seen[v]; ok {
		return v
	}
	if len(b.seen) >= b.max {
		return Overflow
	}
	b.seen[v] = struct{}{}
	return v
}

// oneOf returns v when it is in the closed set known, and Overflow otherwise (or none when v is empty).
func oneOf(v, none string, known map[string]bool) string {
	if v == "" {
		return none
	}
	if known[v] {
		return v
	}
	return Overflow
}

func newBuildInfo() prometheus.Collector {
	version, revision := "unknown", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				revision = s.Value
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help:        "A constant 1, labelled with the version, VCS revision and Go version toolpool was built from.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}
