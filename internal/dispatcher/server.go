// Package dispatcher is toolpool's HTTP API: it authenticates the tenant, checks each call against its
// tool's schema and the policy, records it durably, publishes it for a worker, and answers with the
// call's result envelope. It keeps no state between requests: every call lives in the Store, so any
// replica can answer for any call.
package dispatcher

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tracing"
)

// Store is the durable record of each call.
type Store interface {
	Create(ctx context.Context, r *call.Result) (uint64, error)
	Get(ctx context.Context, id string) (queue.Record, error)
	Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error)
	// Wait returns the record once done is true for it, or the latest one with ctx's error.
	Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error)
}

// Publisher hands a call to the workers.
type Publisher interface {
	Publish(ctx context.Context, c *call.Call) error
}

// Policy decides calls and says which tools a tenant may see.
type Policy interface {
	policy.Engine
	ToolEnabled(tenant, tool string, requestTools map[string]bool) bool
}

// Approvals parks calls that wait for a person's approval.
type Approvals interface {
	PutPending(ctx context.Context, p *call.Pending) error
	GetPending(ctx context.Context, tenant, id string) (*call.Pending, error)
	ListPending(ctx context.Context, tenant string) ([]*call.Pending, error)
	DeletePending(ctx context.Context, tenant, id string) error
}

// AuditLog reads the audit log.
type AuditLog interface {
	ReadAudit(ctx context.Context, tenant string, since time.Time, limit int) ([]call.AuditEvent, error)
}

// Recorder logs events that are not store writes: an approver's decision.
type Recorder interface {
	Record(ctx context.Context, event string, r *call.Result, actor string)
}

// RuleBook takes "approve always" rules.
type RuleBook interface {
	AddAllowRule(ctx context.Context, tenant, tool string, argvPrefix []string) error
}

// Outputs reads output fields that workers kept outside a call's record (call.Result.Stored).
type Outputs interface {
	// ReadOutput returns up to limit bytes of object name from offset on (limit < 0: to the end).
	ReadOutput(ctx context.Context, name string, offset, limit int64) ([]byte, error)
	// OpenOutput returns a reader of object name from offset on, which streams it; the caller closes it.
	OpenOutput(ctx context.Context, name string, offset int64) (io.ReadCloser, error)
}

// ReadyChecker reports whether a dependency can serve.
type ReadyChecker func(ctx context.Context) error

// Server is the HTTP API. Safe for concurrent use.
type Server struct {
	cfg     Config
	store   Store
	pub     Publisher
	tools   *tools.Registry
	policy  Policy
	log     *slog.Logger
	ready   []ReadyChecker
	now     func() time.Time
	tokens  map[[32]byte]principal
	tenants map[string]Tenant
	handler http.Handler

	approvals   Approvals
	auditLog    AuditLog
	recorder    Recorder
	rules       RuleBook
	onRuleAdded func()
	postures    map[string]policy.Posture // by tenant
	outputs     Outputs
	live        Live
	transfers   Transfers
}

type principal struct {
	tenant    string
	role      string
	name      string
	workspace string // the token's default workspace; "" means "default"
	// runtime is the tenant's sandbox runtime, carried in every call's limits.
	runtime string
}

// Option configures optional behaviour of a Server.
type Option func(*Server)

// WithReadyChecks adds checks that /readyz runs.
func WithReadyChecks(checks ...ReadyChecker) Option {
	return func(s *Server) { s.ready = append(s.ready, checks...) }
}

// WithAudit serves GET /v1/audit from log and records approvers' decisions with rec.
func WithAudit(log AuditLog, rec Recorder) Option {
	return func(s *Server) { s.auditLog, s.recorder = log, rec }
}

// WithRuleBook lets approvers add "approve always" rules; onAdded, when not nil, runs after each.
func WithRuleBook(rb RuleBook, onAdded func()) Option {
	return func(s *Server) { s.rules, s.onRuleAdded = rb, onAdded }
}

// WithOutputs lets the Server answer with outputs that workers stored outside the records; without it such
// a call's envelope cannot be served (503).
func WithOutputs(o Outputs) Option {
	return func(s *Server) { s.outputs = o }
}

// WithClock makes the Server read the time from now (the queue server's clock, so that deadlines set by
// one replica are judged the same way by every other and by the workers); default time.Now.
func WithClock(now func() time.Time) Option {
	return func(s *Server) { s.now = now }
}

