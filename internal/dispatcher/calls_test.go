package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
)

// TestIdempotencyKey: a POST retried with the same key, in the body or the Idempotency-Key header, finds
// the call the first one made instead of making a second; keys are per tenant.
func TestIdempotencyKey(t *testing.T) {
	const body = `{"tool":"run_shell","args":{"command":"ls"},"wait":false}`
	withKey := func(key string) string {
		return `{"tool":"run_shell","args":{"command":"ls"},"wait":false,"idempotency_key":"` + key + `"}`
	}
	type post struct {
		token, body string
		header      []string
	}
	tests := []struct {
		name      string
		first     post
		retry     post
		sameCall  bool
		wantID    string // of the first call
		published int
	}{
		{"the header makes a retry find the first call",
			post{acmeCaller, body, []string{"Idempotency-Key", "k1"}}, post{acmeCaller, body, []string{"Idempotency-Key", "k1"}},
			true, idempotentID("acme", "k1"), 1},
		{"the body field makes a retry find the first call",
			post{acmeCaller, withKey("k1"), nil}, post{acmeCaller, withKey("k1"), nil}, true, idempotentID("acme", "k1"), 1},
		{"header and body field name the same key space",
			post{acmeCaller, withKey("k1"), nil}, post{acmeCaller, body, []string{"Idempotency-Key", "k1"}}, true, idempotentID("acme", "k1"), 1},
		{"the body field wins over the header",
			post{acmeCaller, withKey("k1"), []string{"Idempotency-Key", "k2"}}, post{acmeCaller, withKey("k1"), nil}, true, idempotentID("acme", "k1"), 1},
		{"another key makes another call",
			post{acmeCaller, body, []string{"Idempotency-Key", "k1"}}, post{acmeCaller, body, []string{"Idempotency-Key", "k2"}},
			false, idempotentID("acme", "k1"), 2},
		{"another tenant's same key makes another call",
			post{acmeCaller, body, []string{"Idempotency-Key", "k1"}}, post{globexCaller, body, []string{"Idempotency-Key", "k1"}},
			false, idempotentID("acme", "k1"), 2},
		{"no key makes a new call each time", post{acmeCaller, body, nil}, post{acmeCaller, body, nil}, false, "", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, setup{})
			r1 := h.do(http.MethodPost, "/v1/calls", tt.first.token, tt.first.body, tt.first.header...)
			r2 := h.do(http.MethodPost, "/v1/calls", tt.retry.token, tt.retry.body, tt.retry.header...)
			if r1.code != http.StatusAccepted || r2.code != http.StatusAccepted {
				t.Fatalf("HTTP %d then %d: %s / %s", r1.code, r2.code, r1.body, r2.body)
			}
			id1, id2 := r1.result(t).ID, r2.result(t).ID
			if (id1 == id2) != tt.sameCall {
				t.Errorf("ids %s and %s; same call: %v, want %v", id1, id2, id1 == id2, tt.sameCall)
			}
			if tt.wantID != "" && id1 != tt.wantID {
				t.Errorf("id %s, want %s derived from tenant and key", id1, tt.wantID)
			}
			if got := len(h.pub.calls()); got != tt.published {
				t.Errorf("published %d calls, want %d", got, tt.published)
			}
		})
	}
	t.Run("a retry of a finished call returns its result", func(t *testing.T) {
		h := newHarness(t, setup{})
		h.pub.onPublish = h.finishWith(call.StatusOK, 0, "")
		const waiting = `{"tool":"run_shell","args":{"command":"ls"},"idempotency_key":"k9"}`
		first := h.do(http.MethodPost, "/v1/calls", acmeCaller, waiting)
		again := h.do(http.MethodPost, "/v1/calls", acmeCaller, waiting)
		if first.code != http.StatusOK || again.code != http.StatusOK || again.result(t).Status != call.StatusOK ||
			again.result(t).ID != first.result(t).ID || len(h.pub.calls()) != 1 {
			t.Fatalf("HTTP %d then %d, published %d: %s", first.code, again.code, len(h.pub.calls()), again.body)
		}
	})
	t.Run("two requests with one key racing: the later one's record write finds the first's call", func(t *testing.T) {
		h := newHarness(t, setup{})
		h.pub.onPublish = h.finishWith(call.StatusOK, 0, "")
		const waiting = `{"tool":"run_shell","args":{"command":"ls"},"idempotency_key":"k7"}`
		first := h.do(http.MethodPost, "/v1/calls", acmeCaller, waiting)
		// The retry's key lookup misses the record (its race with the first request), so it publishes and
		// creates; the create finds the id taken, and the retry answers with the call found there.
		var missed atomic.Bool
		h.store.FailWith(func(op queuetest.Op, _ string) error {
			if op == queuetest.OpGet && missed.CompareAndSwap(false, true) {
				return queue.ErrNotFound
			}
			return nil
		})
		again := h.do(http.MethodPost, "/v1/calls", acmeCaller, waiting)
		if first.code != http.StatusOK || again.code != http.StatusOK || again.result(t).Status != call.StatusOK || again.result(t).ID != first.result(t).ID {
			t.Fatalf("HTTP %d then %d: %s", first.code, again.code, again.body)
		}
	})
	t.Run("ids are valid call ids", func(t *testing.T) {
		id := idempotentID("acme", "anything at all / with spaces")
		if len(id) != len(call.NewID()) || !strings.HasPrefix(id, "c_") || strings.ToLower(id) != id {
			t.Errorf("id %q is not shaped like call.NewID's", id)
		}
	})
}

