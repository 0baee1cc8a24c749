package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
)

// TestAuthentication: every API endpoint wants a known bearer token, and says how to send one.
func TestAuthentication(t *testing.T) {
	endpoints := []struct{ method, path string }{
		{http.MethodPost, "/v1/calls"}, {http.MethodGet, "/v1/calls/c_x"}, {http.MethodDelete, "/v1/calls/c_x"},
		{http.MethodGet, "/v1/tools"}, {http.MethodPost, "/v1/policy/check"}, {http.MethodGet, "/v1/approvals"},
		{http.MethodPost, "/v1/approvals/c_x"}, {http.MethodGet, "/v1/audit"},
	}
	tests := []struct {
		name      string
		header    string // Authorization
		wantAuthn string // WWW-Authenticate
		wantMsg   string
	}{
		{"no header", "", `Bearer realm="toolpool"`, "Authorization: Bearer TOKEN"},
		{"another scheme", "Basic YWNtZTpzZWNyZXQ=", `Bearer realm="toolpool"`, "Authorization: Bearer TOKEN"},
		{"empty bearer token", "Bearer ", `Bearer realm="toolpool"`, "Authorization: Bearer TOKEN"},
		{"lower-case scheme", "bearer " + acmeCaller, `Bearer realm="toolpool"`, "Authorization: Bearer TOKEN"},
		{"unknown token", "Bearer not-a-token", `Bearer realm="toolpool", error="invalid_token"`, "not known"},
		{"a known token's prefix", "Bearer " + acmeCaller[:5], `Bearer realm="toolpool", error="invalid_token"`, "not known"},
	}
	h := newHarness(t, setup{})
	for _, tt := range tests {
		for _, ep := range endpoints {
			t.Run(tt.name+"/"+ep.method+" "+ep.path, func(t *testing.T) {
				r := h.do(ep.method, ep.path, "", `{"tool":"run_shell","args":{"command":"ls"}}`, "Authorization", tt.header)
				r.wantError(t, http.StatusUnauthorized, "unauthorized", tt.wantMsg)
				if got := r.header.Get("WWW-Authenticate"); got != tt.wantAuthn {
					t.Errorf("WWW-Authenticate %q, want %q", got, tt.wantAuthn)
				}
			})
		}
	}
	if n := len(h.pub.calls()) + h.store.Writes(); n != 0 {
		t.Errorf("unauthenticated requests wrote %d records or calls", n)
	}
	t.Run("a token given by its sha256 works", func(t *testing.T) {
		cfg := testConfig()
		cfg.Tenants[1].Tokens = append(cfg.Tenants[1].Tokens, Token{SHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}) // "test"
		h := newHarness(t, setup{config: func(c *Config) { *c = cfg }})
		if r := h.do(http.MethodGet, "/v1/tools", "test", nil); r.code != http.StatusOK {
			t.Fatalf("HTTP %d: %s", r.code, r.body)
		}
	})
}

