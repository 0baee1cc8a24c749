package dispatcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
	"github.com/toolpool/toolpool/internal/tools"
)

// flakyPublisher fails its first failures publishes, then publishes.
type flakyPublisher struct {
	next     Publisher
	failures atomic.Int32
}

func (f *flakyPublisher) Publish(ctx context.Context, c *call.Call) error {
	if f.failures.Add(-1) >= 0 {
		return errors.New("nats: no response from stream")
	}
	return f.next.Publish(ctx, c)
}

// apiOn serves the API on an in-process JetStream, publishing through pub (which wraps the real queue).
func apiOn(t *testing.T, wrap func(Publisher) Publisher) (*httptest.Server, *jetstream.Conn) {
	t.Helper()
	conn, _ := jstest.Provisioned(t, nil)
	reg, err := tools.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Tenants = []Tenant{{Name: "t", Tokens: []Token{{Token: "t-token"}}}, {Name: "u", Tokens: []Token{{Token: "u-token"}}}}
	pol, err := policy.Parse([]byte("version: 1\ndefault_action: allow\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	api, err := New(cfg, Deps{Store: conn.Records(), Publisher: wrap(conn.Calls()), Tools: reg, Policy: policy.NewStore(pol),
		Approvals: conn.Approvals(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, WithOutputs(conn.Outputs()), WithClock(conn.Now))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(api.Handler())
	t.Cleanup(ts.Close)
	return ts, conn
}

func post(t *testing.T, url, token string, body map[string]any) (int, call.Result) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/calls", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r call.Result
	json.NewDecoder(resp.Body).Decode(&r)
	return resp.StatusCode, r
}

// TestIdempotencyKeyOnJetStream: a retry after a failed publish queues the call (it is not answered with the
// failure); the same key again is the same call; with other arguments it is a 409; another tenant's
// equal key is another call.
func TestIdempotencyKeyOnJetStream(t *testing.T) {
	flaky := &flakyPublisher{}
	flaky.failures.Store(1)
	ts, conn := apiOn(t, func(p Publisher) Publisher { flaky.next = p; return flaky })
	body := map[string]any{"tool": "run_shell", "args": map[string]any{"command": "echo hi"}, "idempotency_key": "k1", "wait": false}
	if code, _ := post(t, ts.URL, "t-token", body); code != http.StatusServiceUnavailable {
		t.Fatalf("first POST with the queue failing: HTTP %d, want 503", code)
	}
	code, first := post(t, ts.URL, "t-token", body)
	if code != http.StatusAccepted || first.Status != call.StatusQueued {
		t.Fatalf("retry after the failed publish: HTTP %d %s, want 202 queued", code, first.Status)
	}
	if st, err := conn.Calls().State(context.Background()); err != nil || st.Pending != 1 {
		t.Fatalf("queue after the retry: %+v %v, want the call queued once", st, err)
	}
	if code, again := post(t, ts.URL, "t-token", body); code != http.StatusAccepted || again.ID != first.ID {
		t.Fatalf("same key again: HTTP %d %s, want the same call %s", code, again.ID, first.ID)
	}
	other := map[string]any{"tool": "run_shell", "args": map[string]any{"command": "rm -rf x"}, "idempotency_key": "k1", "wait": false}
	if code, _ := post(t, ts.URL, "t-token", other); code != http.StatusConflict {
		t.Fatalf("same key, other arguments: HTTP %d, want 409", code)
	}
	if code, theirs := post(t, ts.URL, "u-token", body); code != http.StatusAccepted || theirs.ID == first.ID {
		t.Fatalf("another tenant's equal key: HTTP %d, id %s", code, theirs.ID)
	}
}

// TestSharedRulesKeepEveryReplicasRule: two dispatcher replicas that add approve-always rules at once
// both keep theirs in the shared list.
func TestSharedRulesKeepEveryReplicasRule(t *testing.T) {
	conn, _ := jstest.Provisioned(t, nil)
	ctx := context.Background()
	a := NewSharedRules(conn.SharedState(), "allow_rules", policy.NewStore(policy.Default()))
	b := NewSharedRules(conn.SharedState(), "allow_rules", policy.NewStore(policy.Default()))
	var wg sync.WaitGroup
	for i, rb := range []*SharedRules{a, b, a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rb.AddAllowRule(ctx, "t", "run_shell", []string{"make", fmt.Sprint(i)}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	got := make(chan []byte, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := conn.SharedState().WatchState(wctx, "allow_rules", func(b []byte) {
		select {
		case got <- b:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	var rules []policy.AllowRule
	if err := json.Unmarshal(<-got, &rules); err != nil || len(rules) != 6 {
		t.Fatalf("%d of 6 rules kept: %+v %v", len(rules), rules, err)
	}
	if err := a.AddAllowRule(ctx, "t", "run_shell", nil); err == nil {
		t.Fatal("an invalid rule (run_shell without a prefix) was stored")
	}
}

// TestWorkerRecordedFirst: when the worker that took a call records it before the dispatcher does (its
// Create finds the id taken), the answer is the worker's record, not "queued, not recorded yet".
func TestWorkerRecordedFirst(t *testing.T) {
	h := newHarness(t, setup{})
	h.pub.onPublish = func(c *call.Call) {
		r := call.NewResult(c, call.StatusRunning)
		r.Worker = "w1"
		h.store.Put(r)
	}
	r := h.do(http.MethodPost, "/v1/calls", acmeCaller, map[string]any{"tool": "run_shell", "args": map[string]string{"command": "true"}, "wait": false})
	if res := r.result(t); res.Status != call.StatusRunning || res.Worker != "w1" || res.Output != "" {
		t.Fatalf("HTTP %d %s: want the worker's record, running on w1", r.code, r.body)
	}
}