// TestLimits: the limits a call runs with are what it asked for, clamped to the config and the policy.
func TestLimits(t *testing.T) {
	tests := []struct {
		name   string
		config func(*Config)
		policy policy.Limits
		body   string
		want   call.Limits
	}{
		{name: "the operator's default output cap",
			config: func(c *Config) { c.DefaultOutputBytes = 5000 },
			body:   `{}`, want: call.Limits{TimeoutMS: 120000, OutputBytes: 5000}},
		{name: "the tenant's output cap over the operator's default",
			config: func(c *Config) { c.Tenants[0].OutputBytes = 60000 },
			body:   `{}`, want: call.Limits{TimeoutMS: 120000, OutputBytes: 60000}},
		{name: "a request's output cap over the tenant's",
			config: func(c *Config) { c.Tenants[0].OutputBytes = 60000 },
			body:   `{"output_bytes":70000}`, want: call.Limits{TimeoutMS: 120000, OutputBytes: 70000}},
		{name: "the tool's default timeout and the configured output cap",
			body: `{}`, want: call.Limits{TimeoutMS: 120000, OutputBytes: 30000}},
		{name: "a tool default above max_timeout is clamped",
			config: func(c *Config) { c.DefaultTimeout, c.MaxTimeout = 30*time.Second, time.Minute },
			body:   `{}`, want: call.Limits{TimeoutMS: 60000, OutputBytes: 30000}},
		{name: "a request's timeout is used",
			body: `{"timeout_ms":1500}`, want: call.Limits{TimeoutMS: 1500, OutputBytes: 30000}},
		{name: "a request's timeout above max_timeout is clamped",
			body: `{"timeout_ms":99999999}`, want: call.Limits{TimeoutMS: (30 * time.Minute).Milliseconds(), OutputBytes: 30000}},
		{name: "policy's timeout clamps the request's",
			policy: policy.Limits{TimeoutMS: 5000}, body: `{"timeout_ms":60000}`, want: call.Limits{TimeoutMS: 5000, OutputBytes: 30000}},
		{name: "policy's timeout clamps the tool's default",
			policy: policy.Limits{TimeoutMS: 5000}, body: `{}`, want: call.Limits{TimeoutMS: 5000, OutputBytes: 30000}},
		{name: "a smaller output cap is used",
			body: `{"output_bytes":2048}`, want: call.Limits{TimeoutMS: 120000, OutputBytes: 2048}},
		{name: "an output cap above max_output_bytes is clamped",
			body: `{"output_bytes":99999999}`, want: call.Limits{TimeoutMS: 120000, OutputBytes: 1 << 20}},
		{name: "policy's output cap clamps the request's",
			policy: policy.Limits{OutputBytes: 4096}, body: `{"output_bytes":8192}`, want: call.Limits{TimeoutMS: 120000, OutputBytes: 4096}},
		{name: "memory passes on (the sandbox caps it), network and domains come from policy only",
			policy: policy.Limits{Network: true, AllowedDomains: []string{"example.com"}}, body: `{"memory_bytes":1048576}`,
			want: call.Limits{TimeoutMS: 120000, OutputBytes: 30000, MemoryBytes: 1 << 20, Network: true, AllowedDomains: []string{"example.com"}}},
		{name: "the tenant's sandbox runtime, from the config only",
			config: func(c *Config) { c.Tenants[0].Runtime = "gvisor" }, body: `{}`,
			want: call.Limits{TimeoutMS: 120000, OutputBytes: 30000, Runtime: "gvisor"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, setup{config: tt.config})
			h.pol.decisions["run_shell"] = policy.Decision{Action: policy.Allow, Rule: "r", Limits: tt.policy}
			var req map[string]any
			if err := json.Unmarshal([]byte(tt.body), &req); err != nil {
				t.Fatal(err)
			}
			req["tool"], req["args"], req["wait"] = "run_shell", map[string]string{"command": "ls"}, false
			if r := h.do(http.MethodPost, "/v1/calls", acmeCaller, req); r.code != http.StatusAccepted {
				t.Fatalf("HTTP %d: %s", r.code, r.body)
			}
			got := h.pub.calls()[0].Limits
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("published limits %+v, want %+v", got, tt.want)
			}
			// The dry run reports the same limits.
			delete(req, "wait")
			r := h.do(http.MethodPost, "/v1/policy/check", acmeCaller, req)
			var check struct{ Limits call.Limits }
			if err := json.Unmarshal(r.body, &check); err != nil || fmt.Sprint(check.Limits) != fmt.Sprint(tt.want) {
				t.Errorf("policy check limits %+v (%v), want %+v", check.Limits, err, tt.want)
			}
		})
	}
	t.Run("deadline_ms shortens the queue deadline, never lengthens it", func(t *testing.T) {
		for _, tc := range []struct {
			deadlineMS int64
			want       time.Duration
		}{{5000, 5 * time.Second}, {int64((time.Hour).Milliseconds()), 10 * time.Minute}} {
			h := newHarness(t, setup{})
			r := h.do(http.MethodPost, "/v1/calls", acmeCaller, map[string]any{"tool": "run_shell", "args": map[string]string{"command": "ls"},
				"wait": false, "deadline_ms": tc.deadlineMS})
			if got := r.result(t).Deadline; !got.Equal(t0.Add(tc.want)) {
				t.Errorf("deadline_ms %d: deadline %v, want %v", tc.deadlineMS, got, t0.Add(tc.want))
			}
		}
	})
}

