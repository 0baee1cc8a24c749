package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/metrics"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/sandbox"
)

// fakeStore accepts every write, or fails each with err.
type fakeStore struct{ err error }

func (f *fakeStore) Create(ctx context.Context, r *call.Result) (uint64, error) { return 1, f.err }
func (f *fakeStore) Get(ctx context.Context, id string) (queue.Record, error) {
	return queue.Record{}, f.err
}
func (f *fakeStore) Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error) {
	return rev + 1, f.err
}
func (f *fakeStore) Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error) {
	return nil, f.err
}

// sample finds the metric of family name whose labels include want, and returns its value: a counter's or
// gauge's value, or a histogram's sample count.
func sample(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue metric
				}
			}
			return value(mf.GetType(), m), true
		}
	}
	return 0, false
}

func value(typ dto.MetricType, m *dto.Metric) float64 {
	switch typ {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	case dto.MetricType_HISTOGRAM:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return -1
}

func mustSample(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string, want float64) {
	t.Helper()
	got, ok := sample(t, g, name, labels)
	if !ok {
		t.Errorf("%s%v: no such series", name, labels)
		return
	}
	if got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

func mustAbsent(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) {
	t.Helper()
	if got, ok := sample(t, g, name, labels); ok {
		t.Errorf("%s%v = %v, want no series", name, labels, got)
	}
}

var created = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func finished(status call.Status) *call.Result {
	r := &call.Result{ID: call.NewID(), Tenant: "acme", Tool: "run_shell", Status: status,
		Decision: &call.Decision{Action: "allow", Rule: "tool-action"}, CreatedAt: created,
		StartedAt: created.Add(200 * time.Millisecond), FinishedAt: created.Add(2 * time.Second),
		Timing:  call.Timing{QueuedMS: 200, SandboxMS: 80, RunMS: 1500, TotalMS: 2000},
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
	return r
}

func TestObserveStoreCountsFinalWritesOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewDispatcher(reg, metrics.Options{TenantLabel: true})
	ctx := context.Background()
	s := metrics.ObserveStore(&fakeStore{}, m)

	queued := &call.Result{ID: "c_1", Tenant: "acme", Tool: "run_shell", Status: call.StatusQueued,
		Decision: &call.Decision{Action: "allow", Rule: "tool-action"}, CreatedAt: created}
	if _, err := s.Create(ctx, queued); err != nil {
		t.Fatal(err)
	}
	denied := &call.Result{ID: "c_2", Tenant: "acme", Tool: "run_shell", Status: call.StatusDenied,
		Decision: &call.Decision{Action: "deny", Rule: "destructive-command"}, CreatedAt: created, FinishedAt: created,
		Error: &call.ErrorInfo{Type: call.ErrPolicyDenied, Message: "no"}}
	if _, err := s.Create(ctx, denied); err != nil {
		t.Fatal(err)
	}
	mustSample(t, reg, "toolpool_policy_decisions_total", map[string]string{"tenant": "acme", "tool": "run_shell", "action": "allow", "rule": "tool-action"}, 1)
	mustSample(t, reg, "toolpool_policy_decisions_total", map[string]string{"action": "deny", "rule": "destructive-command"}, 1)
	mustSample(t, reg, "toolpool_calls_total", map[string]string{"tenant": "acme", "decision": "deny", "status": "denied"}, 1)
	mustSample(t, reg, "toolpool_call_errors_total", map[string]string{"tool": "run_shell", "type": "policy_denied"}, 1)
	mustAbsent(t, reg, "toolpool_calls_total", map[string]string{"status": "queued"})

	// Non-final writes count nothing.
	queued.Status = call.StatusRunning
	if _, err := s.Update(ctx, queued, 1); err != nil {
		t.Fatal(err)
	}
	mustAbsent(t, reg, "toolpool_calls_total", map[string]string{"status": "running"})

	// A final write that loses its compare-and-set counts nothing: the winner records the call.
	lost := metrics.ObserveStore(&fakeStore{err: queue.ErrConflict}, m)
	cancelled := finished(call.StatusCancelled)
	if _, err := lost.Update(ctx, cancelled, 3); !errors.Is(err, queue.ErrConflict) {
		t.Fatalf("Update = %v, want the store's error", err)
	}
	mustAbsent(t, reg, "toolpool_calls_total", map[string]string{"status": "cancelled"})

	// A final write that wins counts once, with its histograms.
	if _, err := s.Update(ctx, cancelled, 3); err != nil {
		t.Fatal(err)
	}
	mustSample(t, reg, "toolpool_calls_total", map[string]string{"status": "cancelled", "decision": "allow"}, 1)
	mustSample(t, reg, "toolpool_call_duration_seconds", map[string]string{"tool": "run_shell", "status": "cancelled"}, 1)
	mustSample(t, reg, "toolpool_call_queue_wait_seconds", map[string]string{"tenant": "acme"}, 1)
}

func TestObserveWorkerStore(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewWorker(reg, metrics.Options{TenantLabel: true})
	s := metrics.ObserveWorkerStore(&fakeStore{}, m)
	ctx := context.Background()
	write := func(r *call.Result) {
		t.Helper()
		if _, err := s.Update(ctx, r, 1); err != nil {
			t.Fatal(err)
		}
	}
	ok := finished(call.StatusOK)
	ok.Truncated, ok.OutputBytes = true, 4096
	ok.Egress = []call.EgressConn{
		{Host: "proxy.golang.org", Port: 443, Decision: call.EgressAllowed, Connections: 3, BytesUp: 100, BytesDown: 5000},
		{Host: "git.acme.test", Port: 443, Decision: call.EgressAllowed, Credential: "acme-git", Connections: 1, BytesUp: 10, BytesDown: 20},
		{Host: "evil.test", Port: 443, Decision: call.EgressRefused, Rule: "domain-not-allowed", Connections: 2},
		{Host: "x.test", Port: 443, Decision: call.EgressRefused, Rule: "made-up", Connections: 1},
	}
	write(ok)
	write(finished(call.StatusTimeout))
	oom := finished(call.StatusError)
	oom.Error = &call.ErrorInfo{Type: call.ErrOOM}
	oom.Timing.Warm = true // its container came from the warm pool
	write(oom)
	unplanned := finished(call.StatusError) // failed before any sandbox: no start or run time
	unplanned.Timing = call.Timing{QueuedMS: 5, TotalMS: 6}
	unplanned.Error = &call.ErrorInfo{Type: "made_up_by_a_tool"}
	write(unplanned)

	labels := map[string]string{"tenant": "acme", "tool": "run_shell"}
	mustSample(t, reg, "toolpool_calls_total", map[string]string{"status": "ok"}, 1)
	mustSample(t, reg, "toolpool_calls_total", map[string]string{"status": "error"}, 2)
	mustSample(t, reg, "toolpool_call_timeouts_total", labels, 1)
	mustSample(t, reg, "toolpool_call_oom_kills_total", labels, 1)
	mustSample(t, reg, "toolpool_call_output_truncations_total", labels, 1)
	mustSample(t, reg, "toolpool_call_output_bytes_total", labels, 4096)
	mustSample(t, reg, "toolpool_call_errors_total", map[string]string{"type": "oom"}, 1)
	mustSample(t, reg, "toolpool_call_errors_total", map[string]string{"type": metrics.Overflow}, 1)
	mustSample(t, reg, "toolpool_sandbox_start_seconds", map[string]string{"tool": "run_shell", "path": "cold"}, 2)
	mustSample(t, reg, "toolpool_sandbox_start_seconds", map[string]string{"tool": "run_shell", "path": "warm"}, 1)
	mustSample(t, reg, "toolpool_call_run_seconds", map[string]string{"tool": "run_shell"}, 3)
	mustSample(t, reg, "toolpool_call_duration_seconds", map[string]string{"status": "error"}, 2)
	mustSample(t, reg, "toolpool_call_queue_wait_seconds", map[string]string{"tenant": "acme"}, 4)
	mustSample(t, reg, "toolpool_egress_connections_total", map[string]string{"decision": "allowed", "rule": "none"}, 3)
	mustSample(t, reg, "toolpool_egress_connections_total", map[string]string{"decision": "allowed", "rule": "credential-injected"}, 1)
	mustSample(t, reg, "toolpool_egress_connections_total", map[string]string{"decision": "refused", "rule": "domain-not-allowed"}, 2)
	mustSample(t, reg, "toolpool_egress_connections_total", map[string]string{"decision": "refused", "rule": metrics.Overflow}, 1)
	mustSample(t, reg, "toolpool_egress_bytes_total", map[string]string{"direction": "up"}, 110)
	mustSample(t, reg, "toolpool_egress_bytes_total", map[string]string{"direction": "down"}, 5020)
}

func TestTenantLabel(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts metrics.Options
		want []string // the tenant label of tenants a, b, c in turn
	}{
		{"off", metrics.Options{}, []string{"", "", ""}},
		{"on", metrics.Options{TenantLabel: true}, []string{"a", "b", "c"}},
		{"capped", metrics.Options{TenantLabel: true, MaxTenants: 2}, []string{"a", "b", metrics.Overflow}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s := metrics.ObserveWorkerStore(&fakeStore{}, metrics.NewWorker(reg, tc.opts))
			for i, tenant := range []string{"a", "b", "c"} {
				r := finished(call.StatusOK)
				r.Tenant = tenant
				if _, err := s.Update(context.Background(), r, 1); err != nil {
					t.Fatal(err)
				}
				got, ok := sample(t, reg, "toolpool_calls_total", map[string]string{"tenant": tc.want[i]})
				if !ok || got < 1 {
					t.Errorf("tenant %q: no toolpool_calls_total{tenant=%q}", tenant, tc.want[i])
				}
			}
		})
	}
}