// TestPostCall covers every answer of POST /v1/calls: its status code, the envelope or error, the headers,
// and what was recorded and published.
func TestPostCall(t *testing.T) {
	const shell = `{"tool":"run_shell","args":{"command":"ls"},"workspace":"ws1"}`
	tests := []struct {
		name   string
		setup  setup
		before func(h *harness)
		body   any
		// want
		code       int
		status     call.Status // of the envelope, when the answer is one
		errType    string      // of the envelope's error, or of the error body
		msg        string      // in the error message
		retryAfter string
		published  int
		unrecorded bool // the call is answered though its record could not be written
		check      func(t *testing.T, h *harness, r reply)
	}{
		{name: "a call that ran ok is 200", body: shell,
			before: func(h *harness) { h.pub.onPublish = h.finishWith(call.StatusOK, 0, "") },
			code:   http.StatusOK, status: call.StatusOK, published: 1,
			check: func(t *testing.T, h *harness, r reply) {
				res := r.result(t)
				if res.Tenant != "acme" || res.Workspace != "ws1" || res.Tool != "run_shell" || res.Worker != "w1" ||
					res.Decision == nil || res.Decision.Rule != "test-allow" || !strings.HasPrefix(res.ID, "c_") {
					t.Errorf("envelope %s", r.body)
				}
				if want := call.ArgsDigest(json.RawMessage(`{"command":"ls"}`)); res.ArgsDigest != want {
					t.Errorf("args digest %q, want %q", res.ArgsDigest, want)
				}
				c := h.pub.calls()[0]
				if c.ID != res.ID || c.Tenant != "acme" || string(c.Args) != `{"command":"ls"}` || !c.CreatedAt.Equal(t0) ||
					!c.Deadline.Equal(t0.Add(h.cfg.QueueTimeout)) {
					t.Errorf("published %+v", c)
				}
			}},
		{name: "a tool's own failure is 200 with status error", body: shell,
			before: func(h *harness) { h.pub.onPublish = h.finishWith(call.StatusError, 3, call.ErrExitCode) },
			code:   http.StatusOK, status: call.StatusError, errType: call.ErrExitCode, published: 1},
		{name: "a timeout is 200 with status timeout", body: shell,
			before: func(h *harness) { h.pub.onPublish = h.finishWith(call.StatusTimeout, 137, call.ErrTimeout) },
			code:   http.StatusOK, status: call.StatusTimeout, errType: call.ErrTimeout, published: 1},
		{name: "wait false answers 202 queued at once", body: `{"tool":"run_shell","args":{"command":"ls"},"wait":false}`,
			code: http.StatusAccepted, status: call.StatusQueued, published: 1,
			check: func(t *testing.T, h *harness, r reply) {
				if res := r.result(t); res.Workspace != "default" {
					t.Errorf("workspace %q, want default", res.Workspace)
				}
			}},
		{name: "a call still queued when the wait ends is 202", body: shell,
			setup: setup{config: func(c *Config) { c.MaxWait = 20 * time.Millisecond }},
			code:  http.StatusAccepted, status: call.StatusQueued, published: 1},
		{name: "a call running when the wait ends is 202", body: shell,
			setup:  setup{config: func(c *Config) { c.MaxWait = 20 * time.Millisecond }},
			before: func(h *harness) { h.pub.onPublish = h.finishWith(call.StatusRunning, 0, "") },
			code:   http.StatusAccepted, status: call.StatusRunning, published: 1},
		{name: "a call that expires unstarted while waited for is 200 expired", body: shell,
			before: func(h *harness) {
				h.pub.onPublish = func(*call.Call) { h.clock.Add(h.cfg.QueueTimeout + time.Second) }
			},
			code: http.StatusOK, status: call.StatusExpired, errType: call.ErrExpired, published: 1,
			check: func(t *testing.T, h *harness, r reply) {
				if got := h.store.Result(r.result(t).ID); got.Status != call.StatusExpired {
					t.Errorf("the record is %s, want expired", got.Status)
				}
			}},
		{name: "denied by policy is 403 with the rule and reason", body: shell,
			before: func(h *harness) {
				h.pol.decisions["run_shell"] = policy.Decision{Action: policy.Deny, Rule: "forbidden-commands", Reason: "denied by rule forbidden-commands: no"}
			},
			code: http.StatusForbidden, status: call.StatusDenied, errType: call.ErrPolicyDenied, published: 0,
			check: func(t *testing.T, h *harness, r reply) {
				res := r.result(t)
				if res.Decision.Action != "deny" || res.Decision.Rule != "forbidden-commands" || res.Error.Message != "denied by rule forbidden-commands: no" {
					t.Errorf("envelope %s", r.body)
				}
				if got := h.store.Result(res.ID); got == nil || got.Status != call.StatusDenied || got.FinishedAt.IsZero() {
					t.Errorf("the record is %+v, want denied and finished", got)
				}
			}},
		{name: "ask parks the call for approval: 202 pending_approval", body: shell,
			before: func(h *harness) {
				h.pol.decisions["run_shell"] = policy.Decision{Action: policy.Ask, Rule: "mutating-commands", Reason: "needs approval by rule mutating-commands: x"}
			},
			code: http.StatusAccepted, status: call.StatusPendingApproval, published: 0,
			check: func(t *testing.T, h *harness, r reply) {
				res := r.result(t)
				p, err := h.approvals.GetPending(context.Background(), "acme", res.ID)
				if err != nil {
					t.Fatalf("the call was not parked: %v", err)
				}
				if want := t0.Add(h.cfg.ApprovalTTL); !p.ExpiresAt.Equal(want) || !res.Deadline.Equal(want) {
					t.Errorf("expires %v, deadline %v; want %v", p.ExpiresAt, res.Deadline, want)
				}
				if !strings.Contains(res.Output, "needs approval by rule mutating-commands") {
					t.Errorf("output %q does not say why it waits", res.Output)
				}
			}},
		{name: "unknown tool is 422 naming the tools", body: `{"tool":"read","args":{}}`,
			code: http.StatusUnprocessableEntity, errType: call.ErrInvalidParams, msg: `unknown tool "read": the tools you can call are read_file, write_file`},
		{name: "a disabled tool is 422 and not offered", body: `{"tool":"write_file","args":{"path":"a","content":"x"}}`,
			before: func(h *harness) { h.pol.disabled["write_file"] = true },
			code:   http.StatusUnprocessableEntity, errType: call.ErrInvalidParams, msg: `unknown tool "write_file"`,
			check: func(t *testing.T, h *harness, r reply) {
				if msg := r.errorInfo(t).Message; strings.Contains(msg, "write_file,") || strings.HasSuffix(msg, "write_file") {
					t.Errorf("the message offers the disabled tool: %s", msg)
				}
			}},
		{name: "a tool the request's tools map disables is 422", body: `{"tool":"run_shell","args":{"command":"ls"},"tools":{"run_shell":false}}`,
			code: http.StatusUnprocessableEntity, errType: call.ErrInvalidParams, msg: `unknown tool "run_shell"`},
		{name: "arguments that fail the schema are 422", body: `{"tool":"run_shell","args":{"cmd":"ls"}}`,
			code: http.StatusUnprocessableEntity, errType: call.ErrInvalidParams, msg: "command"},
		{name: "missing arguments are checked as {}", body: `{"tool":"run_shell"}`,
			code: http.StatusUnprocessableEntity, errType: call.ErrInvalidParams, msg: "command"},
		{name: "malformed JSON is 400", body: `{"tool":"run_shell",`,
			code: http.StatusBadRequest, errType: "invalid_request", msg: "not the expected JSON object"},
		{name: "a syntax error says where", body: `{"tool" "run_shell"}`,
			code: http.StatusBadRequest, errType: "invalid_request", msg: "syntax error at byte 9"},
		{name: "an unknown field is 400 naming it", body: `{"tool":"run_shell","args":{"command":"ls"},"priority":1}`,
			code: http.StatusBadRequest, errType: "invalid_request", msg: `unknown field "priority" (known: tool, args`},
		{name: "a request cannot choose its sandbox runtime", body: `{"tool":"run_shell","args":{"command":"ls"},"runtime":"runc"}`,
			code: http.StatusBadRequest, errType: "invalid_request", msg: `unknown field "runtime"`},
		{name: "a field of the wrong type is 400 naming it", body: `{"tool":"run_shell","args":{"command":"ls"},"timeout_ms":"5s"}`,
			code: http.StatusBadRequest, errType: "invalid_request", msg: `field "timeout_ms" must be int64`},
		{name: "a body that is not UTF-8 is 400", body: []byte("{\"tool\":\"run_shell\",\"args\":{\"command\":\"ls \xff\"}}"),
			code: http.StatusBadRequest, errType: "invalid_request", msg: "not valid UTF-8"},
		{name: "data after the object is 400", body: `{"tool":"run_shell","args":{"command":"ls"}} {"tool":"run_shell"}`,
			code: http.StatusBadRequest, errType: "invalid_request", msg: "data after the JSON object"},
		{name: "an empty body is 400", body: "",
			code: http.StatusBadRequest, errType: "invalid_request", msg: "the body is empty"},
		{name: "a body over the limit is 413", body: `{"tool":"run_shell","args":{"command":"` + strings.Repeat("x", 5000) + `"}}`,
			code: http.StatusRequestEntityTooLarge, errType: "too_large", msg: "over the 4096-byte limit"},
		{name: "no tool is 400", body: `{"args":{"command":"ls"}}`,
			code: http.StatusBadRequest, errType: "invalid_request", msg: `"tool" is missing`},
		{name: "a bad workspace name is 400", body: `{"tool":"run_shell","args":{"command":"ls"},"workspace":"../x"}`,
			code: http.StatusBadRequest, errType: "invalid_request", msg: "workspace"},
		{name: "a tools map that is not an object is 400", body: `{"tool":"run_shell","args":{"command":"ls"},"tools":["run_shell"]}`,
			code: http.StatusBadRequest, errType: "invalid_request", msg: "parse tools"},
		{name: "timeout_ms 0 is 400", body: `{"tool":"run_shell","args":{"command":"ls"},"timeout_ms":0}`,
			code: http.StatusBadRequest, errType: "invalid_request", msg: "timeout_ms must be a positive number"},
		{name: "a negative deadline_ms is 400", body: `{"tool":"run_shell","args":{"command":"ls"},"deadline_ms":-1}`,
			code: http.StatusBadRequest, errType: "invalid_request", msg: "deadline_ms must be a positive number"},
		{name: "a negative output_bytes is 400", body: `{"tool":"run_shell","args":{"command":"ls"},"output_bytes":-5}`,
			code: http.StatusBadRequest, errType: "invalid_request", msg: "must not be negative"},
		{name: "a full tenant is 429 with Retry-After", body: shell,
			before: func(h *harness) { h.pub.err = fmt.Errorf("publish call: %w", queue.ErrTenantFull) },
			code:   http.StatusTooManyRequests, errType: call.ErrQuota, msg: "tenant acme has as many calls", retryAfter: "5"},
		{name: "a publish failure is 503 with Retry-After and records nothing (a retry runs the call)", body: shell,
			before: func(h *harness) { h.pub.err = errBoom },
			code:   http.StatusServiceUnavailable, errType: call.ErrInternal, msg: "could not tell whether the call was queued", retryAfter: "1",
			check: namesItsCall},
		{name: "a record failure after the call was queued is 202 queued: its worker records it", body: shell,
			before: func(h *harness) { h.store.FailWith(failOn(queuetest.OpCreate, "", errBoom)) },
			code:   http.StatusAccepted, status: call.StatusQueued, published: 1, unrecorded: true,
			check: func(t *testing.T, h *harness, r reply) {
				if res := r.result(t); !strings.Contains(res.Output, "poll GET /v1/calls/"+res.ID) {
					t.Errorf("output %q does not say to poll the call", res.Output)
				}
			}},
		{name: "a record failure of a call not queued is 503 with Retry-After", body: shell,
			before: func(h *harness) {
				h.pol.decisions["run_shell"] = policy.Decision{Action: policy.Deny, Rule: "r"}
				h.store.FailWith(failOn(queuetest.OpCreate, "", errBoom))
			},
			code: http.StatusServiceUnavailable, errType: call.ErrInternal, msg: "could not record the call", retryAfter: "1"},
		{name: "a failure to park for approval is 503 with Retry-After", body: shell,
			before: func(h *harness) {
				h.pol.decisions["run_shell"] = policy.Decision{Action: policy.Ask, Rule: "r"}
				h.approvals.putErr = errBoom
			},
			code: http.StatusServiceUnavailable, errType: call.ErrInternal, msg: "could not park the call", retryAfter: "1"},
		{name: "a failure to read the call while waiting is 503", body: shell,
			before: func(h *harness) { h.store.FailWith(failOn(queuetest.OpWait, "", errBoom)) },
			code:   http.StatusServiceUnavailable, errType: call.ErrInternal, msg: "poll GET /v1/calls/c_", published: 1, retryAfter: "1",
			check: namesItsCall},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.setup)
			if tt.before != nil {
				tt.before(h)
			}
			r := h.do(http.MethodPost, "/v1/calls", acmeCaller, tt.body)
			if r.code != tt.code {
				t.Fatalf("HTTP %d, want %d: %s", r.code, tt.code, r.body)
			}
			if tt.status != "" {
				res := r.result(t)
				if res.Status != tt.status {
					t.Errorf("status %s, want %s: %s", res.Status, tt.status, r.body)
				}
				if (res.Error == nil) != (tt.errType == "") || (res.Error != nil && res.Error.Type != tt.errType) {
					t.Errorf("error %+v, want type %q", res.Error, tt.errType)
				}
				if rec := h.store.Result(res.ID); (rec == nil) != tt.unrecorded {
					t.Errorf("call %s recorded: %v, want %v", res.ID, rec != nil, !tt.unrecorded)
				}
			} else {
				r.wantError(t, tt.code, tt.errType, tt.msg)
			}
			if got := r.header.Get("Retry-After"); got != tt.retryAfter {
				t.Errorf("Retry-After %q, want %q", got, tt.retryAfter)
			}
			if got := len(h.pub.calls()); got != tt.published {
				t.Errorf("published %d calls, want %d", got, tt.published)
			}
			if tt.status == "" && tt.check == nil && tt.published == 0 && h.store.Writes() != 0 {
				t.Errorf("a refused request wrote %d records", h.store.Writes())
			}
			if tt.status == "" && tt.published == 0 && len(h.store.IDs()) != 0 {
				t.Errorf("a refused request left records %v", h.store.IDs())
			}
			if tt.check != nil {
				tt.check(t, h, r)
			}
		})
	}
}

// failingBody fails every read, like a client that goes away mid-body.
type failingBody struct{}

func (failingBody) Read([]byte) (int, error) { return 0, errors.New("connection reset by peer") }

// TestUnreadableBody: a body that cannot be read is the client's problem: 400, not 5xx.
func TestUnreadableBody(t *testing.T) {
	h := newHarness(t, setup{})
	req := httptest.NewRequest(http.MethodPost, "/v1/calls", failingBody{})
	req.Header.Set("Authorization", "Bearer "+acmeCaller)
	rec := httptest.NewRecorder()
	h.srv.Handler().ServeHTTP(rec, req)
	reply{code: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}.
		wantError(t, http.StatusBadRequest, "invalid_request", "read request body: connection reset by peer")
}

// namesItsCall checks that an answer that could not say what became of a call names the call and says
// that its state is unknown, so that the client can ask about it again.
func namesItsCall(t *testing.T, h *harness, r reply) {
	t.Helper()
	var body struct {
		ID     string      `json:"id"`
		Status call.Status `json:"status"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil || !strings.HasPrefix(body.ID, "c_") || body.Status != call.StatusUnknown {
		t.Errorf("the answer names no call with its state unknown: %s", r.body)
	}
}