// Deps are the Server's required collaborators.
type Deps struct {
	Store     Store
	Publisher Publisher
	Tools     *tools.Registry
	Policy    Policy
	Approvals Approvals
	Log       *slog.Logger
}

// New returns a Server.
func New(cfg Config, deps Deps, opts ...Option) (*Server, error) {
	if cfg.MaxUploadBytes == 0 {
		cfg.MaxUploadBytes = DefaultConfig().MaxUploadBytes
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validate dispatcher config: %w", err)
	}
	if deps.Store == nil || deps.Publisher == nil || deps.Tools == nil || deps.Policy == nil || deps.Approvals == nil || deps.Log == nil {
		return nil, errors.New("new dispatcher: store, publisher, tools, policy, approvals and log are all required")
	}
	s := &Server{cfg: cfg, store: deps.Store, pub: deps.Publisher, tools: deps.Tools, policy: deps.Policy,
		approvals: deps.Approvals, log: deps.Log, now: time.Now, tokens: map[[32]byte]principal{},
		postures: map[string]policy.Posture{}}
	s.tenants = make(map[string]Tenant, len(cfg.Tenants))
	for _, t := range cfg.Tenants {
		s.postures[t.Name], _ = policy.ParsePosture(t.Posture) // validated above
		s.tenants[t.Name] = t
		for _, tok := range t.Tokens {
			h, _ := tok.hash() // validated above
			var key [32]byte
			b, _ := hex.DecodeString(h)
			copy(key[:], b)
			role := tok.Role
			if role == "" {
				role = RoleCaller
			}
			s.tokens[key] = principal{tenant: t.Name, role: role, name: tok.Name, workspace: tok.Workspace, runtime: t.Runtime}
		}
	}
	for _, o := range opts {
		o(s)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("POST /v1/calls", s.auth(s.postCall))
	mux.Handle("GET /v1/calls/{id}", s.auth(s.getCall))
	mux.Handle("DELETE /v1/calls/{id}", s.auth(s.deleteCall))
	mux.Handle("GET /v1/calls/{id}/events", s.auth(s.getEvents))
	mux.Handle("GET /v1/calls/{id}/{stream}", s.auth(s.getStream))
	mux.Handle("GET /v1/tools", s.auth(s.listTools))
	mux.Handle("POST /v1/policy/check", s.auth(s.checkPolicy))
	mux.Handle("GET /v1/approvals", s.auth(s.approver(s.listApprovals)))
	mux.Handle("POST /v1/approvals/{id}", s.auth(s.approver(s.decideApproval)))
	mux.Handle("GET /v1/audit", s.auth(s.readAudit))
	s.routeWorkspaces(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no endpoint %s %s: see GET /v1/tools, POST /v1/calls, GET /v1/calls/{id}", r.Method, r.URL.Path))
	})
	s.handler = mux
	return s, nil
}

// Handler returns the API's root handler.
func (s *Server) Handler() http.Handler { return s.handler }

type ctxKey struct{}

func principalFrom(ctx context.Context) principal { return ctx.Value(ctxKey{}).(principal) }

// auth resolves the bearer token to a tenant, comparing digests in constant time.
func (s *Server) auth(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		token, ok := strings.CutPrefix(h, "Bearer ")
		if !ok || token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="toolpool"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "send your token as 'Authorization: Bearer TOKEN'")
			return
		}
		_, span := tracing.Start(r.Context(), "authenticate")
		defer tracing.End(span, nil)
		// Tokens are looked up by their SHA-256: timing can only reveal bits of a digest, which do not help
		// guess a token.
		found, ok := s.tokens[sha256.Sum256([]byte(token))]
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="toolpool", error="invalid_token"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "the bearer token is not known: check TOOLPOOL_TOKEN or the dispatcher's tenants config")
			return
		}
		span.End() // the decision, record and publish spans are its siblings, not its children
		next(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, found)))
	})
}

// callRequest is the body of POST /v1/calls.
type callRequest struct {
	Tool           string          `json:"tool"`
	Args           json.RawMessage `json:"args"`
	Workspace      string          `json:"workspace"`
	TimeoutMS      *int64          `json:"timeout_ms"`
	DeadlineMS     *int64          `json:"deadline_ms"`
	OutputBytes    int64           `json:"output_bytes"`
	MemoryBytes    int64           `json:"memory_bytes"`
	CPUMillis      int64           `json:"cpu_millis"`
	PIDs           int64           `json:"pids"`
	TmpBytes       int64           `json:"tmp_bytes"`
	Wait           *bool           `json:"wait"`
	IdempotencyKey string          `json:"idempotency_key"`
	Tools          json.RawMessage `json:"tools"`
	// id, when not empty, is the call's id (call.Request.ID): a second request with it finds the first's
	// call, as with an idempotency key. Front ends only; never decoded.
	id string
}

