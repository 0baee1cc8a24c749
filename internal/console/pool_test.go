package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// workerMetrics is a worker's /metrics in the text format: 3 of 4 slots busy, a warm pool of 2 ready.
const workerMetrics = `# TYPE toolpool_worker_slots gauge
toolpool_worker_slots{state="busy"} 3
toolpool_worker_slots{state="free"} 1
# TYPE toolpool_pool_containers gauge
toolpool_pool_containers{state="ready"} 2
toolpool_pool_containers{state="creating"} 1
# TYPE toolpool_pool_target_containers gauge
toolpool_pool_target_containers 4
# TYPE toolpool_pool_memory_bytes gauge
toolpool_pool_memory_bytes 2.097152e+07
# TYPE toolpool_pool_oldest_age_seconds gauge
toolpool_pool_oldest_age_seconds 95
# TYPE toolpool_containerd_up gauge
toolpool_containerd_up 1
# TYPE toolpool_calls_total counter
toolpool_calls_total{decision="allow",status="ok",tenant="acme",tool="run_shell"} 40
toolpool_calls_total{decision="allow",status="ok",tenant="globex",tool="read_file"} 2
toolpool_calls_total{decision="allow",status="timeout",tenant="acme",tool="run_shell"} 1
`

func TestPool(t *testing.T) {
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, workerMetrics)
	}))
	defer worker.Close()
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", 500) }))
	defer broken.Close()

	reg := prometheus.NewRegistry()
	gauge := func(name string, v float64) {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name})
		g.Set(v)
		reg.MustRegister(g)
	}
	gauge("toolpool_queue_pending_calls", 7)
	gauge("toolpool_queue_oldest_pending_age_seconds", 12.4)
	gauge("toolpool_approvals_pending", 2)
	gauge("toolpool_nats_connected", 1)
	lanes := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "toolpool_queue_lane_pending_calls"}, []string{"lane"})
	lanes.WithLabelValues("0").Set(0)
	lanes.WithLabelValues("11").Set(2)
	lanes.WithLabelValues("3").Set(5)
	reg.MustRegister(lanes)
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "toolpool_calls_total"}, []string{"tenant", "tool", "decision", "status"})
	calls.WithLabelValues("acme", "run_shell", "deny", "denied").Add(5)
	calls.WithLabelValues("acme", "run_shell", "allow", "ok").Add(1)
	reg.MustRegister(calls)

	cfg := DefaultConfig()
	cfg.WorkerMetrics = []string{worker.URL + "/metrics", broken.URL + "/metrics"}
	con, err := New(cfg, newFakeAPI(), reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	defer srv.Close()
	jar, _ := cookiejar.New(nil)
	b := &browser{t: t, base: srv.URL, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	b.signIn(approverToken)
	resp, page := b.do("GET", "/console/pool", nil, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("pool: HTTP %d\n%s", resp.StatusCode, page)
	}
	for _, want := range []string{
		`id="nats">connected<`, "7 calls waiting for a worker (all lanes), the oldest for 12s", "2 calls waiting for a person",
		`id="queue-lanes">lane 3: 5, lane 11: 2<`,
		`id="slots">3 busy of 4<`, "<td>3 / 1</td><td>2 / 1 (4)</td><td>20.0 MiB</td><td>1m35s</td><td>up</td>",
		"<tr><td>denied</td><td>5</td></tr>", "<tr><td>ok</td><td>43</td></tr>", "<tr><td>timeout</td><td>1</td></tr>",
		"HTTP 500",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the pool page lacks %q", want)
		}
	}
	if strings.Contains(page, "globex") {
		t.Error("the pool page names another tenant")
	}

	// A caller token does not see every tenant's numbers.
	jar, _ = cookiejar.New(nil)
	b.c.Jar = jar
	b.signIn(callerToken)
	if resp, page = b.do("GET", "/console/pool", nil, nil); resp.StatusCode != 403 || !strings.Contains(page, "role approver") {
		t.Errorf("a caller's pool page answered %d:\n%s", resp.StatusCode, page)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	cfg := Config{WorkerMetrics: []string{"http://w1:9091/metrics", "w2:9091", "ftp://x/"}, ScrapeTimeout: 0}
	err := cfg.Validate()
	for _, want := range []string{`worker_metrics[1] "w2:9091"`, `worker_metrics[2] "ftp://x/"`, "scrape_timeout 0s must be positive"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want it to say %q", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "w1") {
		t.Errorf("Validate refused a good URL: %v", err)
	}
	if _, err := New(cfg, newFakeAPI(), nil, slog.New(slog.DiscardHandler)); err == nil {
		t.Error("New took a configuration Validate refuses")
	}
}

// TestPoolFindsWorkersByName: with console.worker_metrics_dns, every address the name resolves to is read
// as a worker (a headless Service on Kubernetes), each time the page is shown; a name that does not
// resolve shows why on the page.
func TestPoolFindsWorkersByName(t *testing.T) {
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# TYPE toolpool_worker_slots gauge\ntoolpool_worker_slots{state=\"busy\"} 1\ntoolpool_worker_slots{state=\"free\"} 3\n")
	}))
	defer worker.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(worker.URL, "http://"))
	cfg := DefaultConfig()
	cfg.WorkerMetricsDNS = "http://toolpool-worker-metrics.test:" + port + "/metrics"
	con, err := New(cfg, newFakeAPI(), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	addrs, lookErr := []string{"127.0.0.1"}, error(nil)
	con.lookupHost = func(_ context.Context, host string) ([]string, error) {
		if host != "toolpool-worker-metrics.test" {
			t.Errorf("resolved %q", host)
		}
		return addrs, lookErr
	}
	srv := httptest.NewServer(con)
	defer srv.Close()
	jar, _ := cookiejar.New(nil)
	b := &browser{t: t, base: srv.URL, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	b.signIn(approverToken)
	_, page := b.do("GET", "/console/pool", nil, nil)
	for _, want := range []string{"http://127.0.0.1:" + port + "/metrics", `id="slots">1 busy of 4<`} {
		if !strings.Contains(page, want) {
			t.Errorf("the pool page lacks %q:\n%s", want, page)
		}
	}
	addrs, lookErr = nil, errors.New("no such host")
	if _, page = b.do("GET", "/console/pool", nil, nil); !strings.Contains(page, "resolve toolpool-worker-metrics.test (console.worker_metrics_dns): no such host") {
		t.Errorf("the pool page does not say why it found no workers:\n%s", page)
	}
	if err := (Config{WorkerMetricsDNS: "toolpool-worker-metrics:9091", ScrapeTimeout: time.Second}).Validate(); err == nil || !strings.Contains(err.Error(), "console.worker_metrics_dns") {
		t.Errorf("Validate of a DNS URL without a scheme: %v", err)
	}
}
