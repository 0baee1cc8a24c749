package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
	"github.com/toolpool/toolpool/internal/tools"
)

// These tests cover the call path's methods for front ends (calls.go) with the real policy engine and tool
// registry over in-memory fakes of the store, the queue and the approvals bucket; test/mcp runs them
// against NATS and containerd.

type memQueue struct {
	mu        sync.Mutex
	published []string
}

func (q *memQueue) Publish(_ context.Context, c *call.Call) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.published = append(q.published, c.ID)
	return nil
}

type memApprovals struct {
	mu      sync.Mutex
	pending map[string]*call.Pending
}

func (a *memApprovals) PutPending(_ context.Context, p *call.Pending) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending[p.Call.Tenant+"/"+p.Call.ID] = p
	return nil
}

func (a *memApprovals) GetPending(_ context.Context, tenant, id string) (*call.Pending, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p, ok := a.pending[tenant+"/"+id]; ok {
		return p, nil
	}
	return nil, queue.ErrNotFound
}

func (a *memApprovals) ListPending(context.Context, string) ([]*call.Pending, error) { return nil, nil }

func (a *memApprovals) DeletePending(_ context.Context, tenant, id string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.pending, tenant+"/"+id)
	return nil
}

type memRecorder struct{ events []string }

func (r *memRecorder) Record(_ context.Context, event string, res *call.Result, actor string) {
	r.events = append(r.events, event+" "+res.ID+" by "+actor)
}

const callsPolicy = `
version: 1
default_action: allow
tools:
  run_shell: {network: true}
commands:
  - {name: forbidden, action: deny, commands: [sudo]}
  - {name: mutating, action: ask, commands: [mkdir]}
`

type callsFixture struct {
	srv      *Server
	store    *queuetest.Store
	queue    *memQueue
	recorder *memRecorder
	// as returns a context that carries the caller of token, as Authenticate does.
	as func(token string) context.Context
}