// requestError is a problem with the request that the client must fix.
type requestError struct {
	code       int
	typ        string
	msg        string
	retryAfter int // seconds, for 429 and 503
}

func badRequest(format string, a ...any) *requestError {
	return &requestError{code: http.StatusBadRequest, typ: "invalid_request", msg: fmt.Sprintf(format, a...)}
}

// decodeBody reads a JSON object body strictly: bounded size, valid UTF-8, no unknown fields, one value.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, v any) *requestError {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return &requestError{code: http.StatusRequestEntityTooLarge, typ: "too_large",
			msg: fmt.Sprintf("the request body is over the %d-byte limit: send less (write large files in parts)", s.cfg.MaxBodyBytes)}
	}
	if err != nil {
		return badRequest("read request body: %v", err)
	}
	if !utf8.Valid(body) {
		return badRequest("the request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("the request body is not the expected JSON object: %s", describeJSONError(err))
	}
	if dec.More() {
		return badRequest("the request body has data after the JSON object: send exactly one object")
	}
	return nil
}

func describeJSONError(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("syntax error at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &typ):
		return fmt.Sprintf("field %q must be %s, got JSON %s", typ.Field, typ.Type, typ.Value)
	case errors.Is(err, io.EOF):
		return "the body is empty"
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return strings.TrimPrefix(err.Error(), "json: ") + " (known: tool, args, workspace, timeout_ms, deadline_ms, output_bytes, memory_bytes, cpu_millis, pids, tmp_bytes, wait, idempotency_key, tools)"
	}
	return err.Error()
}

func (s *Server) postCall(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	var req callRequest
	if rerr := s.decodeBody(w, r, &req); rerr != nil {
		writeError(w, rerr.code, rerr.typ, rerr.msg)
		return
	}
	if key := r.Header.Get("Idempotency-Key"); key != "" && req.IdempotencyKey == "" {
		req.IdempotencyKey = key
	}
	c, res, rerr := s.submit(r.Context(), p, &req)
	if rerr == errNotRecorded || (rerr == nil && c == nil) {
		writeResult(w, res) // queued but not recorded, or answered at once (read_output)
		return
	}
	if rerr != nil {
		writeRequestError(w, rerr)
		return
	}
	if wantsEvents(r) {
		s.follow(w, r, p.tenant, res.ID, position{})
		return
	}
	if res.Status.Terminal() || (req.Wait != nil && !*req.Wait) || res.Status == call.StatusPendingApproval {
		s.writeCall(r.Context(), w, res)
		return
	}
	wait := min(time.Duration(c.Limits.TimeoutMS)*time.Millisecond+30*time.Second, s.cfg.MaxWait)
	s.waitAndWrite(w, r, c.ID, wait)
}

// submit admits req and accepts the call, for POST /v1/calls and Submit. A local tool's call that policy
// allows (read_output) is answered at once and never queued nor recorded: it returns a nil call with the
// final result. Otherwise it returns the call and accept's answer (errNotRecorded included).
func (s *Server) submit(ctx context.Context, p principal, req *callRequest) (*call.Call, *call.Result, *requestError) {
	c, dec, rerr := s.admit(ctx, p, req)
	if rerr != nil {
		return nil, nil, rerr
	}
	if tool, _ := s.tools.Lookup(c.Tool); tool.Local && dec.Action == policy.Allow {
		res, rerr := s.readOutput(ctx, c)
		return nil, res, rerr
	}
	res, rerr := s.accept(ctx, c, dec, req.IdempotencyKey != "" || req.id != "")
	return c, res, rerr
}

