package dispatcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
)

// TestApprovalsNeedTheApproverRole: a caller's token may neither list nor decide approvals.
func TestApprovalsNeedTheApproverRole(t *testing.T) {
	h := newHarness(t, setup{})
	c := h.park("acme", "mkdir x")
	h.do(http.MethodGet, "/v1/approvals", acmeCaller, nil).wantError(t, http.StatusForbidden, call.ErrPermissionDenied, "role approver")
	h.do(http.MethodPost, "/v1/approvals/"+c.ID, acmeCaller, `{"decision":"approve"}`).
		wantError(t, http.StatusForbidden, call.ErrPermissionDenied, "role approver")
	if got := h.store.Result(c.ID).Status; got != call.StatusPendingApproval || len(h.pub.calls()) != 0 {
		t.Errorf("a caller's request changed the call to %s and published %d", got, len(h.pub.calls()))
	}
}

// TestListApprovals: an approver sees the calls of its own tenant that still wait, with what the approval
// binds to; calls past their approval time end expired and are not listed.
func TestListApprovals(t *testing.T) {
	h := newHarness(t, setup{})
	expiring := h.park("acme", "mkdir old")
	h.clock.Add(h.cfg.ApprovalTTL - time.Minute)
	live := h.park("acme", "mkdir new")
	h.park("globex", "mkdir theirs")
	decided := h.park("acme", "mkdir decided")
	r := h.store.Result(decided.ID)
	r.Fail(call.StatusCancelled, call.ErrCancelled, "cancelled")
	h.store.Put(r)
	h.clock.Add(2 * time.Minute) // past the first call's approval time

	reply := h.do(http.MethodGet, "/v1/approvals", acmeApprover, nil)
	var got struct{ Approvals []approvalView }
	if err := json.Unmarshal(reply.body, &got); err != nil || reply.code != http.StatusOK {
		t.Fatalf("HTTP %d %v: %s", reply.code, err, reply.body)
	}
	if len(got.Approvals) != 1 {
		t.Fatalf("listed %d calls, want only %s: %s", len(got.Approvals), live.ID, reply.body)
	}
	v := got.Approvals[0]
	want := approvalView{ID: live.ID, Tool: "run_shell", Workspace: "ws", Args: live.Args, ArgsDigest: live.ArgsDigest,
		Rule: "mutating-commands", Reason: live.Decision.Reason, CreatedAt: live.CreatedAt, ExpiresAt: live.Deadline}
	if mustJSON(t, v) != mustJSON(t, want) {
		t.Errorf("listed %s\nwant   %s", mustJSON(t, v), mustJSON(t, want))
	}
	if st := h.store.Result(expiring.ID); st.Status != call.StatusExpired || st.Error.Type != call.ErrExpired || !strings.Contains(st.Error.Message, "approval expired") {
		t.Errorf("the call past its approval time is %s %+v, want expired", st.Status, st.Error)
	}
	if h.approvals.has("acme", expiring.ID) {
		t.Error("the expired call is still parked")
	}

	t.Run("none is an empty list", func(t *testing.T) {
		h := newHarness(t, setup{})
		if r := h.do(http.MethodGet, "/v1/approvals", globexApprover, nil); r.code != http.StatusOK || string(r.body) != "{\"approvals\":[]}\n" {
			t.Errorf("HTTP %d %s", r.code, r.body)
		}
	})
	t.Run("a failure to list is 503", func(t *testing.T) {
		h := newHarness(t, setup{})
		h.approvals.listErr = errBoom
		h.do(http.MethodGet, "/v1/approvals", acmeApprover, nil).wantError(t, http.StatusServiceUnavailable, call.ErrInternal, "could not list")
	})
}