func TestPolicyReload(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewDispatcher(reg, metrics.Options{})
	mustSample(t, reg, "toolpool_policy_last_reload_successful", nil, 1)
	mustSample(t, reg, "toolpool_policy_reloads_total", map[string]string{"result": "failure"}, 0)
	m.PolicyReload(errors.New("policy.yaml:3: unknown field"))
	mustSample(t, reg, "toolpool_policy_last_reload_successful", nil, 0)
	mustSample(t, reg, "toolpool_policy_reloads_total", map[string]string{"result": "failure"}, 1)
	m.PolicyReload(nil)
	mustSample(t, reg, "toolpool_policy_last_reload_successful", nil, 1)
	mustSample(t, reg, "toolpool_policy_reloads_total", map[string]string{"result": "success"}, 1)
	if ts, _ := sample(t, reg, "toolpool_policy_last_reload_success_timestamp_seconds", nil); time.Since(time.Unix(int64(ts), 0)) > time.Minute {
		t.Errorf("last reload success timestamp %v is not now", ts)
	}
}

// fakeDelivery stands for a delivery; the slot tests never settle it.
type fakeDelivery struct{ queue.Delivery }

func TestInstrumentHandlerSlots(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewWorker(reg, metrics.Options{})
	release := make(chan struct{})
	started := make(chan struct{}, 3)
	handle := metrics.InstrumentHandler(3, func(ctx context.Context, d queue.Delivery) {
		started <- struct{}{}
		<-release
	}, m)
	mustSample(t, reg, "toolpool_worker_slots", map[string]string{"state": "free"}, 3)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); handle(context.Background(), fakeDelivery{}) }()
	}
	<-started
	<-started
	mustSample(t, reg, "toolpool_worker_slots", map[string]string{"state": "busy"}, 2)
	mustSample(t, reg, "toolpool_worker_slots", map[string]string{"state": "free"}, 1)
	close(release)
	wg.Wait()
	mustSample(t, reg, "toolpool_worker_slots", map[string]string{"state": "busy"}, 0)
	mustSample(t, reg, "toolpool_worker_slots", map[string]string{"state": "free"}, 3)
}