// admit turns a request into a call: names, tool, schema, policy and limits. It publishes nothing.
func (s *Server) admit(ctx context.Context, p principal, req *callRequest) (*call.Call, policy.Decision, *requestError) {
	var none policy.Decision
	if req.Tool == "" {
		return nil, none, badRequest(`"tool" is missing: name one of %s`, strings.Join(s.tools.Names(), ", "))
	}
	if req.Workspace == "" {
		req.Workspace = cmp.Or(p.workspace, "default")
	}
	if err := call.ValidateName("workspace", req.Workspace); err != nil {
		return nil, none, badRequest("%v", err)
	}
	requestTools, err := policy.ParseRequestTools(req.Tools)
	if err != nil {
		return nil, none, badRequest("%v", err)
	}
	tool, ok := s.tools.Lookup(req.Tool)
	if !ok || !s.policy.ToolEnabled(p.tenant, req.Tool, requestTools) {
		var names []string
		for _, t := range s.enabledTools(p.tenant, requestTools) {
			names = append(names, t.Name)
		}
		return nil, none, &requestError{code: http.StatusUnprocessableEntity, typ: call.ErrInvalidParams,
			msg: fmt.Sprintf("unknown tool %q: the tools you can call are %s", req.Tool, strings.Join(names, ", "))}
	}
	if len(req.Args) == 0 || string(req.Args) == "null" {
		req.Args = json.RawMessage("{}")
	}
	if err := tool.Validate(req.Args); err != nil {
		return nil, none, &requestError{code: http.StatusUnprocessableEntity, typ: call.ErrInvalidParams, msg: err.Error()}
	}
	if req.TimeoutMS != nil && *req.TimeoutMS <= 0 {
		return nil, none, badRequest("timeout_ms must be a positive number of milliseconds, got %d", *req.TimeoutMS)
	}
	if req.DeadlineMS != nil && *req.DeadlineMS <= 0 {
		return nil, none, badRequest("deadline_ms must be a positive number of milliseconds, got %d", *req.DeadlineMS)
	}
	if req.OutputBytes < 0 || req.MemoryBytes < 0 || req.CPUMillis < 0 || req.PIDs < 0 || req.TmpBytes < 0 {
		return nil, none, badRequest("output_bytes, memory_bytes, cpu_millis, pids and tmp_bytes must not be negative")
	}
	if rerr := s.cfg.Ceilings.check(req); rerr != nil {
		return nil, none, rerr
	}
	facts := tool.Facts(req.Args)
	dec := s.policy.Decide(ctx, policy.Request{
		Tenant: p.tenant, Tool: tool.Name, Kind: string(tool.Kind), RequestTools: requestTools, Posture: s.postures[p.tenant],
		Facts: policy.Facts{Paths: facts.Paths, Command: facts.Command, Env: facts.Env, Cwd: facts.Cwd, URL: facts.URL},
	})
	c := &call.Call{
		ID: call.NewID(), Tenant: p.tenant, Workspace: req.Workspace, Tool: tool.Name, Args: req.Args,
		CreatedAt:   s.now().UTC(),
		Decision:    &call.Decision{Action: string(dec.Action), Rule: dec.Rule, Reason: dec.Reason},
		TraceParent: tracing.Inject(ctx),
	}
	c.ArgsDigest = call.ArgsDigest(req.Args)
	switch {
	case req.id != "":
		c.ID = req.id
	case req.IdempotencyKey != "":
		c.ID = idempotentID(p.tenant, req.IdempotencyKey)
	}
	queueTimeout := s.cfg.QueueTimeout
	if req.DeadlineMS != nil {
		queueTimeout = min(queueTimeout, time.Duration(*req.DeadlineMS)*time.Millisecond)
	}
	c.Deadline = c.CreatedAt.Add(queueTimeout)
	c.Limits, c.Decision.Clamped = s.limits(p.tenant, req, tool, dec.Limits)
	c.Limits.Runtime = p.runtime
	if tool.TakesDeniedGlobs() { // the others' calls would carry them to no use, in every message and record
		c.Limits.DeniedGlobs = dec.Limits.DeniedGlobs
	}
	return c, dec, nil
}