// TestGetCall covers GET /v1/calls/{id}: a tenant reads only its own calls, a queued call past its
// deadline ends expired, and ?wait long-polls within max_wait.
func TestGetCall(t *testing.T) {
	tests := []struct {
		name    string
		setup   setup
		prepare func(h *harness) string // returns the id to get
		query   string
		token   string
		code    int
		status  call.Status
		errType string
		msg     string
	}{
		{name: "a queued call is 202", prepare: func(h *harness) string { return h.queued("acme", call.StatusQueued) },
			code: http.StatusAccepted, status: call.StatusQueued},
		{name: "a running call is 202", prepare: func(h *harness) string { return h.queued("acme", call.StatusRunning) },
			code: http.StatusAccepted, status: call.StatusRunning},
		{name: "a finished call is 200", prepare: func(h *harness) string { return h.queued("acme", call.StatusOK) },
			code: http.StatusOK, status: call.StatusOK},
		{name: "a denied call is 403", prepare: func(h *harness) string { return h.queued("acme", call.StatusDenied) },
			code: http.StatusForbidden, status: call.StatusDenied},
		{name: "an unknown call is 404", prepare: func(h *harness) string { return "c_nothere" },
			code: http.StatusNotFound, errType: call.ErrNotFound, msg: "no call c_nothere for tenant acme"},
		{name: "another tenant's call is 404", prepare: func(h *harness) string { return h.queued("globex", call.StatusOK) },
			code: http.StatusNotFound, errType: call.ErrNotFound, msg: "for tenant acme"},
		{name: "a store failure is 503", prepare: func(h *harness) string {
			id := h.queued("acme", call.StatusOK)
			h.store.FailWith(failOn(queuetest.OpGet, id, errBoom))
			return id
		}, code: http.StatusServiceUnavailable, errType: call.ErrInternal, msg: "could not read the call"},
		{name: "a queued call past its deadline ends expired", prepare: func(h *harness) string {
			id := h.queued("acme", call.StatusQueued)
			h.clock.Add(h.cfg.QueueTimeout + time.Millisecond)
			return id
		}, code: http.StatusOK, status: call.StatusExpired, errType: call.ErrExpired},
		{name: "a queued call at its deadline is not expired yet", prepare: func(h *harness) string {
			id := h.queued("acme", call.StatusQueued)
			h.clock.Add(h.cfg.QueueTimeout - time.Millisecond)
			return id
		}, code: http.StatusAccepted, status: call.StatusQueued},
		{name: "a worker that claims the call first wins over the expiry", prepare: func(h *harness) string {
			id := h.queued("acme", call.StatusQueued)
			h.clock.Add(h.cfg.QueueTimeout + time.Millisecond)
			h.store.FailWith(func(op queuetest.Op, _ string) error {
				if op == queuetest.OpUpdate {
					r := h.store.Result(id)
					r.Status, r.Worker = call.StatusRunning, "w2"
					h.store.Put(r)
					h.store.FailWith(nil)
					return queue.ErrConflict
				}
				return nil
			})
			return id
		}, code: http.StatusAccepted, status: call.StatusRunning},
		{name: "a bad wait is 400", query: "?wait=soon", prepare: func(h *harness) string { return h.queued("acme", call.StatusQueued) },
			code: http.StatusBadRequest, errType: "invalid_request", msg: `wait="soon" is not a duration`},
		{name: "a negative wait is 400", query: "?wait=-1s", prepare: func(h *harness) string { return h.queued("acme", call.StatusQueued) },
			code: http.StatusBadRequest, errType: "invalid_request", msg: "use e.g. wait=30s"},
		{name: "wait on a finished call answers at once", query: "?wait=1h", prepare: func(h *harness) string { return h.queued("acme", call.StatusOK) },
			code: http.StatusOK, status: call.StatusOK},
		{name: "wait returns the result once the call finishes", query: "?wait=1h", prepare: func(h *harness) string {
			id := h.queued("acme", call.StatusRunning)
			h.store.FailWith(func(op queuetest.Op, _ string) error {
				if op == queuetest.OpWait { // the request waits now: the worker finishes
					go h.finishWith(call.StatusOK, 0, "")(&call.Call{ID: id})
				}
				return nil
			})
			return id
		}, code: http.StatusOK, status: call.StatusOK},
		{name: "wait is bounded by max_wait", query: "?wait=1h",
			setup:   setup{config: func(c *Config) { c.MaxWait = 20 * time.Millisecond }},
			prepare: func(h *harness) string { return h.queued("acme", call.StatusRunning) },
			code:    http.StatusAccepted, status: call.StatusRunning},
		{name: "a wait that fails is 503", query: "?wait=1s", prepare: func(h *harness) string {
			id := h.queued("acme", call.StatusRunning)
			h.store.FailWith(failOn(queuetest.OpWait, id, errBoom))
			return id
		}, code: http.StatusServiceUnavailable, errType: call.ErrInternal, msg: "poll GET /v1/calls/"},
		{name: "a call removed while waited for is 404", query: "?wait=1s", prepare: func(h *harness) string {
			id := h.queued("acme", call.StatusRunning)
			h.store.FailWith(failOn(queuetest.OpWait, id, queue.ErrNotFound))
			return id
		}, code: http.StatusNotFound, errType: call.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.setup)
			id := tt.prepare(h)
			token := tt.token
			if token == "" {
				token = acmeCaller
			}
			r := h.do(http.MethodGet, "/v1/calls/"+id+tt.query, token, nil)
			if tt.status == "" {
				r.wantError(t, tt.code, tt.errType, tt.msg)
				return
			}
			res := r.result(t)
			if r.code != tt.code || res.Status != tt.status || res.ID != id {
				t.Fatalf("HTTP %d status %s id %s, want %d %s %s: %s", r.code, res.Status, res.ID, tt.code, tt.status, id, r.body)
			}
			if tt.errType != "" && (res.Error == nil || res.Error.Type != tt.errType) {
				t.Errorf("error %+v, want type %s", res.Error, tt.errType)
			}
			h.store.FailWith(nil)
			if rec := h.store.Result(id); rec.Status != res.Status {
				t.Errorf("answered %s but the record is %s", res.Status, rec.Status)
			}
		})
	}
}

