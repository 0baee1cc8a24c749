package dispatcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
	"github.com/toolpool/toolpool/internal/tools"
)

// The test tenants' tokens: acme has a caller and an approver (named alice); globex has an approver and a
// caller of its own.
const (
	acmeCaller     = "acme-caller-token"
	acmeApprover   = "acme-approver-token"
	globexApprover = "globex-approver-token"
	globexCaller   = "globex-caller-token"
)

// t0 is the fake clock's start.
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// clock is a fake time source that moves only when told.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// fakePublisher records the calls it publishes. err, when set, fails every Publish; onPublish, when set,
// runs after each successful one (standing for a worker).
type fakePublisher struct {
	mu        sync.Mutex
	published []*call.Call
	err       error
	onPublish func(c *call.Call)
}

func (p *fakePublisher) Publish(_ context.Context, c *call.Call) error {
	p.mu.Lock()
	err, on := p.err, p.onPublish
	if err == nil {
		cp := *c
		p.published = append(p.published, &cp)
	}
	p.mu.Unlock()
	if err != nil {
		return err
	}
	if on != nil {
		on(c)
	}
	return nil
}

func (p *fakePublisher) calls() []*call.Call {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*call.Call(nil), p.published...)
}

// fakePolicy decides by tool: decisions[tool], else allow with rule "test-allow". disabled tools are not
// enabled for any tenant; a request's tools map can disable more.
type fakePolicy struct {
	decisions map[string]policy.Decision
	disabled  map[string]bool
	// images answers CheckImage; nil is a policy without an images section, which allows none.
	images *policy.Policy

	mu       sync.Mutex
	requests []policy.Request
}

func (p *fakePolicy) Decide(_ context.Context, r policy.Request) policy.Decision {
	p.mu.Lock()
	p.requests = append(p.requests, r)
	p.mu.Unlock()
	if d, ok := p.decisions[r.Tool]; ok {
		return d
	}
	return policy.Decision{Action: policy.Allow, Rule: "test-allow", Reason: "allowed by rule test-allow: tests"}
}

func (p *fakePolicy) CheckImage(tenant, tool, ref string) (policy.ImageVerdict, error) {
	if p.images == nil {
		none, err := policy.Parse([]byte("version: 1\ndefault_action: allow\n"), "none.yaml")
		if err != nil {
			return policy.ImageVerdict{}, err
		}
		return none.CheckImage(tenant, tool, ref)
	}
	return p.images.CheckImage(tenant, tool, ref)
}

func (p *fakePolicy) ToolEnabled(tenant, tool string, requestTools map[string]bool) bool {
	if p.disabled[tool] {
		return false
	}
	if on, ok := requestTools[tool]; ok && !on {
		return false
	}
	return true
}

// fakeApprovals keeps parked calls by tenant and id. The errors, when set, fail their method.
type fakeApprovals struct {
	mu                      sync.Mutex
	pending                 map[string]*call.Pending
	putErr, getErr, listErr error
}

func pendingKey(tenant, id string) string { return tenant + "." + id }

func (a *fakeApprovals) PutPending(_ context.Context, p *call.Pending) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.putErr != nil {
		return a.putErr
	}
	cp := *p
	a.pending[pendingKey(p.Call.Tenant, p.Call.ID)] = &cp
	return nil
}

func (a *fakeApprovals) GetPending(_ context.Context, tenant, id string) (*call.Pending, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.getErr != nil {
		return nil, a.getErr
	}
	p, ok := a.pending[pendingKey(tenant, id)]
	if !ok {
		return nil, queue.ErrNotFound
	}
	c := *p.Call
	return &call.Pending{Call: &c, ExpiresAt: p.ExpiresAt}, nil
}

func (a *fakeApprovals) ListPending(_ context.Context, tenant string) ([]*call.Pending, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.listErr != nil {
		return nil, a.listErr
	}
	var out []*call.Pending
	for _, p := range a.pending {
		if p.Call.Tenant == tenant {
			c := *p.Call
			out = append(out, &call.Pending{Call: &c, ExpiresAt: p.ExpiresAt})
		}
	}
	return out, nil
}

func (a *fakeApprovals) DeletePending(_ context.Context, tenant, id string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.pending, pendingKey(tenant, id))
	return nil
}

func (a *fakeApprovals) has(tenant, id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.pending[pendingKey(tenant, id)]
	return ok
}

// fakeAudit answers ReadAudit with events (or err) and remembers what it was asked.
type fakeAudit struct {
	mu     sync.Mutex
	events []call.AuditEvent
	err    error
	asked  []auditQuery
}

type auditQuery struct {
	tenant string
	since  time.Time
	limit  int
}

func (a *fakeAudit) ReadAudit(_ context.Context, tenant string, since time.Time, limit int) ([]call.AuditEvent, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, auditQuery{tenant, since, limit})
	return a.events, a.err
}

// fakeRecorder keeps the events recorded outside store writes.
type fakeRecorder struct {
	mu     sync.Mutex
	events []string // "event id actor"
}

func (r *fakeRecorder) Record(_ context.Context, event string, res *call.Result, actor string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event+" "+res.ID+" "+actor)
}

