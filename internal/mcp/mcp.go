// Package mcp serves toolpool over the Model Context Protocol: a Streamable HTTP endpoint, mounted by the
// dispatcher at /mcp behind its bearer-token authentication, for protocol versions 2026-07-28 and
// 2025-11-25, built on the official Go SDK in its stateless mode. Its tools are the tenant's tools, and a
// tools/call takes the dispatcher's call path (Calls): policy, approvals, the queue, the audit log,
// metrics and the trace are those of POST /v1/calls.
//
// It keeps no state between HTTP requests, so any dispatcher replica answers any request. What the
// protocol carries from one request to another lives either in the request or in JetStream:
//
//   - Approvals. A call that policy holds for a person is offered to the person at the client when the
//     client can elicit and the token may approve. On 2026-07-28 the tools/call result asks for the
//     input (multi round-trip requests): its requestState is the call's id, and the client's retry,
//     at any replica, carries the answer. On 2025-11-25 the SDK's stateless mode cannot send a request
//     to the client, so the handler writes the elicitation/create request on the tools/call's own SSE
//     stream; its JSON-RPC id names the call and the digest of its arguments, and the client's answer,
//     POSTed to any replica, is applied there. Either way the decision goes through the approval path of
//     POST /v1/approvals/{id}, and the audit log records the token's holder "via mcp". Otherwise the
//     result says that the call waits for approval, with its id, and the model fetches the result later
//     with the toolpool_get_result tool.
//   - Client capabilities. 2026-07-28 sends them with every request. For 2025-11-25, which sends them only
//     in initialize, the answer to initialize carries an Mcp-Session-Id that encodes whether the client
//     can elicit (and a random part); the client sends it back with every request.
//   - Cancellation. On 2026-07-28 a client cancels by closing the request's stream: the handler's context
//     ends and it cancels the call. On 2025-11-25 notifications/cancelled arrives as another POST, at any
//     replica; the call's id is derived from the session id and the JSON-RPC id of the tools/call, so
//     that replica cancels it. Both kill the container as DELETE /v1/calls/{id} does.
package mcp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/tools"
)

// The protocol versions served, newest first.
var ProtocolVersions = []string{"2026-07-28", "2025-11-25"}

// modern is the first protocol version of the stateless era (per-request capabilities, multi round-trip
// requests, cancellation by closing the stream).
const modern = "2026-07-28"

// WorkspaceHeader names the workspace of a request's calls; a tools/call's _meta key WorkspaceMeta wins
// over it, and the token's default workspace applies when neither is given.
const (
	WorkspaceHeader = "Toolpool-Workspace"
	WorkspaceMeta   = "toolpool/workspace"
)

// ImageMeta is a tools/call's _meta key naming the OCI image the call runs on, as "image" does on POST
// /v1/calls (docs/images.md).
const ImageMeta = "toolpool/image"

// Calls is the dispatcher's call path. Every method acts for the caller that the request's context
// carries (the dispatcher's authentication put it there) and treats another tenant's call as one that
// does not exist. A refusal is a *call.Rejection, classed by its Kind (rejected maps it to the answer);
// other errors are toolpool's failures.
type Calls interface {
	// Tools lists the tools the caller may use, with hints from the tenant's policy.
	Tools(ctx context.Context) ([]tools.MCPTool, error)
	// Submit admits, records and (when policy allows) queues a call, and returns at once with its first
	// record: queued, pending_approval or denied.
	Submit(ctx context.Context, r call.Request) (*call.Result, error)
	// Wait returns the call's record once until (never nil) holds for it or it is final. When ctx ends
	// first, it returns the latest record and ctx's error.
	Wait(ctx context.Context, id string, until func(*call.Result) bool) (*call.Result, error)
	// Cancel cancels the call, killing its container when it runs, and returns without waiting.
	Cancel(ctx context.Context, id string) (*call.Result, error)
}

// Approvals decides calls that wait for a person, as POST /v1/approvals/{id} does.
type Approvals interface {
	// MayApprove reports whether the caller may approve calls.
	MayApprove(ctx context.Context) bool
	// Decide approves or denies the waiting call whose arguments have argsDigest.
	Decide(ctx context.Context, id, argsDigest string, approve bool) (*call.Result, error)
}

// Output follows the output of a running call as its worker reads it from the container, for progress
// notifications: from its first byte (what was printed before Follow started is replayed), then as it is
// printed. Bytes the live stream did not keep show as a note; the result always has the output. It is
// the Follow of queue.Live.
type Output interface {
	// Follow calls emit with each chunk of the call's output, from its first byte, in order and from one
	// goroutine, until ctx is done.
	Follow(ctx context.Context, id string, emit func(chunk string)) error
}

