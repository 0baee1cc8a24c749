package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
	"github.com/toolpool/toolpool/internal/tools"
)

// These tests cover the call path's methods for front ends (calls.go) with the real policy engine over the
// harness's fakes of the store, the queue and the approvals bucket; test/mcp runs them against NATS and
// containerd.

const frontendPolicy = `
version: 1
default_action: allow
tools:
  run_shell: {network: true}
commands:
  - {name: forbidden, action: deny, commands: [sudo]}
  - {name: mutating, action: ask, commands: [mkdir]}
`

// newFrontendHarness is a harness on frontendPolicy whose acme caller token defaults to workspace botspace.
func newFrontendHarness(t *testing.T) *harness {
	t.Helper()
	pol, err := policy.Parse([]byte(frontendPolicy), "test")
	if err != nil {
		t.Fatal(err)
	}
	return newHarness(t, setup{engine: policy.NewStore(pol), config: func(c *Config) {
		c.Tenants[0].Tokens[0].Workspace = "botspace"
	}})
}

// as returns a context that carries the caller of token, as Authenticate gives its handler.
func (h *harness) as(token string) context.Context {
	h.t.Helper()
	var ctx context.Context
	next := h.srv.Authenticate(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { ctx = r.Context() }))
	req := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	next.ServeHTTP(httptest.NewRecorder(), req)
	if ctx == nil {
		h.t.Fatalf("token %s was not authenticated", token)
	}
	return ctx
}

func shell(command string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"command": command})
	return b
}

func rejectionType(err error) string {
	var rej *call.Rejection
	if errors.As(err, &rej) {
		return rej.Type
	}
	return ""
}

func TestAuthenticate(t *testing.T) {
	h := newFrontendHarness(t)
	reached := false
	next := h.srv.Authenticate(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true }))
	for _, token := range []string{"", "not-a-token"} {
		req := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized || reached {
			t.Errorf("token %q: HTTP %d, handler reached %v; want 401 before the handler", token, rec.Code, reached)
		}
	}
}

func TestSubmitDecidesLikePostCalls(t *testing.T) {
	h := newFrontendHarness(t)
	ctx := h.as(acmeCaller)
	for _, c := range []struct {
		name, command string
		status        call.Status
		published     bool
	}{
		{"allowed", "echo hi", call.StatusQueued, true},
		{"asked", "mkdir x", call.StatusPendingApproval, false},
		{"denied", "sudo ls", call.StatusDenied, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := h.srv.Submit(ctx, call.Request{Tool: "run_shell", Args: shell(c.command)})
			if err != nil || res.Status != c.status || res.Workspace != "botspace" || res.ArgsDigest != call.ArgsDigest(shell(c.command)) {
				t.Fatalf("Submit: %+v, %v; want %s in the token's workspace botspace", res, err, c.status)
			}
			if got := h.store.Result(res.ID); got == nil || got.Status != c.status {
				t.Errorf("record %+v", got)
			}
			published := slices.ContainsFunc(h.pub.calls(), func(p *call.Call) bool { return p.ID == res.ID })
			if published != c.published {
				t.Errorf("published %v, want %v", published, c.published)
			}
			if parked := h.approvals.has("acme", res.ID); parked != (c.status == call.StatusPendingApproval) {
				t.Errorf("parked for approval %v", parked)
			}
		})
	}
	for _, c := range []struct {
		name string
		req  call.Request
		typ  string
	}{
		{"unknown tool", call.Request{Tool: "nope", Args: shell("x")}, call.ErrInvalidParams},
		{"bad arguments", call.Request{Tool: "run_shell", Args: json.RawMessage(`{"command": 7}`)}, call.ErrInvalidParams},
		{"bad workspace", call.Request{Tool: "run_shell", Args: shell("true"), Workspace: "../x"}, "invalid_request"},
		{"bad id", call.Request{Tool: "run_shell", Args: shell("true"), ID: "c_NOPE"}, call.ErrInvalidParams},
	} {
		if _, err := h.srv.Submit(ctx, c.req); rejectionType(err) != c.typ {
			t.Errorf("%s: %v, want a rejection of type %s", c.name, err, c.typ)
		}
	}
	// A named workspace wins over the token's default.
	if res, err := h.srv.Submit(ctx, call.Request{Tool: "run_shell", Args: shell("true"), Workspace: "ws2"}); err != nil || res.Workspace != "ws2" {
		t.Errorf("Submit in ws2: %+v, %v", res, err)
	}
	// A derived id names the call: submitting it again finds the same call.
	id := call.DeriveID("mcp", "session", "7")
	first, err1 := h.srv.Submit(ctx, call.Request{Tool: "run_shell", Args: shell("echo once"), ID: id})
	again, err2 := h.srv.Submit(ctx, call.Request{Tool: "run_shell", Args: shell("echo once"), ID: id})
	if err1 != nil || err2 != nil || first.ID != id || again.ID != id || again.CreatedAt != first.CreatedAt {
		t.Errorf("Submit with id %s: %+v %v, then %+v %v", id, first, err1, again, err2)
	}
	// read_output is answered at once, as POST /v1/calls answers it: never queued for a worker (which
	// cannot run it) nor recorded.
	missing := call.DeriveID("no", "such", "call")
	ro, err := h.srv.Submit(ctx, call.Request{Tool: tools.ReadOutputTool, Args: json.RawMessage(`{"call_id": "` + missing + `"}`)})
	if err != nil || ro.Status != call.StatusError || ro.Error == nil || ro.Error.Type != call.ErrNotFound {
		t.Errorf("Submit read_output of a missing call: %+v, %v; want an error result of type not_found", ro, err)
	} else if h.store.Result(ro.ID) != nil || slices.ContainsFunc(h.pub.calls(), func(p *call.Call) bool { return p.ID == ro.ID }) {
		t.Errorf("read_output call %s was recorded or queued", ro.ID)
	}
	if _, err := h.srv.Submit(context.Background(), call.Request{Tool: "run_shell", Args: shell("true")}); rejectionType(err) != call.ErrPermissionDenied {
		t.Errorf("Submit without a caller: %v", err)
	}
}