// TestDeleteCall covers DELETE /v1/calls/{id}: a queued call ends cancelled at once, a running one gets a
// cancel request its worker acts on, a finished one stays as it is, and another tenant's is not found.
func TestDeleteCall(t *testing.T) {
	tests := []struct {
		name       string
		prepare    func(h *harness) string
		token      string
		code       int
		status     call.Status // answered and recorded
		errType    string
		msg        string
		unchanged  bool // the record must be as it was
		wantCancel bool // the record carries a cancel request
	}{
		{name: "a queued call is cancelled at once", prepare: func(h *harness) string { return h.queued("acme", call.StatusQueued) },
			code: http.StatusOK, status: call.StatusCancelled, errType: call.ErrCancelled},
		{name: "a call waiting for approval is cancelled at once", prepare: func(h *harness) string { return h.park("acme", "mkdir x").ID },
			code: http.StatusOK, status: call.StatusCancelled, errType: call.ErrCancelled},
		{name: "a running call is cancelled by its worker", prepare: func(h *harness) string {
			id := h.queued("acme", call.StatusRunning)
			go func() { // the worker watches its record
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if h.store.WaitFor(ctx, id, func(r *call.Result) bool { return r.CancelRequested }) == nil {
					return
				}
				rec, _ := h.store.Get(ctx, id)
				rec.Result.Fail(call.StatusCancelled, call.ErrCancelled, "killed")
				_, _ = h.store.Update(ctx, rec.Result, rec.Revision)
			}()
			return id
		}, code: http.StatusOK, status: call.StatusCancelled, errType: call.ErrCancelled, wantCancel: true},
		{name: "a finished call stays as it is", prepare: func(h *harness) string { return h.queued("acme", call.StatusOK) },
			code: http.StatusOK, status: call.StatusOK, unchanged: true},
		{name: "another tenant's call is 404 and stays as it is", prepare: func(h *harness) string { return h.queued("globex", call.StatusQueued) },
			code: http.StatusNotFound, errType: call.ErrNotFound, msg: "for tenant acme", unchanged: true},
		{name: "an unknown call is 404", prepare: func(h *harness) string { return "c_nothere" },
			code: http.StatusNotFound, errType: call.ErrNotFound},
		{name: "a call that changed meanwhile is looked at again", prepare: func(h *harness) string {
			id := h.queued("acme", call.StatusQueued)
			h.store.FailWith(func(op queuetest.Op, _ string) error {
				if op == queuetest.OpUpdate {
					h.store.FailWith(nil)
					return queue.ErrConflict
				}
				return nil
			})
			return id
		}, code: http.StatusOK, status: call.StatusCancelled, errType: call.ErrCancelled},
		{name: "a call that keeps changing is 409", prepare: func(h *harness) string {
			id := h.queued("acme", call.StatusQueued)
			h.store.FailWith(failOn(queuetest.OpUpdate, id, queue.ErrConflict))
			return id
		}, code: http.StatusConflict, errType: "conflict", msg: "kept changing", unchanged: true},
		{name: "a failure to read is 503", prepare: func(h *harness) string {
			id := h.queued("acme", call.StatusQueued)
			h.store.FailWith(failOn(queuetest.OpGet, id, errBoom))
			return id
		}, code: http.StatusServiceUnavailable, errType: call.ErrInternal, unchanged: true},
		{name: "a failure to write is 503", prepare: func(h *harness) string {
			id := h.queued("acme", call.StatusQueued)
			h.store.FailWith(failOn(queuetest.OpUpdate, id, errBoom))
			return id
		}, code: http.StatusServiceUnavailable, errType: call.ErrInternal, msg: "could not cancel", unchanged: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, setup{})
			id := tt.prepare(h)
			before := h.store.Result(id)
			r := h.do(http.MethodDelete, "/v1/calls/"+id, acmeCaller, nil)
			h.store.FailWith(nil)
			after := h.store.Result(id)
			if tt.unchanged && mustJSON(t, before) != mustJSON(t, after) {
				t.Errorf("the record changed from %+v to %+v", before, after)
			}
			if tt.status == "" {
				r.wantError(t, tt.code, tt.errType, tt.msg)
				return
			}
			res := r.result(t)
			if r.code != tt.code || res.Status != tt.status || after.Status != tt.status {
				t.Fatalf("HTTP %d answered %s recorded %s; want %d %s: %s", r.code, res.Status, after.Status, tt.code, tt.status, r.body)
			}
			if tt.errType != "" && (after.Error == nil || after.Error.Type != tt.errType) {
				t.Errorf("recorded error %+v, want type %s", after.Error, tt.errType)
			}
			if after.CancelRequested != tt.wantCancel {
				t.Errorf("cancel_requested %v, want %v", after.CancelRequested, tt.wantCancel)
			}
			if tt.status == call.StatusCancelled && !tt.wantCancel && !after.FinishedAt.Equal(t0) {
				t.Errorf("finished at %v, want %v", after.FinishedAt, t0)
			}
			if after.Status.Terminal() && h.approvals.has("acme", id) {
				t.Error("the final call is still parked for approval (and counted in toolpool_approvals_pending)")
			}
		})
	}
}