type fakeRuntime struct {
	out sandbox.Outcome
	err error
}

func (f fakeRuntime) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	return f.out, f.err
}

func TestObserveRuntime(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewWorker(reg, metrics.Options{})
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		rt   fakeRuntime
	}{
		{"ran", context.Background(), fakeRuntime{out: sandbox.Outcome{CleanupTime: 30 * time.Millisecond}}},
		{"not started", context.Background(), fakeRuntime{err: fmt.Errorf("create container: %w", sandbox.ErrNotStarted)}},
		{"failed while running", context.Background(), fakeRuntime{out: sandbox.Outcome{CleanupTime: time.Millisecond}, err: errors.New("wait task: eof")}},
		{"cancelled is no failure", cancelled, fakeRuntime{err: context.Canceled}},
		{"warm", context.Background(), fakeRuntime{out: sandbox.Outcome{SandboxTime: 3 * time.Millisecond, Warm: true,
			Steps: []sandbox.Step{{Name: "claim", Took: time.Millisecond}, {Name: "start", Took: 2 * time.Millisecond}, {Name: "a new step"}}}}},
		{"warm again", context.Background(), fakeRuntime{out: sandbox.Outcome{SandboxTime: 4 * time.Millisecond, Warm: true}}},
		{"cold, pool empty", context.Background(), fakeRuntime{out: sandbox.Outcome{SandboxTime: 200 * time.Millisecond, ColdReason: "empty"}}},
		{"cold, no pool", context.Background(), fakeRuntime{out: sandbox.Outcome{SandboxTime: 200 * time.Millisecond}}},
		{"cold, unknown reason", context.Background(), fakeRuntime{out: sandbox.Outcome{SandboxTime: 200 * time.Millisecond, ColdReason: "a new reason"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := metrics.ObserveRuntime(tc.rt, m).Run(tc.ctx, sandbox.Spec{ID: "c_1"})
			if out.CleanupTime != tc.rt.out.CleanupTime || err != tc.rt.err {
				t.Errorf("Run = %v, %v; want what the runtime returned", out, err)
			}
		})
	}
	mustSample(t, reg, "toolpool_sandbox_errors_total", map[string]string{"stage": "start"}, 1)
	mustSample(t, reg, "toolpool_sandbox_errors_total", map[string]string{"stage": "run"}, 1)
	mustSample(t, reg, "toolpool_sandbox_cleanup_seconds", nil, 2)
	mustSample(t, reg, "toolpool_sandbox_step_seconds", map[string]string{"step": "claim"}, 1)
	mustSample(t, reg, "toolpool_sandbox_step_seconds", map[string]string{"step": "start"}, 1)
	mustSample(t, reg, "toolpool_sandbox_step_seconds", map[string]string{"step": metrics.Overflow}, 1)
	mustSample(t, reg, "toolpool_sandbox_starts_total", map[string]string{"path": "warm", "cold_reason": ""}, 2)
	mustSample(t, reg, "toolpool_sandbox_starts_total", map[string]string{"path": "cold", "cold_reason": "empty"}, 1)
	mustSample(t, reg, "toolpool_sandbox_starts_total", map[string]string{"path": "cold", "cold_reason": "none"}, 1)
	mustSample(t, reg, "toolpool_sandbox_starts_total", map[string]string{"path": "cold", "cold_reason": metrics.Overflow}, 1)
}