// Config configures the endpoint.
type Config struct {
	// AllowedOrigins are the browser origins ("https://app.example.com") that may call /mcp. A request
	// with another Origin header is refused with 403; a request without one (every non-browser client)
	// passes.
	AllowedOrigins []string `yaml:"allowed_origins"`
	// MaxWait bounds how long a tools/call waits for its result; past it, the result says the call still
	// runs and how to fetch its result.
	MaxWait time.Duration `yaml:"max_wait"`
	// ApprovalWait bounds how long a 2025-11-25 tools/call waits for the person's answer to an approval
	// prompt before it says that the call waits for approval.
	ApprovalWait time.Duration `yaml:"approval_wait"`
	// MaxBodyBytes bounds a request body; the dispatcher's own limit.
	MaxBodyBytes int64 `yaml:"-"`
	// Version is the server's version in serverInfo.
	Version string `yaml:"-"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{MaxWait: 5 * time.Minute, ApprovalWait: 10 * time.Minute, MaxBodyBytes: 8 << 20, Version: "dev"}
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	for _, o := range c.AllowedOrigins {
		if !strings.HasPrefix(o, "http://") && !strings.HasPrefix(o, "https://") || strings.Count(o, "/") != 2 {
			return fmt.Errorf("mcp allowed_origins: %q is not an origin: write scheme://host[:port], as a browser sends it", o)
		}
	}
	switch {
	case c.MaxWait <= 0:
		return errors.New("mcp max_wait must be positive")
	case c.ApprovalWait <= 0:
		return errors.New("mcp approval_wait must be positive")
	case c.MaxBodyBytes < 1024:
		return fmt.Errorf("mcp max body bytes %d is below 1024", c.MaxBodyBytes)
	}
	return nil
}

// Handler is the /mcp endpoint. Safe for concurrent use.
type Handler struct {
	cfg       Config
	calls     Calls
	approvals Approvals
	output    Output
	log       *slog.Logger
	impl      *sdk.Implementation
	stream    *sdk.StreamableHTTPHandler

	mu      sync.Mutex
	servers map[[sha256.Size]byte]*sdk.Server // by tool list (toolsKey); at most maxServers

	draining atomic.Bool // see Drain
}

// Drain tells the handler that the dispatcher is shutting down: a request cut from now on (its stream
// closed by the server, not by the client) leaves its call running, for toolpool_get_result at another
// replica, instead of cancelling it as a 2026-07-28 client's closed stream does. Call it before closing
// the server's connections. Safe to call more than once and concurrently.
func (h *Handler) Drain() { h.draining.Store(true) }

// maxServers bounds the cache of SDK servers: one per distinct tool list (tenants and policy versions).
const maxServers = 256

// Option configures optional behaviour of a Handler.
type Option func(*Handler)

// WithOutput streams running calls' output as progress notifications.
func WithOutput(o Output) Option { return func(h *Handler) { h.output = o } }

// New returns the endpoint's handler. Mount it behind authentication that puts the caller in the
// request's context for calls and approvals.
func New(cfg Config, calls Calls, approvals Approvals, log *slog.Logger, opts ...Option) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validate mcp config: %w", err)
	}
	if calls == nil || approvals == nil || log == nil {
		return nil, errors.New("new mcp handler: calls, approvals and log are all required")
	}
	h := &Handler{cfg: cfg, calls: calls, approvals: approvals, log: log,
		impl:    &sdk.Implementation{Name: "toolpool", Title: "toolpool", Version: cfg.Version},
		servers: map[[sha256.Size]byte]*sdk.Server{}}
	for _, o := range opts {
		o(h)
	}
	h.stream = sdk.NewStreamableHTTPHandler(h.server, &sdk.StreamableHTTPOptions{
		Stateless: true,
		// On 2026-07-28 closing the stream cancels the request (and so the call).
		PropagateRequestCancellation: true,
		MaxRequestBodyBytes:          cfg.MaxBodyBytes,
		// Bearer tokens are not ambient credentials and Origin is checked, so a DNS-rebound page gains
		// nothing; the SDK's Host check would refuse every request a reverse proxy on loopback forwards.
		DisableLocalhostProtection: true,
		Logger:                     log,
	})
	return h, nil
}

// ServeHTTP checks the request's Origin and body, handles what a stateless SDK server cannot route (a
// 2025-11-25 client's answer to an approval prompt, notifications/cancelled, its session id), and hands
// the rest to the SDK.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if o := r.Header.Get("Origin"); o != "" && !h.originAllowed(o) {
		writeRPCError(w, http.StatusForbidden, -32600, fmt.Sprintf("origin %q may not call this endpoint: add it to the dispatcher's mcp.allowed_origins", o))
		return
	}
	if ws := r.Header.Get(WorkspaceHeader); ws != "" {
		if err := call.ValidateName("workspace", ws); err != nil {
			writeRPCError(w, http.StatusBadRequest, -32600, WorkspaceHeader+": "+err.Error())
			return
		}
	}
	if r.Method != http.MethodPost {
		h.stream.ServeHTTP(w, r) // the stateless SDK answers 405 with Allow: POST
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeRPCError(w, http.StatusRequestEntityTooLarge, -32600, fmt.Sprintf("the request body is over the %d-byte limit", h.cfg.MaxBodyBytes))
		return
	}
	if err != nil {
		writeRPCError(w, http.StatusBadRequest, -32700, "read request body: "+err.Error())
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var msg message
	if json.Unmarshal(body, &msg) != nil {
		h.stream.ServeHTTP(w, r) // not one JSON-RPC object: the SDK says what is wrong with it
		return
	}
	session := parseSession(r.Header.Get("Mcp-Session-Id"))
	switch {
	case msg.Method == "" && len(msg.ID) > 0:
		if h.answerApproval(r.Context(), msg) {
			w.WriteHeader(http.StatusAccepted)
			return
		}
	case msg.Method == "notifications/cancelled":
		h.cancelLegacy(r.Context(), session, msg.Params)
	case msg.Method == "initialize":
		w.Header().Set("Mcp-Session-Id", newSession(msg.Params).String())
	case msg.Method == "tools/call":
		side := &sideWriter{ResponseWriter: w}
		w = side
		r = r.WithContext(context.WithValue(r.Context(), requestKey{}, &request{session: session, id: msg.ID, side: side}))
	}
	h.stream.ServeHTTP(w, r)
}

// message is a JSON-RPC message, as much of it as ServeHTTP looks at.
type message struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

// request is what ServeHTTP learnt about a tools/call from its HTTP request, for the tool handler.
type request struct {
	session session         // zero when the client sent no toolpool session id
	id      json.RawMessage // the JSON-RPC id
	side    *sideWriter     // the response stream, for a 2025-11-25 approval prompt
}

type requestKey struct{}

func requestFrom(ctx context.Context) *request {
	r, _ := ctx.Value(requestKey{}).(*request)
	if r == nil {
		return &request{}
	}
	return r
}

func (h *Handler) originAllowed(origin string) bool {
	for _, o := range h.cfg.AllowedOrigins {
		if strings.EqualFold(o, origin) {
			return true
		}
	}
	return false
}

// server is the SDK server for one HTTP request: the caller's tools and toolpool_get_result. Servers are
// shared by the requests whose tool lists are the same (building one costs milliseconds); their handlers
// act for the caller each request's context carries.
func (h *Handler) server(r *http.Request) *sdk.Server {
	list, err := h.calls.Tools(r.Context())
	if err != nil {
		h.log.ErrorContext(r.Context(), "list tools for mcp", "error", err)
		return nil // the SDK answers 400
	}
	key := toolsKey(list)
	h.mu.Lock()
	s := h.servers[key]
	h.mu.Unlock()
	if s != nil {
		return s
	}
	s = h.newServer(list)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.servers) >= maxServers {
		clear(h.servers)
	}
	h.servers[key] = s
	return s
}

func (h *Handler) newServer(list []tools.MCPTool) *sdk.Server {
	s := sdk.NewServer(h.impl, &sdk.ServerOptions{
		Instructions:              instructions,
		SupportedProtocolVersions: ProtocolVersions,
		Capabilities:              &sdk.ServerCapabilities{Tools: &sdk.ToolCapabilities{}},
		// The list is the tenant's own, and policy may change it at any time.
		SetCacheable: func(_ context.Context, _ sdk.Request, c *sdk.Cacheable) { c.TTLMs, c.CacheScope = 0, "private" },
		Logger:       h.log,
	})
	reserved := false
	for _, t := range list {
		reserved = reserved || t.Name == getResultName
		s.AddTool(sdkTool(t), h.callTool)
	}
	if !reserved {
		s.AddTool(getResultTool, h.getResult)
	}
	return s
}

// toolsKey identifies a tool list by everything newServer reads of it.
func toolsKey(list []tools.MCPTool) [sha256.Size]byte {
	d := sha256.New()
	for _, t := range list {
		a := t.Annotations
		fmt.Fprintf(d, "%d:%s%d:%s%d:%s%v%v%v%v;", len(t.Name), t.Name, len(t.Description), t.Description, len(t.InputSchema), t.InputSchema,
			a.ReadOnlyHint, a.DestructiveHint, a.IdempotentHint, a.OpenWorldHint)
	}
	var key [sha256.Size]byte
	d.Sum(key[:0])
	return key
}

const instructions = "toolpool runs each tool call in a fresh sandbox container whose only writable place is " +
	"the workspace, mounted at /workspace. Policy decides every call: a denied call's result says why and what to do " +
	"instead; a call held for approval runs once a person approves it (you may be asked). When a result says that " +
	"a call waits or still runs, call toolpool_get_result with its id later."

// writeRPCError answers an HTTP request with a JSON-RPC error that belongs to no request.
func writeRPCError(w http.ResponseWriter, status, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": code, "message": msg}})
}