// TestProbes: /healthz answers while the process runs; /readyz runs every check; neither wants a token.
func TestProbes(t *testing.T) {
	var gotDeadline bool
	failing := func(context.Context) error { return errors.New("check nats: DISCONNECTED") }
	ok := func(ctx context.Context) error { _, gotDeadline = ctx.Deadline(); return nil }
	tests := []struct {
		name   string
		path   string
		checks []ReadyChecker
		code   int
		want   map[string]string
	}{
		{"healthz", "/healthz", []ReadyChecker{failing}, http.StatusOK, map[string]string{"status": "ok"}},
		{"ready with no checks", "/readyz", nil, http.StatusOK, map[string]string{"status": "ready"}},
		{"ready when every check passes", "/readyz", []ReadyChecker{ok, ok}, http.StatusOK, map[string]string{"status": "ready"}},
		{"not ready when a check fails", "/readyz", []ReadyChecker{ok, failing}, http.StatusServiceUnavailable,
			map[string]string{"status": "not ready", "error": "check nats: DISCONNECTED"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, setup{ready: tt.checks})
			r := h.do(http.MethodGet, tt.path, "", nil)
			var got map[string]string
			if err := json.Unmarshal(r.body, &got); err != nil || r.code != tt.code || fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("HTTP %d %s, want %d %v", r.code, r.body, tt.code, tt.want)
			}
		})
	}
	if !gotDeadline {
		t.Error("a readiness check ran without a deadline")
	}
}