// TestDecideApproval covers POST /v1/approvals/{id}: approve publishes the parked call, deny ends it,
// and every way the request can be refused leaves the call waiting (or, once it is no longer waiting,
// says so).
func TestDecideApproval(t *testing.T) {
	type outcome struct {
		code      int
		status    call.Status // answered and recorded; "" for an error answer
		errType   string
		msg       string
		published bool
		stillWait bool     // the call still waits for approval, parked
		parked    bool     // the approved call stays parked for the reconciler to queue
		recorded  []string // the recorder's events
		rules     []policy.AllowRule
	}
	tests := []struct {
		name    string
		setup   setup
		token   string
		id      string // to decide on, instead of the parked call's
		body    string
		prepare func(h *harness, c *call.Call) // after the call is parked
		want    outcome
		check   func(t *testing.T, h *harness, c *call.Call)
	}{
		{name: "approve queues and publishes the call", body: `{"decision":"approve"}`,
			want: outcome{code: http.StatusAccepted, status: call.StatusQueued, published: true, recorded: []string{"approved ID acme/alice"}},
			check: func(t *testing.T, h *harness, c *call.Call) {
				p := h.pub.calls()[0]
				if p.ID != c.ID || string(p.Args) != string(c.Args) || p.ArgsDigest != c.ArgsDigest {
					t.Errorf("published %+v, want the parked call", p)
				}
				// The queue deadline counts from the approval, not from the request.
				if want := t0.Add(time.Minute + h.cfg.QueueTimeout); !p.Deadline.Equal(want) || !h.store.Result(c.ID).Deadline.Equal(want) {
					t.Errorf("deadline %v, want %v", p.Deadline, want)
				}
				if out := h.store.Result(c.ID).Output; out != "" {
					t.Errorf("the approved call still says %q", out)
				}
			}},
		{name: "approve with the digest the approver saw", body: `{"decision":"approve","args_digest":"DIGEST"}`,
			want: outcome{code: http.StatusAccepted, status: call.StatusQueued, published: true, recorded: []string{"approved ID acme/alice"}}},
		{name: "deny ends the call denied: 403 with who denied it", body: `{"decision":"deny"}`,
			want: outcome{code: http.StatusForbidden, status: call.StatusDenied, errType: call.ErrPolicyDenied, msg: "a person denied this call (acme/alice)",
				recorded: []string{"rejected ID acme/alice"}},
			check: func(t *testing.T, h *harness, c *call.Call) {
				if got := h.store.Result(c.ID).FinishedAt; !got.Equal(t0.Add(time.Minute)) {
					t.Errorf("finished at %v", got)
				}
			}},
		{name: "deny always adds no rule", body: `{"decision":"deny","always":true,"argv_prefix":["mkdir"]}`,
			want: outcome{code: http.StatusForbidden, status: call.StatusDenied, errType: call.ErrPolicyDenied, recorded: []string{"rejected ID acme/alice"}}},
		{name: "an approver without a name is named by role", token: "acme-approver-2", body: `{"decision":"approve"}`,
			setup: setup{config: func(c *Config) {
				c.Tenants[0].Tokens = append(c.Tenants[0].Tokens, Token{Token: "acme-approver-2", Role: RoleApprover})
			}},
			want: outcome{code: http.StatusAccepted, status: call.StatusQueued, published: true, recorded: []string{"approved ID acme/approver"}}},
		{name: "approve always adds the rule and persists it", body: `{"decision":"approve","always":true,"argv_prefix":["mkdir"]}`,
			want: outcome{code: http.StatusAccepted, status: call.StatusQueued, published: true, recorded: []string{"approved ID acme/alice"},
				rules: []policy.AllowRule{{Tenant: "acme", Tool: "run_shell", ArgvPrefix: []string{"mkdir"}}}},
			check: func(t *testing.T, h *harness, c *call.Call) {
				if h.rulesAdded != 1 {
					t.Errorf("the rule book's onAdded ran %d times, want once", h.rulesAdded)
				}
			}},
		{name: "approve always without a rule book is 400 and approves nothing", setup: setup{noRules: true},
			body: `{"decision":"approve","always":true,"argv_prefix":["mkdir"]}`,
			want: outcome{code: http.StatusBadRequest, errType: "invalid_request", msg: "approve always is not available", stillWait: true}},
		{name: "a rule the rule book refuses is 400 and approves nothing", body: `{"decision":"approve","always":true}`,
			prepare: func(h *harness, _ *call.Call) {
				h.rules.err = errors.New("approving run_shell always needs a command prefix")
			},
			want: outcome{code: http.StatusBadRequest, errType: "invalid_request", msg: "add approve-always rule: approving run_shell always needs a command prefix", stillWait: true}},
		{name: "a bad decision is 400", body: `{"decision":"maybe"}`,
			want: outcome{code: http.StatusBadRequest, errType: "invalid_request", msg: `decision "maybe" must be "approve" or "deny"`, stillWait: true}},
		{name: "no decision is 400", body: `{}`,
			want: outcome{code: http.StatusBadRequest, errType: "invalid_request", msg: `decision "" must be`, stillWait: true}},
		{name: "an unknown field is 400", body: `{"decision":"approve","comment":"ok"}`,
			want: outcome{code: http.StatusBadRequest, errType: "invalid_request", msg: `unknown field "comment"`, stillWait: true}},
		{name: "deny with a reason tells the caller why", body: `{"decision":"deny","reason":"use the staging bucket, not prod"}`,
			want: outcome{code: http.StatusForbidden, status: call.StatusDenied, errType: call.ErrPolicyDenied,
				msg: "a person denied this call (acme/alice): use the staging bucket, not prod; do not retry it as it is", recorded: []string{"rejected ID acme/alice"}}},
		{name: "a reason with approve is 400", body: `{"decision":"approve","reason":"fine"}`,
			want: outcome{code: http.StatusBadRequest, errType: "invalid_request", msg: "a reason goes with a deny", stillWait: true}},
		{name: "a reason of 500 bytes is taken", body: `{"decision":"deny","reason":"` + strings.Repeat("x", 500) + `"}`,
			want: outcome{code: http.StatusForbidden, status: call.StatusDenied, errType: call.ErrPolicyDenied, msg: strings.Repeat("x", 500), recorded: []string{"rejected ID acme/alice"}}},
		{name: "a reason over 500 bytes is 400", body: `{"decision":"deny","reason":"` + strings.Repeat("x", 501) + `"}`,
			want: outcome{code: http.StatusBadRequest, errType: "invalid_request", msg: "the reason is 501 bytes, over the 500-byte limit", stillWait: true}},
		{name: "a reason with control characters is 400", body: `{"decision":"deny","reason":"no\n\u001b[2Jyes"}`,
			want: outcome{code: http.StatusBadRequest, errType: "invalid_request", msg: "control characters", stillWait: true}},
		{name: "malformed JSON is 400", body: `{"decision":`,
			want: outcome{code: http.StatusBadRequest, errType: "invalid_request", stillWait: true}},
		{name: "a body over the limit is 413", body: `{"decision":"approve","argv_prefix":["` + strings.Repeat("x", 5000) + `"]}`,
			want: outcome{code: http.StatusRequestEntityTooLarge, errType: "too_large", stillWait: true}},
		{name: "another digest is 409 digest_mismatch", body: `{"decision":"approve","args_digest":"sha256:0000"}`,
			want: outcome{code: http.StatusConflict, errType: "digest_mismatch", msg: "not sha256:0000", stillWait: true}},
		{name: "another tenant's approver gets 404 and changes nothing", token: globexApprover, body: `{"decision":"approve"}`,
			want: outcome{code: http.StatusNotFound, errType: call.ErrNotFound, msg: "waits for approval", stillWait: true}},
		{name: "another tenant's approver cannot deny either", token: globexApprover, body: `{"decision":"deny"}`,
			want: outcome{code: http.StatusNotFound, errType: call.ErrNotFound, stillWait: true}},
		{name: "an approval past its time is 409 not_pending and the call ends expired", body: `{"decision":"approve"}`,
			prepare: func(h *harness, _ *call.Call) { h.clock.Add(h.cfg.ApprovalTTL) },
			want:    outcome{code: http.StatusConflict, errType: "not_pending", msg: "is expired, no longer waiting"},
			check: func(t *testing.T, h *harness, c *call.Call) {
				r := h.store.Result(c.ID)
				if r.Status != call.StatusExpired || r.Error == nil || r.Error.Type != call.ErrExpired || r.FinishedAt.IsZero() {
					t.Errorf("the record is %s %+v finished %v, want expired", r.Status, r.Error, r.FinishedAt)
				}
			}},
		{name: "a call no longer waiting is 409 not_pending", body: `{"decision":"approve"}`,
			prepare: func(h *harness, c *call.Call) {
				r := h.store.Result(c.ID)
				r.Fail(call.StatusCancelled, call.ErrCancelled, "cancelled")
				h.store.Put(r)
			},
			want: outcome{code: http.StatusConflict, errType: "not_pending", msg: "is cancelled"}},
		{name: "a call that changed meanwhile is 409 conflict", body: `{"decision":"approve"}`,
			prepare: func(h *harness, c *call.Call) { h.store.FailWith(failOn(queuetest.OpUpdate, c.ID, queue.ErrConflict)) },
			want:    outcome{code: http.StatusConflict, errType: "conflict", msg: "list the approvals again", stillWait: true}},
		{name: "a publish failure after approval is 202 queued, left parked for the reconciler to queue", body: `{"decision":"approve"}`,
			prepare: func(h *harness, _ *call.Call) { h.pub.err = errBoom },
			want:    outcome{code: http.StatusAccepted, status: call.StatusQueued, parked: true, recorded: []string{"approved ID acme/alice"}}},
		{name: "a failure to read the approval is 503", body: `{"decision":"approve"}`,
			prepare: func(h *harness, _ *call.Call) { h.approvals.getErr = errBoom },
			want:    outcome{code: http.StatusServiceUnavailable, errType: call.ErrInternal, msg: "could not read the approval", stillWait: true}},
		{name: "a failure to read the call is 503", body: `{"decision":"approve"}`,
			prepare: func(h *harness, c *call.Call) { h.store.FailWith(failOn(queuetest.OpGet, c.ID, errBoom)) },
			want:    outcome{code: http.StatusServiceUnavailable, errType: call.ErrInternal, msg: "could not read the call", stillWait: true}},
		{name: "an unknown call is 404", body: `{"decision":"approve"}`, id: "c_unknown",
			want: outcome{code: http.StatusNotFound, errType: call.ErrNotFound, msg: "no call c_unknown waits", stillWait: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.setup)
			c := h.park("acme", "mkdir build")
			h.clock.Add(time.Minute)
			if tt.prepare != nil {
				tt.prepare(h, c)
			}
			token := tt.token
			if token == "" {
				token = acmeApprover
			}
			id := c.ID
			if tt.id != "" {
				id = tt.id
			}
			r := h.do(http.MethodPost, "/v1/approvals/"+id, token, strings.ReplaceAll(tt.body, "DIGEST", c.ArgsDigest))
			h.store.FailWith(nil)
			h.approvals.getErr = nil
			w := tt.want
			if w.status == "" {
				r.wantError(t, w.code, w.errType, w.msg)
			} else {
				res := r.result(t)
				if r.code != w.code || res.Status != w.status || res.ID != c.ID {
					t.Fatalf("HTTP %d status %s, want %d %s: %s", r.code, res.Status, w.code, w.status, r.body)
				}
				if w.errType != "" && (res.Error == nil || res.Error.Type != w.errType || !strings.Contains(res.Error.Message, w.msg)) {
					t.Errorf("error %+v, want type %s with %q", res.Error, w.errType, w.msg)
				}
				if rec := h.store.Result(c.ID); rec.Status != w.status {
					t.Errorf("recorded %s, answered %s", rec.Status, w.status)
				}
			}
			if got := len(h.pub.calls()) > 0 && h.pub.err == nil; got != w.published {
				t.Errorf("published: %v, want %v", got, w.published)
			}
			stillWaits := h.store.Result(c.ID).Status == call.StatusPendingApproval
			if stillWaits != w.stillWait || h.approvals.has("acme", c.ID) != (w.stillWait || w.parked) {
				t.Errorf("record %s, parked %v; want the call still waiting: %v", h.store.Result(c.ID).Status, h.approvals.has("acme", c.ID), w.stillWait)
			}
			var wantEvents []string
			for _, e := range w.recorded {
				wantEvents = append(wantEvents, strings.Replace(e, "ID", c.ID, 1))
			}
			if got := h.recorder.recorded(); !slices.Equal(got, wantEvents) {
				t.Errorf("recorded %q, want %q", got, wantEvents)
			}
			if fmt.Sprint(h.rules.rules) != fmt.Sprint(w.rules) {
				t.Errorf("rules %+v, want %+v", h.rules.rules, w.rules)
			}
			if tt.check != nil {
				tt.check(t, h, c)
			}
		})
	}
}

