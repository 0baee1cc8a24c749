// Package dispatcher is toolpool's call service and its HTTP API. The service (service.go, calls.go,
// approvals.go, stream.go, workspaces.go) authenticates nothing and speaks no protocol: it checks each
// call against its tool's schema and the policy, records it durably, publishes it for a worker, and
// answers with the call's result envelope, or refuses with a *call.Rejection classed by its Kind. The
// HTTP API (http*.go, type api over the Server) is one adapter over it: it authenticates the tenant,
// decodes requests, and maps a Kind to a status code in one place (httpStatus, httperr.go);
// internal/mcp is the other, through the methods of calls.go. It keeps no state between requests: every call lives in the Store, so any replica
// can answer for any call.
package dispatcher

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/tools"
)

// Store is the durable record of each call: the whole of the queue's Records contract, which the
// dispatcher creates, reads, updates and waits on.
type Store = queue.Records

// Publisher hands a call to the workers.
type Publisher interface {
	Publish(ctx context.Context, c *call.Call) error
}

// Policy decides calls and says which tools a tenant may see.
type Policy interface {
	policy.Engine
	ToolEnabled(tenant, tool string, requestTools map[string]bool) bool
	CheckImage(tenant, tool, ref string) (policy.ImageVerdict, error)
}

// Approvals parks calls that wait for a person's approval: the queue's Approvals contract, all of it.
type Approvals = queue.Approvals

// AuditLog reads the audit log: the reading half of queue.Audit.
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

// Outputs reads output fields that workers kept outside a call's record (call.Result.Stored): the
// reading half of queue.Outputs.
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
	// image is the tenant's default image (Tenant.Image), for calls that ask for none.
	image string
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
			s.tokens[key] = principal{tenant: t.Name, role: role, name: tok.Name, workspace: tok.Workspace, runtime: t.Runtime, image: t.Image}
		}
	}
	for _, o := range opts {
		o(s)
	}
	s.handler = (&api{s}).routes()
	return s, nil
}

type ctxKey struct{}