func TestWatchPool(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewWorker(reg, metrics.Options{})
	m.WatchPool(func() metrics.PoolState {
		return metrics.PoolState{Ready: 3, Creating: 1, Target: 4, MemoryBytes: 48 << 20, OldestAge: 90 * time.Second,
			Created: 10, CreateFailures: 2, Discarded: map[string]uint64{"max_age": 5}}
	})
	mustSample(t, reg, "toolpool_pool_containers", map[string]string{"state": "ready"}, 3)
	mustSample(t, reg, "toolpool_pool_containers", map[string]string{"state": "creating"}, 1)
	mustSample(t, reg, "toolpool_pool_target_containers", nil, 4)
	mustSample(t, reg, "toolpool_pool_memory_bytes", nil, 48<<20)
	mustSample(t, reg, "toolpool_pool_oldest_age_seconds", nil, 90)
	mustSample(t, reg, "toolpool_pool_created_total", nil, 10)
	mustSample(t, reg, "toolpool_pool_create_failures_total", nil, 2)
	mustSample(t, reg, "toolpool_pool_discarded_total", map[string]string{"reason": "max_age"}, 5)
	mustSample(t, reg, "toolpool_pool_discarded_total", map[string]string{"reason": "drain"}, 0)
}

func TestInstrumentHTTPUsesRoutePatterns(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewDispatcher(reg, metrics.Options{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/calls/{id}", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusAccepted) })
	mux.HandleFunc("POST /v1/calls", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("{}")) })
	h := m.InstrumentHTTP(mux)
	for _, req := range []*http.Request{
		httptest.NewRequest("GET", "/v1/calls/c_aaa", nil),
		httptest.NewRequest("GET", "/v1/calls/c_bbb", nil),
		httptest.NewRequest("POST", "/v1/calls", nil),
		httptest.NewRequest("GET", "/nowhere/at/all", nil),
	} {
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	mustSample(t, reg, "toolpool_http_requests_total", map[string]string{"handler": "GET /v1/calls/{id}", "code": "202"}, 2)
	mustSample(t, reg, "toolpool_http_requests_total", map[string]string{"handler": "POST /v1/calls", "code": "200"}, 1)
	mustSample(t, reg, "toolpool_http_requests_total", map[string]string{"handler": "unmatched", "code": "404"}, 1)
	mustSample(t, reg, "toolpool_http_request_duration_seconds", map[string]string{"handler": "GET /v1/calls/{id}"}, 2)
}

func TestScrapeTimeSources(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewDispatcher(reg, metrics.Options{ScrapeTimeout: 50 * time.Millisecond})
	var mu sync.Mutex
	queueErr := error(nil)
	m.WatchQueue(func(ctx context.Context) (metrics.QueueState, error) {
		mu.Lock()
		defer mu.Unlock()
		return metrics.QueueState{Pending: 7, Oldest: 90 * time.Second, Lanes: []uint64{5, 0, 2}}, queueErr
	})
	m.WatchApprovals(func(ctx context.Context) (int, error) { return 2, nil })
	m.WatchNATS(func(ctx context.Context) error {
		<-ctx.Done() // a NATS server that never answers: the scrape timeout ends the check
		return ctx.Err()
	})
	mustSample(t, reg, "toolpool_queue_pending_calls", nil, 7)
	mustSample(t, reg, "toolpool_queue_oldest_pending_age_seconds", nil, 90)
	mustSample(t, reg, "toolpool_queue_lane_pending_calls", map[string]string{"lane": "0"}, 5)
	mustSample(t, reg, "toolpool_queue_lane_pending_calls", map[string]string{"lane": "1"}, 0)
	mustSample(t, reg, "toolpool_queue_lane_pending_calls", map[string]string{"lane": "2"}, 2)
	mustSample(t, reg, "toolpool_approvals_pending", nil, 2)
	mustSample(t, reg, "toolpool_nats_connected", nil, 0)

	mu.Lock()
	queueErr = errors.New("jetstream unavailable")
	mu.Unlock()
	mustAbsent(t, reg, "toolpool_queue_pending_calls", nil)
	// Each gather fails once more; whether a gather sees its own failure depends on collection order.
	if n, _ := sample(t, reg, "toolpool_metrics_scrape_errors_total", map[string]string{"source": "queue"}); n < 1 {
		t.Errorf("toolpool_metrics_scrape_errors_total{source=queue} = %v, want at least 1", n)
	}
}

func TestWorkerUpGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewWorker(reg, metrics.Options{})
	m.WatchNATS(func(ctx context.Context) error { return nil })
	m.WatchContainerd(func(ctx context.Context) error { return errors.New("connection refused") })
	mustSample(t, reg, "toolpool_nats_connected", nil, 1)
	mustSample(t, reg, "toolpool_containerd_up", nil, 0)
	mustSample(t, reg, "toolpool_build_info", nil, 1)
}