func (r *fakeRecorder) recorded() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

// fakeRuleBook keeps the approve-always rules; err, when set, refuses them.
type fakeRuleBook struct {
	mu    sync.Mutex
	rules []policy.AllowRule
	err   error
}

func (b *fakeRuleBook) AddAllowRule(_ context.Context, tenant, tool string, argvPrefix []string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return b.err
	}
	b.rules = append(b.rules, policy.AllowRule{Tenant: tenant, Tool: tool, ArgvPrefix: argvPrefix})
	return nil
}

// setup varies a harness.
type setup struct {
	config    func(*Config)
	noAudit   bool   // serve no audit log (WithAudit not given)
	noRules   bool   // no rule book (WithRuleBook not given)
	engine    Policy // the policy, instead of a fakePolicy (h.pol is then unused)
	ready     []ReadyChecker
	live      Live      // live output (WithLive), if any
	transfers Transfers // the workspace API's transfer store (WithTransfers), if any
}

// harness is a Server on fakes, with a fake clock.
type harness struct {
	t          *testing.T
	srv        *Server
	cfg        Config
	clock      *clock
	store      *queuetest.Store
	pub        *fakePublisher
	pol        *fakePolicy
	approvals  *fakeApprovals
	audit      *fakeAudit
	recorder   *fakeRecorder
	rules      *fakeRuleBook
	rulesAdded int
}

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.MaxBodyBytes = 4096
	cfg.MaxWait = 5 * time.Second // a request that waits wrongly fails in seconds, not minutes
	cfg.Tenants = []Tenant{
		{Name: "acme", Tokens: []Token{{Token: acmeCaller}, {Token: acmeApprover, Role: RoleApprover, Name: "alice"}}},
		{Name: "globex", Tokens: []Token{{Token: globexApprover, Role: RoleApprover}, {Token: globexCaller, Role: RoleCaller}}},
	}
	return cfg
}

