package metrics_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/metrics"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/sandbox"
)

// exercised returns a dispatcher's and a worker's registry after using every metric once, so that every
// family has samples.
func exercised(t *testing.T) map[string]*prometheus.Registry {
	t.Helper()
	ctx := context.Background()
	finalWrites := func(update func(context.Context, *call.Result, uint64) (uint64, error)) {
		ok := finished(call.StatusOK)
		ok.Truncated, ok.OutputBytes = true, 1<<20
		timeout := finished(call.StatusTimeout)
		oom := finished(call.StatusError)
		oom.Error = &call.ErrorInfo{Type: call.ErrOOM, Message: "out of memory"}
		for _, r := range []*call.Result{ok, timeout, oom} {
			if _, err := update(ctx, r, 1); err != nil {
				t.Fatal(err)
			}
		}
	}

	dreg := prometheus.NewRegistry()
	d := metrics.NewDispatcher(dreg, metrics.Options{TenantLabel: true})
	store := metrics.ObserveStore(&fakeStore{}, d)
	if _, err := store.Create(ctx, &call.Result{ID: "c_1", Tenant: "acme", Tool: "run_shell", Status: call.StatusQueued,
		Decision: &call.Decision{Action: "allow", Rule: "tool-action"}}); err != nil {
		t.Fatal(err)
	}
	finalWrites(store.Update)
	d.PolicyReload(nil)
	d.PolicyReload(errors.New("bad policy"))
	d.WatchApprovals(func(ctx context.Context) (int, error) { return 1, nil })
	d.WatchNATS(func(ctx context.Context) error { return nil })
	d.WatchRouting(func() (uint64, uint64) { return 2, 1 })
	d.WatchQueue(func(ctx context.Context) (metrics.QueueState, error) {
		return metrics.QueueState{Pending: 2, Oldest: 3 * time.Second, Lanes: []uint64{0, 2}}, nil
	})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/calls", func(w http.ResponseWriter, r *http.Request) {})
	d.InstrumentHTTP(mux).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/calls", nil))

	wreg := prometheus.NewRegistry()
	w := metrics.NewWorker(wreg, metrics.Options{})
	finalWrites(metrics.ObserveWorkerStore(&fakeStore{}, w).Update)
	metrics.InstrumentHandler(4, func(context.Context, queue.Delivery) {}, w)(ctx, fakeDelivery{})
	rt := metrics.ObserveRuntime(fakeRuntime{out: sandbox.Outcome{CleanupTime: 40 * time.Millisecond,
		Steps: []sandbox.Step{{Name: "claim", Took: time.Millisecond}}},
		err: sandbox.ErrNotStarted}, w)
	if _, err := rt.Run(ctx, sandbox.Spec{ID: "c_1"}); err == nil {
		t.Fatal("the fake runtime's error was lost")
	}
	w.WatchNATS(func(ctx context.Context) error { return nil })
	w.WatchContainerd(func(ctx context.Context) error { return nil })
	w.WatchPool(func() metrics.PoolState { return metrics.PoolState{Ready: 2, Target: 2, MemoryBytes: 1 << 25} })
	w.WatchQueue(func(ctx context.Context) (metrics.QueueState, error) { return metrics.QueueState{}, nil })
	return map[string]*prometheus.Registry{"dispatcher": dreg, "worker": wreg}
}

// scrape renders h's metrics as Prometheus scrapes them in the text format.
func scrape(t *testing.T, g prometheus.Gatherer) []byte {
	t.Helper()
	rec := httptest.NewRecorder()
	metrics.Handler(g).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	body, _ := io.ReadAll(rec.Body)
	return body
}

// TestExpositionPassesLint renders both processes' /metrics and checks them with client_golang's promlint
// and with `promtool check metrics`, Prometheus's own linter.
func TestExpositionPassesLint(t *testing.T) {
	promtool, lookErr := exec.LookPath("promtool")
	for name, reg := range exercised(t) {
		t.Run(name, func(t *testing.T) {
			body := scrape(t, reg)
			problems, err := promlint.New(bytes.NewReader(body)).Lint()
			if err != nil {
				t.Fatalf("promlint: %v", err)
			}
			for _, p := range problems {
				t.Errorf("promlint: %s: %s", p.Metric, p.Text)
			}
			if lookErr != nil {
				if os.Getenv("CI") == "true" {
					t.Fatal("promtool is not installed: install Debian's prometheus package (apt-get install prometheus), which provides /usr/bin/promtool")
				}
				t.Skip("promtool is not installed (apt-get install prometheus); skipping promtool check metrics")
			}
			cmd := exec.Command(promtool, "check", "metrics")
			cmd.Stdin = bytes.NewReader(body)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("promtool check metrics: %v\n%s\n--- the exposition:\n%s", err, out, body)
			}
		})
	}
}

// families returns every metric family name the two processes expose, with its type.
func families(t *testing.T) map[string]dto.MetricType {
	t.Helper()
	names := map[string]dto.MetricType{}
	for _, reg := range exercised(t) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			names[mf.GetName()] = mf.GetType()
		}
	}
	return names
}

var metricName = regexp.MustCompile(`\btoolpool_[a-z0-9_]+`)