// limits clamps what the request asked for to what policy and config allow, and says what it lowered.
// Resources above a ceiling never get here (Ceilings.check refuses them).
func (s *Server) limits(tenant string, req *callRequest, tool *tools.Tool, pl policy.Limits) (call.Limits, []string) {
	var clamped []string
	timeout := s.cfg.DefaultTimeout
	if tool.DefaultTimeout > 0 {
		timeout = tool.DefaultTimeout
	}
	if req.TimeoutMS != nil {
		timeout = time.Duration(*req.TimeoutMS) * time.Millisecond
	}
	if timeout > s.cfg.MaxTimeout {
		timeout = s.cfg.MaxTimeout
		clamped = append(clamped, fmt.Sprintf("timeout_ms lowered to %d, this server's most", timeout.Milliseconds()))
	}
	if pl.TimeoutMS > 0 && timeout > time.Duration(pl.TimeoutMS)*time.Millisecond {
		timeout = time.Duration(pl.TimeoutMS) * time.Millisecond
		clamped = append(clamped, fmt.Sprintf("timeout_ms lowered to %d, the policy's most for %s", pl.TimeoutMS, tool.Name))
	}
	output := s.cfg.DefaultOutputBytes
	if t := s.tenants[tenant]; t.OutputBytes > 0 {
		output = t.OutputBytes
	}
	if tool.Custom && tool.DefaultOutputBytes > 0 {
		output = tool.DefaultOutputBytes
	}
	if req.OutputBytes > 0 {
		if req.OutputBytes > s.cfg.MaxOutputBytes {
			clamped = append(clamped, fmt.Sprintf("output_bytes lowered to %d, this server's most", s.cfg.MaxOutputBytes))
		}
		output = req.OutputBytes
	}
	output = min(output, s.cfg.MaxOutputBytes)
	if pl.OutputBytes > 0 && output > pl.OutputBytes {
		if req.OutputBytes > pl.OutputBytes {
			clamped = append(clamped, fmt.Sprintf("output_bytes lowered to %d, the policy's most for %s", pl.OutputBytes, tool.Name))
		}
		output = pl.OutputBytes
	}
	return call.Limits{TimeoutMS: timeout.Milliseconds(), OutputBytes: output, MemoryBytes: req.MemoryBytes,
		CPUMillis: req.CPUMillis, PIDs: req.PIDs, TmpBytes: req.TmpBytes,
		Network: pl.Network, AllowedDomains: pl.AllowedDomains, AllowedPorts: pl.AllowedPorts}, clamped
}

// idempotentID derives a call id from the tenant and its idempotency key, so a retried POST finds the call
// the first one created.
func idempotentID(tenant, key string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + key))
	return "c_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16]))
}

// accept records the call with its decision and, when allowed, queues it. An allowed call is queued
// first and recorded second, so that a failed publish leaves nothing behind (a retry with the same
// idempotency key runs the call) and a dispatcher that stops in between leaves a queued call whose
// worker records it; when only the record fails, the queued call is accepted all the same and returned
// with errNotRecorded (answer 202, nothing to wait on yet). A call with an idempotency key whose id exists
// already returns the existing call, or 409 when the key was used for another call.
func (s *Server) accept(ctx context.Context, c *call.Call, dec policy.Decision, keyed bool) (*call.Result, *requestError) {
	if keyed {
		rec, err := s.store.Get(ctx, c.ID)
		if err == nil {
			return sameCall(rec.Result, c)
		}
		if !errors.Is(err, queue.ErrNotFound) {
			s.log.ErrorContext(ctx, "read call", "call_id", c.ID, "error", err)
			return nil, &requestError{code: http.StatusServiceUnavailable, typ: call.ErrInternal, retryAfter: 1, msg: "toolpool could not read the call's idempotency key; retry with the same idempotency_key"}
		}
	}
	var res *call.Result
	switch dec.Action {
	case policy.Deny:
		res = call.NewResult(c, call.StatusDenied)
		res.Fail(call.StatusDenied, call.ErrPolicyDenied, dec.Reason)
		res.FinishedAt = c.CreatedAt
	case policy.Ask:
		c.Deadline = c.CreatedAt.Add(s.cfg.ApprovalTTL)
		res = call.NewResult(c, call.StatusPendingApproval)
		res.Output = "the call waits for a person's approval: " + dec.Reason
		// Parked before it is recorded: an approval without a record is dropped by the reconciler.
		if err := s.approvals.PutPending(ctx, &call.Pending{Call: c, ExpiresAt: c.Deadline}); err != nil {
			s.log.ErrorContext(ctx, "park call for approval", "call_id", c.ID, "error", err)
			return nil, &requestError{code: http.StatusServiceUnavailable, typ: call.ErrInternal, retryAfter: 1, msg: "toolpool could not park the call for approval; retry with the same idempotency_key"}
		}
	default:
		res = call.NewResult(c, call.StatusQueued)
		if err := s.pub.Publish(ctx, c); err != nil {
			switch {
			case errors.Is(err, queue.ErrTenantFull):
				return nil, &requestError{code: http.StatusTooManyRequests, typ: call.ErrQuota, retryAfter: 5,
					msg: fmt.Sprintf("tenant %s has as many calls queued and running as it may; wait for some to finish and retry", c.Tenant)}
			case errors.Is(err, queue.ErrTooLarge):
				return nil, &requestError{code: http.StatusRequestEntityTooLarge, typ: "too_large",
					msg: "the call's arguments are too large to queue: send less (write large files in parts)"}
			}
			s.log.ErrorContext(ctx, "publish call", "call_id", c.ID, "error", err)
			return nil, &requestError{code: http.StatusServiceUnavailable, typ: call.ErrInternal, retryAfter: 1,
				msg: "toolpool could not queue the call; it was not accepted: retry with the same idempotency_key"}
		}
	}
	if _, err := s.store.Create(ctx, res); err != nil {
		if errors.Is(err, queue.ErrExists) {
			if rec, gerr := s.store.Get(ctx, c.ID); gerr == nil {
				return sameCall(rec.Result, c)
			}
		}
		s.log.ErrorContext(ctx, "record call", "call_id", c.ID, "error", err)
		if res.Status == call.StatusQueued {
			// Queued, so accepted: its worker records it (worker.WithCreator). Nothing to wait on yet.
			res.Output = "the call is queued; toolpool could not record it yet: poll GET /v1/calls/" + c.ID
			return res, errNotRecorded
		}
		return nil, &requestError{code: http.StatusServiceUnavailable, typ: call.ErrInternal, retryAfter: 1, msg: "toolpool could not record the call; retry with the same idempotency_key"}
	}
	return res, nil
}