func newHarness(t *testing.T, su setup) *harness {
	t.Helper()
	h := &harness{
		t: t, cfg: testConfig(), clock: &clock{now: t0}, store: queuetest.NewStore(), pub: &fakePublisher{},
		pol:       &fakePolicy{decisions: map[string]policy.Decision{}, disabled: map[string]bool{}},
		approvals: &fakeApprovals{pending: map[string]*call.Pending{}}, audit: &fakeAudit{},
		recorder: &fakeRecorder{}, rules: &fakeRuleBook{},
	}
	if su.config != nil {
		su.config(&h.cfg)
	}
	reg, err := tools.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	opts := []Option{WithReadyChecks(su.ready...)}
	if !su.noAudit {
		opts = append(opts, WithAudit(h.audit, h.recorder))
	}
	if !su.noRules {
		opts = append(opts, WithRuleBook(h.rules, func() { h.rulesAdded++ }))
	}
	if su.live != nil {
		opts = append(opts, WithLive(su.live))
	}
	if su.transfers != nil {
		opts = append(opts, WithTransfers(su.transfers))
	}
	var pol Policy = h.pol
	if su.engine != nil {
		pol = su.engine
	}
	h.srv, err = New(h.cfg, Deps{Store: h.store, Publisher: h.pub, Tools: reg, Policy: pol, Approvals: h.approvals,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	h.srv.now = h.clock.Now
	return h
}

// reply is an HTTP answer of the Server.
type reply struct {
	code   int
	header http.Header
	body   []byte
}

// do sends a request to the Server. body is sent as is when it is a string or []byte, else as JSON; header
// holds extra header name and value pairs.
func (h *harness) do(method, path, token string, body any, header ...string) reply {
	h.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			h.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req := httptest.NewRequest(method, path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.srv.Handler().ServeHTTP(rec, req)
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		h.t.Errorf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	r := reply{code: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
	h.answersNameTheirCall(method, path, r)
	return r
}

// answersNameTheirCall fails the test when an answer about a call that exists says neither the call's
// state nor its id: a failure to read or settle a call (5xx) names the call and says its state is
// unknown, so that a client knows which call to ask about again. A POST's 5xx names the call it may
// have made, unless the call was refused before anything was written (tenant full, too large).
func (h *harness) answersNameTheirCall(method, path string, r reply) {
	h.t.Helper()
	if r.code < 500 {
		return
	}
	var body struct {
		ID     string      `json:"id"`
		Status call.Status `json:"status"`
	}
	_ = json.Unmarshal(r.body, &body)
	named := body.ID != "" && body.Status == call.StatusUnknown
	rest, aboutCall := strings.CutPrefix(path, "/v1/calls/")
	switch {
	case aboutCall && rest != "" && !named:
		h.t.Errorf("%s %s: HTTP %d names no call and no state: %s", method, path, r.code, r.body)
	case aboutCall && rest != "" && !strings.HasPrefix(rest, body.ID):
		h.t.Errorf("%s %s: HTTP %d names call %s", method, path, r.code, body.ID)
	}
}

// result decodes the reply as a result envelope and checks its Location header.
func (r reply) result(t *testing.T) *call.Result {
	t.Helper()
	var res call.Result
	if err := json.Unmarshal(r.body, &res); err != nil || res.ID == "" {
		t.Fatalf("HTTP %d is not a result envelope (%v): %s", r.code, err, r.body)
	}
	if loc := r.header.Get("Location"); loc != "/v1/calls/"+res.ID {
		t.Errorf("Location %q, want /v1/calls/%s", loc, res.ID)
	}
	return &res
}

// errorInfo decodes the reply as an error body: {"error": {"type", "message"}}, and, about a call whose
// state is unknown, its "id" and "status": "unknown"; nothing else.
func (r reply) errorInfo(t *testing.T) call.ErrorInfo {
	t.Helper()
	var e struct {
		Error  call.ErrorInfo `json:"error"`
		ID     string         `json:"id"`
		Status call.Status    `json:"status"`
	}
	var keys map[string]json.RawMessage
	_ = json.Unmarshal(r.body, &keys)
	err := json.Unmarshal(r.body, &e)
	want := 1
	if e.ID != "" && e.Status == call.StatusUnknown {
		want = 3
	}
	if err != nil || len(keys) != want || e.Error.Type == "" || e.Error.Message == "" {
		t.Fatalf("HTTP %d is not an error body (%v): %s", r.code, err, r.body)
	}
	return e.Error
}

// wantError checks an error reply's code, type, and that its message holds every one of msgs.
func (r reply) wantError(t *testing.T, code int, typ string, msgs ...string) call.ErrorInfo {
	t.Helper()
	if r.code != code {
		t.Fatalf("HTTP %d, want %d: %s", r.code, code, r.body)
	}
	e := r.errorInfo(t)
	if e.Type != typ {
		t.Errorf("error type %q, want %q (%s)", e.Type, typ, e.Message)
	}
	for _, m := range msgs {
		if !strings.Contains(e.Message, m) {
			t.Errorf("error message %q lacks %q", e.Message, m)
		}
	}
	return e
}

// finishWith returns an onPublish that records the published call as final with status st, as a worker
// would: in the background, once the dispatcher has recorded the call (it publishes first).
func (h *harness) finishWith(st call.Status, exit int, errType string) func(c *call.Call) {
	return func(c *call.Call) {
		done := make(chan struct{})
		h.t.Cleanup(func() { <-done })
		go func() {
			defer close(done)
			var rec queue.Record
			var err error
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				if rec, err = h.store.Get(context.Background(), c.ID); err == nil || time.Now().After(deadline) {
					break
				}
			}
			if err != nil {
				h.t.Errorf("worker: %v", err)
				return
			}
			r := rec.Result
			r.Status, r.ExitCode, r.Worker, r.Output = st, &exit, "w1", "done\n"
			if errType != "" {
				r.Error = &call.ErrorInfo{Type: errType, Message: "the tool failed"}
			}
			if _, err := h.store.Update(context.Background(), r, rec.Revision); err != nil {
				h.t.Errorf("worker: %v", err)
			}
		}()
	}
}

// park records a call of tenant waiting for approval, created now, as POST /v1/calls does for an "ask"
// decision, and returns it.
func (h *harness) park(tenant, command string) *call.Call {
	h.t.Helper()
	args := json.RawMessage(`{"command":` + mustJSON(h.t, command) + `}`)
	now := h.clock.Now()
	c := &call.Call{ID: call.NewID(), Tenant: tenant, Workspace: "ws", Tool: "run_shell", Args: args,
		ArgsDigest: call.ArgsDigest(args), CreatedAt: now, Deadline: now.Add(h.cfg.ApprovalTTL),
		Decision: &call.Decision{Action: "ask", Rule: "mutating-commands", Reason: "needs approval by rule mutating-commands: mkdir writes"}}
	r := call.NewResult(c, call.StatusPendingApproval)
	r.Output = "the call waits for a person's approval"
	h.store.Put(r)
	if err := h.approvals.PutPending(context.Background(), &call.Pending{Call: c, ExpiresAt: c.Deadline}); err != nil {
		h.t.Fatal(err)
	}
	return c
}

// queued records a call of tenant in status st and returns its id.
func (h *harness) queued(tenant string, st call.Status) string {
	h.t.Helper()
	now := h.clock.Now()
	c := &call.Call{ID: call.NewID(), Tenant: tenant, Workspace: "ws", Tool: "run_shell", CreatedAt: now,
		Deadline: now.Add(h.cfg.QueueTimeout)}
	r := call.NewResult(c, st)
	if st == call.StatusRunning {
		r.Worker, r.LeaseUntil = "w1", now.Add(time.Minute)
	}
	if st.Terminal() {
		r.Output, r.FinishedAt = "finished\n", now
	}
	h.store.Put(r)
	return c.ID
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// failOn returns a store fault that fails op with err, for every call (id "") or one call id.
func failOn(op queuetest.Op, id string, err error) func(queuetest.Op, string) error {
	return func(o queuetest.Op, i string) error {
		if o == op && (id == "" || i == id) {
			return err
		}
		return nil
	}
}

var errBoom = errors.New("nats: connection closed")
