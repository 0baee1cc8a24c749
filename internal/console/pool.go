package console

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Config is the console's configuration: the dispatcher's `console:` section.
type Config struct {
	// WorkerMetrics are the workers' metrics endpoints (http://HOST:9091/metrics, the worker's --listen)
	// that the pool page reads each time it is shown; none: the page shows the dispatcher's own metrics.
	WorkerMetrics []string `yaml:"worker_metrics"`
	// WorkerMetricsDNS is a metrics URL whose host name stands for every worker (a headless Service's
	// name on Kubernetes, http://toolpool-worker-metrics.NS.svc:9091/metrics): each time the pool page
	// is shown the name is resolved, and each address found is read as one worker. Empty: none.
	WorkerMetricsDNS string `yaml:"worker_metrics_dns"`
	// ScrapeTimeout bounds each read of a worker's metrics.
	ScrapeTimeout time.Duration `yaml:"scrape_timeout"`
}

// DefaultConfig is the console's configuration before the file.
func DefaultConfig() Config { return Config{ScrapeTimeout: 2 * time.Second} }

// Validate says what to change in a configuration the console cannot use.
func (c Config) Validate() error {
	var errs []error
	for i, u := range c.WorkerMetrics {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			errs = append(errs, fmt.Errorf("console.worker_metrics[%d] %q is not an http(s) URL: give each worker's metrics endpoint, such as http://worker-1:9091/metrics", i, u))
		}
	}
	if u := c.WorkerMetricsDNS; u != "" {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Hostname() == "" {
			errs = append(errs, fmt.Errorf("console.worker_metrics_dns %q is not an http(s) URL: give the workers' metrics endpoint under a name that resolves to each of them, such as http://toolpool-worker-metrics.toolpool.svc:9091/metrics", u))
		}
	}
	if c.ScrapeTimeout <= 0 {
		errs = append(errs, fmt.Errorf("console.scrape_timeout %s must be positive (default %s)", c.ScrapeTimeout, DefaultConfig().ScrapeTimeout))
	}
	return errors.Join(errs...)
}

// Gatherer is the dispatcher's own metrics, as Prometheus scrapes them (prometheus.Gatherer).
type Gatherer interface {
	Gather() ([]*dto.MetricFamily, error)
}

// families are metric families by name.
type families map[string]*dto.MetricFamily

// sum is the sum of the samples of metric name (a counter or gauge) whose labels include match.
func (f families) sum(name string, match map[string]string) (float64, bool) {
	mf := f[name]
	if mf == nil {
		return 0, false
	}
	var total float64
	found := false
	for _, m := range mf.GetMetric() {
		if labelsMatch(m, match) {
			found = true
			total += value(m)
		}
	}
	return total, found
}

// by adds metric name's samples into into, by the value of label.
func (f families) by(name, label string, into map[string]float64) {
	if mf := f[name]; mf != nil {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					into[lp.GetValue()] += value(m)
				}
			}
		}
	}
}

// value is a counter's, gauge's or untyped sample's value.
func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