// errNotRecorded is accept's answer for a call that was queued but not recorded: accepted, with nothing
// to wait on yet.
var errNotRecorded = &requestError{code: http.StatusAccepted}

// sameCall returns existing, the call that an idempotency key names already, when the request c asks for
// the same call (tool, workspace and arguments); 409 when it asks for another.
func sameCall(existing *call.Result, c *call.Call) (*call.Result, *requestError) {
	if existing.Tenant == c.Tenant && existing.Tool == c.Tool && existing.Workspace == c.Workspace && existing.ArgsDigest == c.ArgsDigest {
		return existing, nil
	}
	return nil, &requestError{code: http.StatusConflict, typ: "idempotency_key_reused",
		msg: fmt.Sprintf("this idempotency_key was used for call %s (%s in workspace %s, arguments %s) within its window: a key names one call; send a new key for a new call, or the same request to get that call",
			existing.ID, existing.Tool, existing.Workspace, existing.ArgsDigest)}
}

// expireIfDue ends a call that is still queued past its deadline: no worker started it in time. It
// returns the record as it stands after the attempt.
func (s *Server) expireIfDue(ctx context.Context, rec queue.Record) *call.Result {
	r := rec.Result
	if (r.Status != call.StatusQueued && r.Status != call.StatusPendingApproval) || r.Deadline.IsZero() || s.now().Before(r.Deadline) {
		return r
	}
	if r.Status == call.StatusPendingApproval {
		_ = s.approvals.DeletePending(ctx, r.Tenant, r.ID)
	}
	expire(r, s.now())
	if _, err := s.store.Update(ctx, r, rec.Revision); err != nil {
		if cur, gerr := s.store.Get(ctx, r.ID); gerr == nil {
			return cur.Result // a worker got to it first
		}
	}
	return r
}

// expire ends a queued or pending call that passed its deadline unrun.
func expire(r *call.Result, now time.Time) {
	if r.Status == call.StatusPendingApproval {
		r.Fail(call.StatusExpired, call.ErrExpired, "no one approved the call before its approval expired; it did not run")
	} else {
		r.Fail(call.StatusExpired, call.ErrExpired, "no worker started the call before its deadline; it did not run. Check that workers are up, or give a longer deadline_ms.")
	}
	r.FinishedAt = now.UTC()
}

// enabledTools is the tools tenant may use (and a request's tools map leaves on), in the registry's order.
func (s *Server) enabledTools(tenant string, requestTools map[string]bool) []*tools.Tool {
	var enabled []*tools.Tool
	for _, t := range s.tools.List() {
		if s.policy.ToolEnabled(tenant, t.Name, requestTools) {
			enabled = append(enabled, t)
		}
	}
	return enabled
}