// TestTools: GET /v1/tools lists the tools the tenant may use, in the format asked for.
func TestTools(t *testing.T) {
	h := newHarness(t, setup{})
	h.pol.disabled["web_fetch"] = true
	r := h.do(http.MethodGet, "/v1/tools", acmeCaller, nil)
	var native struct {
		Tools []struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(r.body, &native); err != nil || r.code != http.StatusOK {
		t.Fatalf("HTTP %d %v: %s", r.code, err, r.body)
	}
	var names []string
	for _, tl := range native.Tools {
		names = append(names, tl.Name)
		if !json.Valid(tl.Schema) || len(tl.Schema) < 10 {
			t.Errorf("tool %s has schema %s", tl.Name, tl.Schema)
		}
	}
	if got := strings.Join(names, ","); got != "read_file,write_file,edit_file,list_files,glob,grep,run_shell,read_output" {
		t.Errorf("tools %s, want every built-in but the disabled web_fetch", got)
	}

	r = h.do(http.MethodGet, "/v1/tools?format=openai", acmeCaller, nil)
	var openai struct {
		Tools []struct {
			Type     string `json:"type"`
			Function struct{ Name string }
		} `json:"tools"`
	}
	if err := json.Unmarshal(r.body, &openai); err != nil || r.code != http.StatusOK || len(openai.Tools) != 8 ||
		openai.Tools[0].Type != "function" || openai.Tools[0].Function.Name != "read_file" {
		t.Errorf("format=openai: HTTP %d %v: %.300s", r.code, err, r.body)
	}
	h.do(http.MethodGet, "/v1/tools?format=yaml", acmeCaller, nil).wantError(t, http.StatusBadRequest, "invalid_request", "yaml")
}

// TestPolicyCheck: POST /v1/policy/check answers what policy decides and with which limits, without
// recording or publishing anything; it refuses what POST /v1/calls refuses.
func TestPolicyCheck(t *testing.T) {
	tests := []struct {
		name     string
		decision policy.Decision
		body     string
		code     int
		wouldRun bool
		errType  string
	}{
		{"allow would run", policy.Decision{Action: policy.Allow, Rule: "read-only-commands", Reason: "allowed"},
			`{"tool":"run_shell","args":{"command":"ls"}}`, http.StatusOK, true, ""},
		{"ask would not run", policy.Decision{Action: policy.Ask, Rule: "mutating-commands", Reason: "needs approval"},
			`{"tool":"run_shell","args":{"command":"mkdir x"}}`, http.StatusOK, false, ""},
		{"deny would not run", policy.Decision{Action: policy.Deny, Rule: "forbidden-commands", Reason: "denied"},
			`{"tool":"run_shell","args":{"command":"rm -rf /"}}`, http.StatusOK, false, ""},
		{"unknown tool is 422", policy.Decision{}, `{"tool":"nope"}`, http.StatusUnprocessableEntity, false, call.ErrInvalidParams},
		{"bad arguments are 422", policy.Decision{}, `{"tool":"run_shell","args":{}}`, http.StatusUnprocessableEntity, false, call.ErrInvalidParams},
		{"malformed JSON is 400", policy.Decision{}, `{"tool":`, http.StatusBadRequest, false, "invalid_request"},
		{"an unknown field is 400", policy.Decision{}, `{"tool":"run_shell","x":1}`, http.StatusBadRequest, false, "invalid_request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, setup{})
			h.pol.decisions["run_shell"] = tt.decision
			r := h.do(http.MethodPost, "/v1/policy/check", acmeCaller, tt.body)
			if h.store.Writes() != 0 || len(h.pub.calls()) != 0 || len(h.approvals.pending) != 0 {
				t.Errorf("a dry run wrote %d records, published %d, parked %d", h.store.Writes(), len(h.pub.calls()), len(h.approvals.pending))
			}
			if tt.errType != "" {
				r.wantError(t, tt.code, tt.errType)
				return
			}
			var got struct {
				Tool     string        `json:"tool"`
				Decision call.Decision `json:"decision"`
				WouldRun bool          `json:"would_run"`
			}
			if err := json.Unmarshal(r.body, &got); err != nil || r.code != tt.code {
				t.Fatalf("HTTP %d %v: %s", r.code, err, r.body)
			}
			want := call.Decision{Action: string(tt.decision.Action), Rule: tt.decision.Rule, Reason: tt.decision.Reason}
			if got.Tool != "run_shell" || !reflect.DeepEqual(got.Decision, want) || got.WouldRun != tt.wouldRun {
				t.Errorf("got %+v, want decision %+v would_run %v", got, want, tt.wouldRun)
			}
			if reqs := h.pol.requests; len(reqs) != 1 || reqs[0].Tenant != "acme" || reqs[0].Kind != "execute" || reqs[0].Facts.Command == "" {
				t.Errorf("policy was asked %+v", reqs)
			}
		})
	}
}