func labelsMatch(m *dto.Metric, match map[string]string) bool {
	for k, want := range match {
		ok := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == want {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// workerView is one worker as its metrics show it.
type workerView struct {
	URL                       string
	Error                     string
	Busy, Free                float64
	Ready, Creating, Target   float64
	PoolMemory, PoolOldestSec float64
	ContainerdUp              bool
}

// poolView is the pool page: the dispatcher's numbers, each worker's, and the calls per status of all.
type poolView struct {
	Approvals, Queue, QueueOldest float64
	Lanes                         []laneCount // the lanes with calls waiting, by lane number
	NATS                          bool
	Workers                       []workerView
	Busy, Slots                   float64
	Calls                         []statusCount
	Error                         string
}

type laneCount struct {
	Lane  int
	Count float64
}

type statusCount struct {
	Status string
	Count  float64
}

// scrape reads a worker's metrics endpoint.
func (c *Console) scrape(ctx context.Context, u string) (families, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ScrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("read metrics %s: %w", u, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read metrics %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read metrics %s: HTTP %d", u, resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return nil, fmt.Errorf("read metrics %s: %w", u, err)
	}
	return fams, nil
}

// workerEndpoints are the workers' metrics URLs: WorkerMetrics, then one per address that
// WorkerMetricsDNS's host resolves to now (in order), each with the address in place of the name.
func (c *Console) workerEndpoints(ctx context.Context) ([]string, error) {
	endpoints := slices.Clone(c.cfg.WorkerMetrics)
	if c.cfg.WorkerMetricsDNS == "" {
		return endpoints, nil
	}
	u, _ := url.Parse(c.cfg.WorkerMetricsDNS) // checked by Validate
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ScrapeTimeout)
	defer cancel()
	addrs, err := c.lookupHost(ctx, u.Hostname())
	if err != nil {
		return endpoints, fmt.Errorf("find the workers: resolve %s (console.worker_metrics_dns): %w", u.Hostname(), err)
	}
	slices.Sort(addrs)
	for _, a := range addrs {
		one := *u
		one.Host = a
		if port := u.Port(); port != "" {
			one.Host = net.JoinHostPort(a, port)
		} else if strings.Contains(a, ":") {
			one.Host = "[" + a + "]"
		}
		endpoints = append(endpoints, one.String())
	}
	return endpoints, nil
}

// pool gathers the pool page: the dispatcher's metrics in process, every worker's over HTTP at once.
func (c *Console) pool(ctx context.Context) poolView {
	var v poolView
	calls := map[string]float64{}
	if c.metrics != nil {
		mfs, err := c.metrics.Gather()
		if err != nil {
			v.Error = "some of the dispatcher's metrics could not be read: " + err.Error()
		}
		f := families{}
		for _, mf := range mfs {
			f[mf.GetName()] = mf
		}
		v.Approvals, _ = f.sum("toolpool_approvals_pending", nil)
		v.Queue, _ = f.sum("toolpool_queue_pending_calls", nil)
		v.QueueOldest, _ = f.sum("toolpool_queue_oldest_pending_age_seconds", nil)
		lanes := map[string]float64{}
		f.by("toolpool_queue_lane_pending_calls", "lane", lanes)
		for l, n := range lanes {
			if lane, err := strconv.Atoi(l); err == nil && n > 0 {
				v.Lanes = append(v.Lanes, laneCount{lane, n})
			}
		}
		slices.SortFunc(v.Lanes, func(a, b laneCount) int { return a.Lane - b.Lane })
		up, _ := f.sum("toolpool_nats_connected", nil)
		v.NATS = up == 1
		f.by("toolpool_calls_total", "status", calls)
	}
	endpoints, err := c.workerEndpoints(ctx)
	if err != nil {
		v.Error = strings.TrimPrefix(v.Error+"; ", "; ") + err.Error()
	}
	v.Workers = make([]workerView, len(endpoints))
	got := make([]families, len(endpoints))
	var wg sync.WaitGroup
	for i, u := range endpoints {
		wg.Go(func() {
			w := workerView{URL: u}
			f, err := c.scrape(ctx, u)
			if err != nil {
				w.Error = err.Error()
			} else {
				got[i] = f
				w.Busy, _ = f.sum("toolpool_worker_slots", map[string]string{"state": "busy"})
				w.Free, _ = f.sum("toolpool_worker_slots", map[string]string{"state": "free"})
				w.Ready, _ = f.sum("toolpool_pool_containers", map[string]string{"state": "ready"})
				w.Creating, _ = f.sum("toolpool_pool_containers", map[string]string{"state": "creating"})
				w.Target, _ = f.sum("toolpool_pool_target_containers", nil)
				w.PoolMemory, _ = f.sum("toolpool_pool_memory_bytes", nil)
				w.PoolOldestSec, _ = f.sum("toolpool_pool_oldest_age_seconds", nil)
				up, _ := f.sum("toolpool_containerd_up", nil)
				w.ContainerdUp = up == 1
			}
			v.Workers[i] = w
		})
	}
	wg.Wait()
	for i, f := range got {
		if f != nil {
			f.by("toolpool_calls_total", "status", calls)
			v.Busy += v.Workers[i].Busy
			v.Slots += v.Workers[i].Busy + v.Workers[i].Free
		}
	}
	for s, n := range calls {
		v.Calls = append(v.Calls, statusCount{Status: s, Count: n})
	}
	sort.Slice(v.Calls, func(i, j int) bool { return v.Calls[i].Status < v.Calls[j].Status })
	return v
}

// poolPage shows the pool at a glance to approver tokens: its numbers are the whole pool's, every
// tenant's together, which a caller token does not see.
func (c *Console) poolPage(w http.ResponseWriter, r *http.Request, s *session) {
	code, _, err := c.do(r, s, http.MethodGet, "/v1/approvals", nil)
	if err != nil {
		c.failAPI(w, r, s, err)
		return
	}
	if code == http.StatusUnauthorized {
		c.failAPI(w, r, s, &apiError{Code: code})
		return
	}
	if code != http.StatusOK {
		c.fail(w, r, s, http.StatusForbidden, "the pool page shows every tenant's numbers together: it needs a token with role approver")
		return
	}
	c.render(w, r, s, http.StatusOK, "pool", c.pool(r.Context()))
}

// seconds formats a number of seconds for the page, to the second.
func seconds(v float64) string {
	return time.Duration(v * float64(time.Second)).Round(time.Second).String()
}