// TestImageMetrics checks the image hooks: a pull by its result (its bytes only when it succeeded), a
// call's look-up, the cache's bytes.
func TestImageMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewWorker(reg, metrics.Options{})
	m.ObserveImagePull(1000, time.Second, nil)
	m.ObserveImagePull(500, time.Second, fmt.Errorf("%w: layer 2: device node", sandbox.ErrImageRefused))
	m.ObserveImagePull(0, time.Second, fmt.Errorf("%w: registry down", sandbox.ErrImagePull))
	m.ObserveImageLookup(true)
	m.ObserveImageLookup(true)
	m.ObserveImageLookup(false)
	m.SetImageCacheBytes(4096)
	for _, r := range []string{"ok", "refused", "failed"} {
		mustSample(t, reg, "toolpool_image_pulls_total", map[string]string{"result": r}, 1)
	}
	mustSample(t, reg, "toolpool_image_pull_bytes_total", nil, 1000)
	mustSample(t, reg, "toolpool_image_pull_seconds", nil, 3)
	mustSample(t, reg, "toolpool_image_lookups_total", map[string]string{"result": "hit"}, 2)
	mustSample(t, reg, "toolpool_image_lookups_total", map[string]string{"result": "miss"}, 1)
	mustSample(t, reg, "toolpool_image_cache_bytes", nil, 4096)
}

// TestObserveCleanupSteps checks that a removal's steps, which the runtime reports after Run returned,
// reach toolpool_sandbox_step_seconds.
func TestObserveCleanupSteps(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewWorker(reg, metrics.Options{})
	m.ObserveCleanup(30*time.Millisecond, []sandbox.Step{{Name: "delete_task", Took: 20 * time.Millisecond},
		{Name: "delete_container", Took: 10 * time.Millisecond}}, nil)
	mustSample(t, reg, "toolpool_sandbox_cleanup_seconds", nil, 1)
	mustSample(t, reg, "toolpool_sandbox_step_seconds", map[string]string{"step": "delete_task"}, 1)
	mustSample(t, reg, "toolpool_sandbox_step_seconds", map[string]string{"step": "delete_container"}, 1)
}

func TestWatchRouting(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.NewDispatcher(reg, metrics.Options{})
	m.WatchRouting(func() (uint64, uint64) { return 7, 3 })
	mustSample(t, reg, "toolpool_calls_routed_total", map[string]string{"to": "resident"}, 7)
	mustSample(t, reg, "toolpool_calls_routed_total", map[string]string{"to": "shared"}, 3)
}