func newCallsFixture(t *testing.T) callsFixture {
	t.Helper()
	pol, err := policy.Parse([]byte(callsPolicy), "test")
	if err != nil {
		t.Fatal(err)
	}
	reg, err := tools.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Tenants = []Tenant{
		{Name: "acme", Tokens: []Token{{Token: "acme-approver", Role: RoleApprover, Name: "alice"}, {Token: "acme-caller", Workspace: "botspace"}}},
		{Name: "globex", Tokens: []Token{{Token: "globex-approver", Role: RoleApprover}}},
	}
	f := callsFixture{store: queuetest.NewStore(), queue: &memQueue{}, recorder: &memRecorder{}}
	f.srv, err = New(cfg, Deps{Store: f.store, Publisher: f.queue, Tools: reg, Policy: policy.NewStore(pol),
		Approvals: &memApprovals{pending: map[string]*call.Pending{}}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		WithAudit(nil, f.recorder))
	if err != nil {
		t.Fatal(err)
	}
	f.as = func(token string) context.Context {
		var ctx context.Context
		h := f.srv.Authenticate(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { ctx = r.Context() }))
		req := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		h.ServeHTTP(httptest.NewRecorder(), req)
		if ctx == nil {
			t.Fatalf("token %s was not authenticated", token)
		}
		return ctx
	}
	return f
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

func TestSubmitDecidesLikePostCalls(t *testing.T) {
	f := newCallsFixture(t)
	ctx := f.as("acme-caller")
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
			res, err := f.srv.Submit(ctx, call.Request{Tool: "run_shell", Args: shell(c.command)})
			if err != nil || res.Status != c.status || res.Workspace != "botspace" || res.ArgsDigest != call.ArgsDigest(shell(c.command)) {
				t.Fatalf("Submit: %+v, %v; want %s in the token's workspace botspace", res, err, c.status)
			}
			if rec, err := f.store.Get(ctx, res.ID); err != nil || rec.Result.Status != c.status {
				t.Errorf("record %+v, %v", rec.Result, err)
			}
			f.queue.mu.Lock()
			published := len(f.queue.published) > 0 && f.queue.published[len(f.queue.published)-1] == res.ID
			f.queue.mu.Unlock()
			if published != c.published {
				t.Errorf("published %v, want %v", published, c.published)
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
		if _, err := f.srv.Submit(ctx, c.req); rejectionType(err) != c.typ {
			t.Errorf("%s: %v, want a rejection of type %s", c.name, err, c.typ)
		}
	}
	// A derived id names the call: submitting it again finds the same call.
	id := call.DeriveID("mcp", "session", "7")
	first, err1 := f.srv.Submit(ctx, call.Request{Tool: "run_shell", Args: shell("echo once"), ID: id})
	again, err2 := f.srv.Submit(ctx, call.Request{Tool: "run_shell", Args: shell("echo once"), ID: id})
	if err1 != nil || err2 != nil || first.ID != id || again.ID != id || again.CreatedAt != first.CreatedAt {
		t.Errorf("Submit with id %s: %+v %v, then %+v %v", id, first, err1, again, err2)
	}
	if _, err := f.srv.Submit(context.Background(), call.Request{Tool: "run_shell", Args: shell("true")}); rejectionType(err) != call.ErrPermissionDenied {
		t.Errorf("Submit without a caller: %v", err)
	}
}

func TestWaitAndCancelStayInTheTenant(t *testing.T) {
	f := newCallsFixture(t)
	acme, globex := f.as("acme-caller"), f.as("globex-approver")
	res, err := f.srv.Submit(acme, call.Request{Tool: "run_shell", Args: shell("echo hi")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.Wait(globex, res.ID, func(*call.Result) bool { return true }); rejectionType(err) != call.ErrNotFound {
		t.Errorf("another tenant's Wait: %v, want not_found", err)
	}
	if _, err := f.srv.Cancel(globex, res.ID); rejectionType(err) != call.ErrNotFound {
		t.Errorf("another tenant's Cancel: %v, want not_found", err)
	}
	got, err := f.srv.Wait(acme, res.ID, func(r *call.Result) bool { return r.Status == call.StatusQueued })
	if err != nil || got.ID != res.ID {
		t.Fatalf("Wait: %+v, %v", got, err)
	}
	// A worker claims it; Cancel asks the worker to kill it, and Wait sees the change.
	rec, _ := f.store.Get(acme, res.ID)
	rec.Result.Status = call.StatusRunning
	if _, err := f.store.Update(acme, rec.Result, rec.Revision); err != nil {
		t.Fatal(err)
	}
	cancelled, err := f.srv.Cancel(acme, res.ID)
	if err != nil || cancelled.Status != call.StatusRunning || !cancelled.CancelRequested {
		t.Errorf("Cancel of a running call: %+v, %v; want running with cancel_requested", cancelled, err)
	}
	queued, _ := f.srv.Submit(acme, call.Request{Tool: "run_shell", Args: shell("echo two")})
	if c, err := f.srv.Cancel(acme, queued.ID); err != nil || c.Status != call.StatusCancelled {
		t.Errorf("Cancel of a queued call: %+v, %v; want cancelled", c, err)
	}
}

func TestDecideNeedsAnApproverAndTheDigest(t *testing.T) {
	f := newCallsFixture(t)
	caller, approver := f.as("acme-caller"), f.as("acme-approver")
	res, err := f.srv.Submit(caller, call.Request{Tool: "run_shell", Args: shell("mkdir build")})
	if err != nil || res.Status != call.StatusPendingApproval {
		t.Fatalf("Submit: %+v, %v", res, err)
	}
	if f.srv.MayApprove(caller) || !f.srv.MayApprove(approver) {
		t.Error("MayApprove does not follow the token's role")
	}
	if _, err := f.srv.Decide(caller, res.ID, res.ArgsDigest, true); rejectionType(err) != call.ErrPermissionDenied {
		t.Errorf("a caller's Decide: %v, want permission_denied", err)
	}
	if _, err := f.srv.Decide(approver, res.ID, call.ArgsDigest(shell("mkdir other")), true); rejectionType(err) != "digest_mismatch" {
		t.Errorf("Decide with another digest: %v, want digest_mismatch", err)
	}
	if _, err := f.srv.Decide(f.as("globex-approver"), res.ID, res.ArgsDigest, true); rejectionType(err) != call.ErrNotFound {
		t.Errorf("another tenant's Decide: %v, want not_found", err)
	}
	got, err := f.srv.Decide(approver, res.ID, res.ArgsDigest, true)
	if err != nil || got.Status != call.StatusQueued {
		t.Fatalf("Decide: %+v, %v", got, err)
	}
	if want := "approved " + res.ID + " by acme/alice via mcp"; len(f.recorder.events) != 1 || f.recorder.events[0] != want {
		t.Errorf("audit %q, want %q", f.recorder.events, want)
	}
	if _, err := f.srv.Decide(approver, res.ID, res.ArgsDigest, false); rejectionType(err) != call.ErrNotFound {
		t.Errorf("a second Decide: %v, want not_found (it no longer waits)", err)
	}
}

func TestToolsHintsFollowPolicy(t *testing.T) {
	f := newCallsFixture(t)
	list, err := f.srv.Tools(f.as("acme-caller"))
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
}