func (s *Server) waitAndWrite(w http.ResponseWriter, r *http.Request, id string, wait time.Duration) {
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	res, err := s.awaitResult(ctx, id, nil)
	if res == nil {
		if errors.Is(err, queue.ErrNotFound) {
			writeError(w, http.StatusNotFound, call.ErrNotFound, fmt.Sprintf("no call %s", id))
			return
		}
		s.log.Error("wait for call", "call_id", id, "error", err)
		writeError(w, http.StatusServiceUnavailable, call.ErrInternal, "toolpool could not read the call's state; poll GET /v1/calls/"+id)
		return
	}
	s.writeCall(r.Context(), w, res)
}

// awaitResult waits for the call's record to be final, past its deadline in the queue (it then ends
// expired), or to satisfy until; a nil until stops at pending approval. When ctx ends first it returns
// the latest record with ctx's error.
func (s *Server) awaitResult(ctx context.Context, id string, until func(*call.Result) bool) (*call.Result, error) {
	if until == nil {
		until = func(r *call.Result) bool { return r.Status == call.StatusPendingApproval }
	}
	res, err := s.store.Wait(ctx, id, func(r *call.Result) bool {
		return r.Status.Terminal() || until(r) ||
			(r.Status == call.StatusQueued && !r.Deadline.IsZero() && s.now().After(r.Deadline))
	})
	if res != nil && res.Status == call.StatusQueued {
		if rec, gerr := s.store.Get(context.WithoutCancel(ctx), id); gerr == nil {
			res = s.expireIfDue(context.WithoutCancel(ctx), rec)
		}
	}
	return res, err
}

// lookup reads the record of tenant's call id; another tenant's call is one that does not exist (404).
func (s *Server) lookup(ctx context.Context, tenant, id string) (queue.Record, *requestError) {
	rec, err := s.store.Get(ctx, id)
	if errors.Is(err, queue.ErrNotFound) || (err == nil && rec.Result.Tenant != tenant) {
		return queue.Record{}, &requestError{code: http.StatusNotFound, typ: call.ErrNotFound, msg: fmt.Sprintf("no call %s for tenant %s", id, tenant)}
	}
	if err != nil {
		s.log.ErrorContext(ctx, "read call", "call_id", id, "error", err)
		return queue.Record{}, &requestError{code: http.StatusServiceUnavailable, typ: call.ErrInternal, retryAfter: 1, msg: "toolpool could not read the call; retry"}
	}
	return rec, nil
}

func (s *Server) getCall(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	id := r.PathValue("id")
	rec, rerr := s.lookup(r.Context(), p.tenant, id)
	if rerr != nil {
		writeRequestError(w, rerr)
		return
	}
	res := s.expireIfDue(r.Context(), rec)
	waitParam := r.URL.Query().Get("wait")
	if waitParam == "" || res.Status.Terminal() {
		s.writeCall(r.Context(), w, res)
		return
	}
	wait, err := time.ParseDuration(waitParam)
	if err != nil || wait < 0 {
		writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("wait=%q is not a duration: use e.g. wait=30s", waitParam))
		return
	}
	s.waitAndWrite(w, r, id, min(wait, s.cfg.MaxWait))
}

func (s *Server) deleteCall(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	res, rerr := s.cancel(r.Context(), principalFrom(r.Context()), id)
	switch {
	case rerr != nil:
		writeRequestError(w, rerr)
	case res.Status == call.StatusRunning:
		s.waitAndWrite(w, r, id, 10*time.Second)
	default:
		s.writeCall(r.Context(), w, res)
	}
}

// cancel ends a queued or pending call at once, or asks the worker running it to kill its container (the
// record stays running, with CancelRequested, until the worker records the end). It returns the record
// as it stands after the request; a final call is returned unchanged.
func (s *Server) cancel(ctx context.Context, p principal, id string) (*call.Result, *requestError) {
	for range 5 {
		rec, rerr := s.lookup(ctx, p.tenant, id)
		if rerr != nil {
			return nil, rerr
		}
		res := rec.Result
		if res.Status.Terminal() {
			return res, nil
		}
		parked := res.Status == call.StatusPendingApproval
		if res.Status == call.StatusRunning {
			// The worker that runs it watches for this request and kills the container.
			res.CancelRequested = true
		} else {
			res.Fail(call.StatusCancelled, call.ErrCancelled, "the call was cancelled before it ran")
			res.FinishedAt = s.now().UTC()
		}
		if _, err := s.store.Update(ctx, res, rec.Revision); errors.Is(err, queue.ErrConflict) {
			continue // it moved on: look again
		} else if err != nil {
			return nil, &requestError{code: http.StatusServiceUnavailable, typ: call.ErrInternal, msg: "toolpool could not cancel the call; retry"}
		}
		if parked {
			_ = s.approvals.DeletePending(ctx, p.tenant, id)
		}
		return res, nil
	}
	return nil, &requestError{code: http.StatusConflict, typ: "conflict", msg: "the call kept changing while it was being cancelled; retry"}
}