// undefined returns the toolpool_ metric names text uses that no family defines, allowing the _bucket,
// _sum and _count series of histograms.
func undefined(text string, fams map[string]dto.MetricType) []string {
	var bad []string
	for _, name := range metricName.FindAllString(text, -1) {
		if _, ok := fams[name]; ok {
			continue
		}
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			base = strings.TrimSuffix(base, suffix)
		}
		if fams[base] == dto.MetricType_HISTOGRAM && base != name {
			continue
		}
		bad = append(bad, name)
	}
	return bad
}

func repoFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDashboard checks deploy/grafana/toolpool.json: valid JSON of a dashboard whose panels all use the
// ${datasource} variable and whose queries use only metrics toolpool defines.
func TestDashboard(t *testing.T) {
	fams := families(t)
	var dash struct {
		UID           string `json:"uid"`
		Title         string `json:"title"`
		SchemaVersion int    `json:"schemaVersion"`
		Templating    struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []json.RawMessage `json:"panels"`
	}
	raw := repoFile(t, "deploy/grafana/toolpool.json")
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("deploy/grafana/toolpool.json is not valid JSON: %v", err)
	}
	if dash.UID == "" || dash.Title == "" || dash.SchemaVersion < 36 {
		t.Errorf("dashboard uid %q, title %q, schemaVersion %d: want all set, schemaVersion >= 36", dash.UID, dash.Title, dash.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = v.Type
	}
	for name, typ := range map[string]string{"datasource": "datasource", "tenant": "query", "tool": "query"} {
		if vars[name] != typ {
			t.Errorf("template variable %s is %q, want type %q", name, vars[name], typ)
		}
	}

	type target struct {
		Expr string `json:"expr"`
	}
	type panel struct {
		ID         int    `json:"id"`
		Title      string `json:"title"`
		Type       string `json:"type"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"`
	}
	ids := map[int]string{}
	queries := 0
	var exprs []string
	var check func(p panel)
	check = func(p panel) {
		if prev, ok := ids[p.ID]; ok {
			t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		for _, c := range p.Panels {
			check(c)
		}
		if p.Type == "row" {
			return
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not use the ${datasource} variable", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			queries++
			exprs = append(exprs, tg.Expr)
			if bad := undefined(tg.Expr, fams); len(bad) > 0 {
				t.Errorf("panel %q queries metrics toolpool does not define: %v", p.Title, bad)
			}
		}
	}
	for _, r := range dash.Panels {
		var p panel
		if err := json.Unmarshal(r, &p); err != nil {
			t.Fatalf("panel: %v", err)
		}
		check(p)
	}
	if queries < 10 {
		t.Errorf("the dashboard has %d queries; want its panels for traffic, errors, latency, queue, saturation, policy and sandboxes", queries)
	}
	// Template variable queries too.
	if bad := undefined(string(raw), fams); len(bad) > 0 {
		t.Errorf("the dashboard names metrics toolpool does not define: %v", bad)
	}
	checkPromQL(t, exprs)
}

// checkPromQL parses each expression with promtool (as recording rules, after putting values in for
// Grafana's variables), when promtool is installed.
func checkPromQL(t *testing.T, exprs []string) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is not installed: install Debian's prometheus package (apt-get install prometheus)")
		}
		t.Log("promtool is not installed; the dashboard's PromQL is not parsed")
		return
	}
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__range", "1h", "$tenant", ".*", "$tool", ".*")
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for i, e := range exprs {
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:query%d", i), Expr: vars.Replace(e)})
	}
	out, err := yaml.Marshal(map[string]any{"groups": []map[string]any{{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	if msg, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("the dashboard's PromQL does not parse: %v\n%s", err, msg)
	}
}

// TestAlertRulesUseDefinedMetrics checks that every expression of deploy/prometheus/alerts.yaml, and every
// series its unit tests feed in, uses only metrics toolpool defines.
func TestAlertRulesUseDefinedMetrics(t *testing.T) {
	fams := families(t)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(repoFile(t, "deploy/prometheus/alerts.yaml"), &rules); err != nil {
		t.Fatalf("deploy/prometheus/alerts.yaml: %v", err)
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if bad := undefined(r.Expr, fams); len(bad) > 0 {
				t.Errorf("alert %s uses metrics toolpool does not define: %v", r.Alert, bad)
			}
		}
	}
	if n == 0 {
		t.Fatal("alerts.yaml has no rules")
	}
	if bad := undefined(string(repoFile(t, "deploy/prometheus/alerts_test.yaml")), fams); len(bad) > 0 {
		t.Errorf("alerts_test.yaml feeds series toolpool does not define: %v", bad)
	}
}

// TestDocsListEveryMetric checks that docs/observability.md names every toolpool metric, and no other.
func TestDocsListEveryMetric(t *testing.T) {
	fams := families(t)
	doc := string(repoFile(t, "docs/observability.md"))
	var missing []string
	for name := range fams {
		if strings.HasPrefix(name, "toolpool_") && !strings.Contains(doc, "`"+name+"`") {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("docs/observability.md does not document %v", missing)
	}
	if bad := undefined(doc, fams); len(bad) > 0 {
		t.Errorf("docs/observability.md names metrics toolpool does not define: %v", bad)
	}
}