// TestAudit covers GET /v1/audit: the tenant's own log, since a duration or a time, at most limit events.
func TestAudit(t *testing.T) {
	event := call.AuditEvent{Time: t0, Event: "accepted", Tenant: "acme", CallID: "c_1", Tool: "run_shell", Status: call.StatusQueued}
	tests := []struct {
		name      string
		setup     setup
		query     string
		token     string
		events    []call.AuditEvent
		err       error
		code      int
		errType   string
		msg       string
		wantQuery auditQuery
	}{
		{name: "the last hour by default, at most 1000", events: []call.AuditEvent{event},
			code: http.StatusOK, wantQuery: auditQuery{"acme", t0.Add(-time.Hour), 1000}},
		{name: "since a duration", query: "?since=24h&limit=10",
			code: http.StatusOK, wantQuery: auditQuery{"acme", t0.Add(-24 * time.Hour), 10}},
		{name: "since a time", query: "?since=2029-12-31T00:00:00Z",
			code: http.StatusOK, wantQuery: auditQuery{"acme", time.Date(2029, 12, 31, 0, 0, 0, 0, time.UTC), 1000}},
		{name: "the largest limit", query: "?limit=10000",
			code: http.StatusOK, wantQuery: auditQuery{"acme", t0.Add(-time.Hour), 10000}},
		{name: "the tenant is the token's", token: globexCaller,
			code: http.StatusOK, wantQuery: auditQuery{"globex", t0.Add(-time.Hour), 1000}},
		{name: "a bad since is 400", query: "?since=yesterday",
			code: http.StatusBadRequest, errType: "invalid_request", msg: `since="yesterday" is neither a duration`},
		{name: "a limit of 0 is 400", query: "?limit=0",
			code: http.StatusBadRequest, errType: "invalid_request", msg: `limit="0" must be a number from 1 to 10000`},
		{name: "a limit over 10000 is 400", query: "?limit=10001",
			code: http.StatusBadRequest, errType: "invalid_request", msg: "from 1 to 10000"},
		{name: "a limit that is not a number is 400", query: "?limit=all",
			code: http.StatusBadRequest, errType: "invalid_request", msg: `limit="all"`},
		{name: "a failure to read is 503", err: errBoom,
			code: http.StatusServiceUnavailable, errType: call.ErrInternal, msg: "could not read the audit log"},
		{name: "no audit log is 404", setup: setup{noAudit: true},
			code: http.StatusNotFound, errType: call.ErrNotFound, msg: "keeps no audit log"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.setup)
			h.audit.events, h.audit.err = tt.events, tt.err
			token := tt.token
			if token == "" {
				token = acmeCaller
			}
			r := h.do(http.MethodGet, "/v1/audit"+tt.query, token, nil)
			if tt.errType != "" {
				r.wantError(t, tt.code, tt.errType, tt.msg)
				if tt.code == http.StatusBadRequest && len(h.audit.asked) != 0 {
					t.Errorf("a refused request read the log: %+v", h.audit.asked)
				}
				return
			}
			var got struct {
				Events []call.AuditEvent `json:"events"`
			}
			if err := json.Unmarshal(r.body, &got); err != nil || r.code != tt.code || got.Events == nil || len(got.Events) != len(tt.events) {
				t.Fatalf("HTTP %d %v: %s", r.code, err, r.body)
			}
			if len(h.audit.asked) != 1 || h.audit.asked[0] != tt.wantQuery {
				t.Errorf("read the log with %+v, want %+v", h.audit.asked, tt.wantQuery)
			}
		})
	}
}