func (s *Server) listTools(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	format := r.URL.Query().Get("format")
	list, err := tools.Render(format, s.enabledTools(p.tenant, nil), tools.WithNetwork(s.networkGranted(r.Context(), p.tenant)))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	body := map[string]any{"tools": list}
	if format == tools.FormatMCP {
		// MCP's ListToolsResult, whole as 2026-07-28 requires it; a tenant's list is its own (private).
		body["resultType"], body["ttlMs"], body["cacheScope"] = "complete", 0, "private"
	}
	writeJSON(w, http.StatusOK, body)
}

// checkPolicy answers what policy would decide for a call, without running it.
func (s *Server) checkPolicy(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	var req callRequest
	if rerr := s.decodeBody(w, r, &req); rerr != nil {
		writeError(w, rerr.code, rerr.typ, rerr.msg)
		return
	}
	c, dec, rerr := s.admit(r.Context(), p, &req)
	if rerr != nil {
		writeError(w, rerr.code, rerr.typ, rerr.msg)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tool": c.Tool, "decision": c.Decision, "limits": c.Limits, "would_run": dec.Action == policy.Allow})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	for _, check := range s.ready {
		if err := check(ctx); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "error": err.Error()})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// statusCode maps a call's status to the HTTP code of DESIGN.md §3.
func statusCode(s call.Status) int {
	switch s {
	case call.StatusDenied:
		return http.StatusForbidden
	case call.StatusQueued, call.StatusRunning, call.StatusPendingApproval:
		return http.StatusAccepted
	}
	return http.StatusOK
}

// writeCall answers with a call's envelope, with the output fields a worker stored outside the record
// read back in.
func (s *Server) writeCall(ctx context.Context, w http.ResponseWriter, r *call.Result) {
	full, err := s.present(ctx, r)
	if err != nil {
		s.log.ErrorContext(ctx, "read stored output", "call_id", r.ID, "error", err)
		writeError(w, http.StatusServiceUnavailable, call.ErrInternal, "toolpool could not read the call's stored output; retry GET /v1/calls/"+r.ID)
		return
	}
	writeResult(w, full)
}

// present returns r as clients see it: the output fields a worker stored outside the record read back
// in, and no object names.
func (s *Server) present(ctx context.Context, r *call.Result) (*call.Result, error) {
	if len(r.Stored) > 0 {
		full, err := s.fillStored(ctx, r)
		if err != nil {
			return nil, err
		}
		r = full
	}
	if len(r.Streams) > 0 {
		shown := *r
		shown.Streams = make(map[string]*call.Stream, len(r.Streams))
		for name, st := range r.Streams {
			shown.Streams[name] = &call.Stream{Bytes: st.Bytes, Kept: st.Kept}
		}
		r = &shown
	}
	return r, nil
}

// fillStored returns a copy of r with each stored output field read back in, and without Stored.
func (s *Server) fillStored(ctx context.Context, r *call.Result) (*call.Result, error) {
	if s.outputs == nil {
		return nil, errors.New("this dispatcher has no output store")
	}
	full := *r
	full.Stored = nil
	for field, name := range r.Stored {
		b, err := s.outputs.ReadOutput(ctx, name, 0, -1)
		if err != nil {
			return nil, err
		}
		switch field {
		case "output":
			full.Output = string(b)
		case "stdout":
			full.Stdout = string(b)
		case "stderr":
			full.Stderr = string(b)
		default:
			return nil, fmt.Errorf("record names stored field %q that this dispatcher does not know", field)
		}
	}
	return &full, nil
}

func writeResult(w http.ResponseWriter, r *call.Result) {
	w.Header().Set("Location", "/v1/calls/"+r.ID)
	writeJSON(w, statusCode(r.Status), r)
}

func writeRequestError(w http.ResponseWriter, e *requestError) {
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(e.retryAfter))
	}
	writeError(w, e.code, e.typ, e.msg)
}

func writeError(w http.ResponseWriter, code int, typ, msg string) {
	writeJSON(w, code, map[string]any{"error": call.ErrorInfo{Type: typ, Message: msg}})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}