func TestWaitAndCancelStayInTheTenant(t *testing.T) {
	h := newFrontendHarness(t)
	acme, globex := h.as(acmeCaller), h.as(globexApprover)
	res, err := h.srv.Submit(acme, call.Request{Tool: "run_shell", Args: shell("echo hi")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.srv.Wait(globex, res.ID, func(*call.Result) bool { return true }); rejectionType(err) != call.ErrNotFound {
		t.Errorf("another tenant's Wait: %v, want not_found", err)
	}
	if _, err := h.srv.Cancel(globex, res.ID); rejectionType(err) != call.ErrNotFound {
		t.Errorf("another tenant's Cancel: %v, want not_found", err)
	}
	got, err := h.srv.Wait(acme, res.ID, func(r *call.Result) bool { return r.Status == call.StatusQueued })
	if err != nil || got.ID != res.ID {
		t.Fatalf("Wait: %+v, %v", got, err)
	}
	// A worker claims it; Cancel asks the worker to kill it.
	rec, _ := h.store.Get(acme, res.ID)
	rec.Result.Status = call.StatusRunning
	if _, err := h.store.Update(acme, rec.Result, rec.Revision); err != nil {
		t.Fatal(err)
	}
	cancelled, err := h.srv.Cancel(acme, res.ID)
	if err != nil || cancelled.Status != call.StatusRunning || !cancelled.CancelRequested {
		t.Errorf("Cancel of a running call: %+v, %v; want running with cancel_requested", cancelled, err)
	}
	queued, _ := h.srv.Submit(acme, call.Request{Tool: "run_shell", Args: shell("echo two")})
	if c, err := h.srv.Cancel(acme, queued.ID); err != nil || c.Status != call.StatusCancelled {
		t.Errorf("Cancel of a queued call: %+v, %v; want cancelled", c, err)
	}
	// Cancelling a call that waits for approval ends it and takes it off the approvals list.
	parked, _ := h.srv.Submit(acme, call.Request{Tool: "run_shell", Args: shell("mkdir x")})
	if c, err := h.srv.Cancel(acme, parked.ID); err != nil || c.Status != call.StatusCancelled || h.approvals.has("acme", parked.ID) {
		t.Errorf("Cancel of a parked call: %+v, %v, still listed %v", c, err, h.approvals.has("acme", parked.ID))
	}
}

func TestDecideNeedsAnApproverAndTheDigest(t *testing.T) {
	h := newFrontendHarness(t)
	caller, approver := h.as(acmeCaller), h.as(acmeApprover)
	res, err := h.srv.Submit(caller, call.Request{Tool: "run_shell", Args: shell("mkdir build")})
	if err != nil || res.Status != call.StatusPendingApproval {
		t.Fatalf("Submit: %+v, %v", res, err)
	}
	if h.srv.MayApprove(caller) || !h.srv.MayApprove(approver) {
		t.Error("MayApprove does not follow the token's role")
	}
	if _, err := h.srv.Decide(caller, res.ID, res.ArgsDigest, true); rejectionType(err) != call.ErrPermissionDenied {
		t.Errorf("a caller's Decide: %v, want permission_denied", err)
	}
	if _, err := h.srv.Decide(approver, res.ID, call.ArgsDigest(shell("mkdir other")), true); rejectionType(err) != "digest_mismatch" {
		t.Errorf("Decide with another digest: %v, want digest_mismatch", err)
	}
	if _, err := h.srv.Decide(h.as(globexApprover), res.ID, res.ArgsDigest, true); rejectionType(err) != call.ErrNotFound {
		t.Errorf("another tenant's Decide: %v, want not_found", err)
	}
	got, err := h.srv.Decide(approver, res.ID, res.ArgsDigest, true)
	if err != nil || got.Status != call.StatusQueued {
		t.Fatalf("Decide: %+v, %v", got, err)
	}
	if want := "approved " + res.ID + " acme/alice via mcp"; !slices.Equal(h.recorder.recorded(), []string{want}) {
		t.Errorf("audit %q, want %q", h.recorder.recorded(), want)
	}
	if !slices.ContainsFunc(h.pub.calls(), func(p *call.Call) bool { return p.ID == res.ID }) {
		t.Error("the approved call was not queued")
	}
	if _, err := h.srv.Decide(approver, res.ID, res.ArgsDigest, false); rejectionType(err) != call.ErrNotFound {
		t.Errorf("a second Decide: %v, want not_found (it no longer waits)", err)
	}
	// A denial ends the call denied.
	other, _ := h.srv.Submit(caller, call.Request{Tool: "run_shell", Args: shell("mkdir two")})
	if got, err := h.srv.Decide(approver, other.ID, other.ArgsDigest, false); err != nil || got.Status != call.StatusDenied {
		t.Errorf("Decide deny: %+v, %v", got, err)
	}
}

func TestToolsHintsFollowPolicy(t *testing.T) {
	h := newFrontendHarness(t)
	list, err := h.srv.Tools(h.as(acmeCaller))
	if err != nil {
		t.Fatal(err)
	}
	hints := map[string]tools.MCPAnnotations{}
	for _, tl := range list {
		hints[tl.Name] = tl.Annotations
	}
	if !hints["run_shell"].OpenWorldHint || hints["write_file"].OpenWorldHint || !hints["web_fetch"].OpenWorldHint || !hints["read_file"].ReadOnlyHint {
		t.Errorf("hints %+v: run_shell has network by policy, write_file has none, web_fetch fetches", hints)
	}
	if _, err := h.srv.Tools(context.Background()); rejectionType(err) != call.ErrPermissionDenied {
		t.Errorf("Tools without a caller: %v", err)
	}
}

// TestFrontEndFailures: every method refuses a context without a caller, and says when toolpool itself
// failed (internal, to retry) rather than the request.
func TestFrontEndFailures(t *testing.T) {
	h := newFrontendHarness(t)
	bg := context.Background()
	if _, err := h.srv.Wait(bg, "c_x", func(*call.Result) bool { return true }); rejectionType(err) != call.ErrPermissionDenied {
		t.Errorf("Wait without a caller: %v", err)
	}
	if _, err := h.srv.Cancel(bg, "c_x"); rejectionType(err) != call.ErrPermissionDenied {
		t.Errorf("Cancel without a caller: %v", err)
	}
	if _, err := h.srv.Decide(bg, "c_x", "", true); rejectionType(err) != call.ErrPermissionDenied {
		t.Errorf("Decide without a caller: %v", err)
	}
	acme := h.as(acmeCaller)
	h.pub.err = errBoom
	if _, err := h.srv.Submit(acme, call.Request{Tool: "run_shell", Args: shell("echo hi")}); rejectionType(err) != call.ErrInternal {
		t.Errorf("Submit with the queue down: %v, want internal", err)
	}
	h.pub.err = nil
	res, err := h.srv.Submit(acme, call.Request{Tool: "run_shell", Args: shell("echo hi")})
	if err != nil {
		t.Fatal(err)
	}
	h.store.FailWith(failOn(queuetest.OpGet, res.ID, errBoom))
	if _, err := h.srv.Wait(acme, res.ID, func(*call.Result) bool { return true }); rejectionType(err) != call.ErrInternal {
		t.Errorf("Wait with the store down: %v, want internal", err)
	}
	h.store.FailWith(failOn(queuetest.OpWait, res.ID, errBoom))
	if _, err := h.srv.Wait(acme, res.ID, func(*call.Result) bool { return false }); rejectionType(err) != call.ErrInternal {
		t.Errorf("Wait with the store's watch down: %v, want internal", err)
	}
	h.store.FailWith(nil)
}

// TestWaitExpiresAndFollows: Wait ends a call that waited in the queue past its deadline (expired), and
// follows a call until its record satisfies until.
func TestWaitExpiresAndFollows(t *testing.T) {
	h := newFrontendHarness(t)
	acme := h.as(acmeCaller)
	res, err := h.srv.Submit(acme, call.Request{Tool: "run_shell", Args: shell("echo hi")})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan *call.Result, 1)
	go func() {
		got, _ := h.srv.Wait(acme, res.ID, func(r *call.Result) bool { return r.Status == call.StatusRunning })
		done <- got
	}()
	rec, _ := h.store.Get(acme, res.ID)
	rec.Result.Status, rec.Result.Worker = call.StatusRunning, "w1"
	if _, err := h.store.Update(acme, rec.Result, rec.Revision); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-done:
		if got == nil || got.Status != call.StatusRunning {
			t.Errorf("Wait for running: %+v", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not see the call start")
	}
	// A Wait whose context ends first returns the latest record and the context's error.
	short, cancel := context.WithTimeout(acme, 50*time.Millisecond)
	defer cancel()
	if got, err := h.srv.Wait(short, res.ID, func(*call.Result) bool { return false }); !errors.Is(err, context.DeadlineExceeded) || got == nil || got.Status != call.StatusRunning {
		t.Errorf("Wait past its context: %+v, %v; want the running record and the deadline", got, err)
	}
	late, _ := h.srv.Submit(acme, call.Request{Tool: "run_shell", Args: shell("echo late")})
	h.clock.Add(h.cfg.QueueTimeout + time.Second)
	if got, err := h.srv.Wait(acme, late.ID, func(*call.Result) bool { return false }); err != nil || got.Status != call.StatusExpired {
		t.Errorf("Wait past the queue deadline: %+v, %v; want expired", got, err)
	}
}

// TestTokenWorkspaceValidated: a token's default workspace must be a workspace name.
func TestTokenWorkspaceValidated(t *testing.T) {
	cfg := testConfig()
	cfg.Tenants[0].Tokens[0].Workspace = "../etc"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `tenant "acme" tokens[0]`) {
		t.Errorf("Validate: %v, want the token named", err)
	}
}

// TestToolsFormatMCP: GET /v1/tools?format=mcp is a whole MCP ListToolsResult, private to the tenant.
func TestToolsFormatMCP(t *testing.T) {
	h := newFrontendHarness(t)
	r := h.do(http.MethodGet, "/v1/tools?format=mcp", acmeCaller, nil)
	var body map[string]any
	if err := json.Unmarshal(r.body, &body); err != nil || r.code != http.StatusOK {
		t.Fatalf("HTTP %d %s", r.code, r.body)
	}
	if body["resultType"] != "complete" || body["cacheScope"] != "private" || body["ttlMs"] != float64(0) || len(body["tools"].([]any)) == 0 {
		t.Errorf("body %v, want tools with resultType complete, cacheScope private, ttlMs 0", body)
	}
	plain := h.do(http.MethodGet, "/v1/tools", acmeCaller, nil)
	if strings.Contains(string(plain.body), "resultType") {
		t.Errorf("the plain list carries MCP's fields: %s", plain.body)
	}
}