// TestUnknownEndpoint: a path or method the API does not serve is 404 with an error body that points to
// the API.
func TestUnknownEndpoint(t *testing.T) {
	h := newHarness(t, setup{})
	for _, req := range []struct{ method, path string }{
		{http.MethodGet, "/v2/calls"}, {http.MethodPut, "/v1/calls"}, {http.MethodGet, "/"},
	} {
		h.do(req.method, req.path, acmeCaller, nil).wantError(t, http.StatusNotFound, "not_found", "no endpoint "+req.method+" "+req.path)
	}
}

// TestNew: New refuses a config that does not validate, or missing collaborators.
func TestNew(t *testing.T) {
	good := testConfig()
	tests := []struct {
		name string
		edit func(*Config)
		deps func(*Deps)
		want string
	}{
		{"no tenants", func(c *Config) { c.Tenants = nil }, nil, "no tenants"},
		{"a bad tenant name", func(c *Config) { c.Tenants[0].Name = "a.b" }, nil, "has a '.'"},
		{"a tenant listed twice", func(c *Config) { c.Tenants[1].Name = "acme" }, nil, "listed twice"},
		{"a tenant with no tokens", func(c *Config) { c.Tenants[0].Tokens = nil }, nil, "has no tokens"},
		{"a token shared by two tenants", func(c *Config) { c.Tenants[1].Tokens[0].Token = acmeCaller }, nil, "also given to tenant"},
		{"an unknown role", func(c *Config) { c.Tenants[0].Tokens[0].Role = "admin" }, nil, `role "admin"`},
		{"token and sha256 both", func(c *Config) { c.Tenants[0].Tokens[0].SHA256 = strings.Repeat("a", 64) }, nil, "not both"},
		{"a short token", func(c *Config) { c.Tenants[0].Tokens[0].Token = "ab" }, nil, "shorter than 3"},
		{"a sha256 that is not hex", func(c *Config) { c.Tenants[0].Tokens[0] = Token{SHA256: strings.Repeat("z", 64)} }, nil, "not hex"},
		{"no token at all", func(c *Config) { c.Tenants[0].Tokens[0] = Token{} }, nil, "give token"},
		{"a tiny body limit", func(c *Config) { c.MaxBodyBytes = 10 }, nil, "max_body_bytes"},
		{"a default timeout over the max", func(c *Config) { c.DefaultTimeout = time.Hour }, nil, "at most max_timeout"},
		{"no max wait", func(c *Config) { c.MaxWait = 0 }, nil, "max_wait"},
		{"no approval ttl", func(c *Config) { c.ApprovalTTL = 0 }, nil, "approval_ttl"},
		{"no queue timeout", func(c *Config) { c.QueueTimeout = 0 }, nil, "queue_timeout"},
		{"a tiny output cap", func(c *Config) { c.MaxOutputBytes = 1 }, nil, "max_output_bytes"},
		{"no store", nil, func(d *Deps) { d.Store = nil }, "are all required"},
		{"no approvals", nil, func(d *Deps) { d.Approvals = nil }, "are all required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, setup{}) // for a full set of deps
			cfg := testConfig()
			cfg.Tenants = append([]Tenant(nil), good.Tenants...)
			for i := range cfg.Tenants {
				cfg.Tenants[i].Tokens = append([]Token(nil), good.Tenants[i].Tokens...)
			}
			if tt.edit != nil {
				tt.edit(&cfg)
			}
			deps := Deps{Store: h.store, Publisher: h.pub, Tools: h.srv.tools, Policy: h.pol, Approvals: h.approvals, Log: h.srv.log}
			if tt.deps != nil {
				tt.deps(&deps)
			}
			_, err := New(cfg, deps)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: %v, want an error with %q", err, tt.want)
			}
		})
	}
}
