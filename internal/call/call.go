// Package call holds toolpool's wire types: the Call a dispatcher publishes, the Result envelope that
// every API path returns (docs/architecture.md), and the classed errors of the call service (Rejection,
// Kind). It imports nothing of toolpool's and only the standard library, so every other package may
// depend on it.
package call

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Status is the state of a call. Terminal statuses never change once recorded.
type Status string

// The statuses of a call: the envelope's "status" (docs/architecture.md).
const (
	StatusQueued          Status = "queued"
	StatusPendingApproval Status = "pending_approval"
	StatusRunning         Status = "running"
	StatusOK              Status = "ok"
	StatusError           Status = "error"
	StatusTimeout         Status = "timeout"
	StatusDenied          Status = "denied"
	StatusCancelled       Status = "cancelled"
	StatusExpired         Status = "expired"
	StatusLost            Status = "lost"
	// StatusUnknown is never a record's: it is what an answer about a call says when toolpool could not
	// read the call's state just then (a store failover). The call exists or may exist; ask again.
	StatusUnknown Status = "unknown"
)

// Terminal reports whether s is a final status.
func (s Status) Terminal() bool {
	switch s {
	case StatusOK, StatusError, StatusTimeout, StatusDenied, StatusCancelled, StatusExpired, StatusLost:
		return true
	}
	return false
}

// Error types carried in Result.Error.Type.
const (
	ErrInvalidParams    = "invalid_params"
	ErrNotFound         = "not_found"
	ErrPermissionDenied = "permission_denied"
	ErrPolicyDenied     = "policy_denied"
	ErrTimeout          = "timeout"
	ErrOOM              = "oom"
	ErrExitCode         = "exit_code"
	ErrQuota            = "quota_exceeded"
	ErrCancelled        = "cancelled"
	ErrExpired          = "expired"
	ErrLost             = "lost"
	ErrInternal         = "internal"

	// ErrRuntimeUnavailable: the worker that took the call lacks the sandbox runtime the call requires.
	ErrRuntimeUnavailable = "runtime_unavailable"
	// ErrImagePullFailed: the worker could not pull the call's image (registry down, credentials refused,
	// no such image, content that did not verify); nothing ran.
	ErrImagePullFailed = "image_pull_failed"
	// ErrImageRefused: the call's image may not run (over the worker's size limit, a hostile layer, a
	// reference that does not parse); nothing ran.
	ErrImageRefused = "image_refused"
	// ErrCheckpoint: the call's workspace could not be restored from, or its changes saved to, the object
	// storage that keeps workspaces; the message says which, and whether the call ran.
	ErrCheckpoint = "checkpoint_failed"
)

// Limits bound one call. Zero means "the configured default".
type Limits struct {
	TimeoutMS   int64 `json:"timeout_ms,omitempty"`
	OutputBytes int64 `json:"output_bytes,omitempty"`
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	PIDs        int64 `json:"pids,omitempty"`
	CPUMillis   int64 `json:"cpu_millis,omitempty"` // CPU quota in thousandths of a core
	TmpBytes    int64 `json:"tmp_bytes,omitempty"`  // size of the call's /tmp
	// Network grants the call's container egress. Only policy sets it; requests cannot.
	Network bool `json:"network,omitempty"`
	// AllowedDomains, when not nil, is the only domains the call's egress may reach (policy's allowlist);
	// an empty, non-nil list allows none, and survives the wire as [].
	AllowedDomains []string `json:"allowed_domains,omitzero"`
	// AllowedPorts, when not nil, is the only destination ports the call's egress may reach (policy's
	// list); an empty, non-nil list allows none.
	AllowedPorts []int `json:"allowed_ports,omitzero"`
	// Runtime names the sandbox runtime the call must run under ("gvisor"); empty means the worker's
	// default. Only the dispatcher's tenant configuration sets it; requests cannot. A worker that does not
	// offer it refuses the call (ErrRuntimeUnavailable) and never runs it under another runtime.
	Runtime string `json:"runtime,omitempty"`
	// DeniedGlobs are the path patterns policy denies to the call (policy.Limits.DeniedGlobs). The worker
	// hands them to the in-container runner of the tools that read or write files, which neither opens nor
	// reports a path they match, and hides what they match in the workspace from every other tool's
	// container (run_shell, custom tools: sandbox.Spec.Hidden). Only policy sets them; they are not part of the call's arguments, so the
	// record, the approval and the audit show the arguments as the client sent them.
	DeniedGlobs []string `json:"denied_globs,omitempty"`
	// ReadOnlyWorkspace mounts the call's workspace read-only in its container (policy.Limits'
	// ReadOnlyWorkspace: the tenant's read-only posture). Only policy sets it; requests cannot.
	ReadOnlyWorkspace bool `json:"read_only_workspace,omitempty"`
	// WriteGitControl lets the call's container write git's control files (policy.Limits'
	// WriteGitControl); they are read-only in it otherwise. Only policy sets it.
	WriteGitControl bool `json:"write_git_control,omitempty"`
}

// Decision is the policy verdict on a call and the rule that produced it.
type Decision struct {
	Action string `json:"action"` // allow, ask, deny
	Rule   string `json:"rule,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Clamped says which limits the request asked for were lowered, to what and why.
	Clamped []string `json:"clamped,omitempty"`
}

// Call is one tool invocation as it travels from the dispatcher to a worker.
type Call struct {
	ID        string          `json:"id"`
	Tenant    string          `json:"tenant"`
	Workspace string          `json:"workspace"`
	Tool      string          `json:"tool"`
	Args      json.RawMessage `json:"args"`
	Limits    Limits          `json:"limits"`
	Decision  *Decision       `json:"decision,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	// Deadline, when set, is the time after which a call that has not started ends expired, unrun.
	Deadline time.Time `json:"deadline,omitzero"`
	// ArgsDigest is "sha256:" and the hex digest of Args as received.
	ArgsDigest string `json:"args_digest,omitempty"`
	// TraceParent carries the W3C trace context of the request that accepted the call.
	TraceParent string `json:"traceparent,omitempty"`
	// Image is the OCI image reference the request asked for, admitted by policy. The call's container
	// runs on the first of: a custom tool's own image, Image, the workspace's default image (kept with
	// the workspace on the workers' side), TenantImage, the worker's default image; with none, the host
	// view.
	Image string `json:"image,omitempty"`
	// TenantImage is the tenant's default image as the dispatcher's config gave it, for a call whose
	// request and workspace name none.
	TenantImage string `json:"tenant_image,omitempty"`
}

// ErrorInfo is a machine-readable error type and a message written for the model.
type ErrorInfo struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// Timing is where a call's time went, in milliseconds.
type Timing struct {
	QueuedMS int64 `json:"queued_ms"`
	// SandboxMS is the time to make (cold) or claim (warm) the call's container and start its process.
	SandboxMS int64 `json:"sandbox_ms"`
	RunMS     int64 `json:"run_ms"`
	TotalMS   int64 `json:"total_ms"`
	// Warm reports that the call ran in a container the worker created ahead of it (its warm pool) rather
	// than one created for it; either way the container was fresh and served this call only.
	Warm bool `json:"warm"`
	// RestoreMS and CheckpointMS are the time spent bringing the call's workspace to its latest checkpoint
	// before it ran, and checkpointing its changes after, when workspaces are kept in object storage
	// (both within TotalMS).
	RestoreMS    int64 `json:"restore_ms,omitempty"`
	CheckpointMS int64 `json:"checkpoint_ms,omitempty"`
}

// Usage is what the call's container consumed.
type Usage struct {
	MaxRSSBytes    int64  `json:"max_rss_bytes"`
	CPUMS          int64  `json:"cpu_ms"`
	WallMS         int64  `json:"wall_ms"`
	Signal         string `json:"signal,omitempty"`
	WorkspaceBytes int64  `json:"workspace_bytes,omitempty"`
}

// Egress decisions of the worker's egress proxy (EgressConn.Decision).
const (
	EgressAllowed = "allowed" // the proxy connected (and tunnelled, forwarded or injected)
	EgressRefused = "refused" // a rule refused the destination; the client got a 403
	EgressFailed  = "failed"  // the destination was allowed but could not be reached; the client got a 502
)

// EgressConn is what the egress proxy did with a call's connections to one destination: every connection
// (a CONNECT tunnel or a plain-http request) with the same host, port, decision, rule and credential is
// counted in one entry. It never holds a credential's secret, only the binding's name.
type EgressConn struct {
	Host string `json:"host"`
	Port int    `json:"port"`
	// Decision is EgressAllowed, EgressRefused or EgressFailed.
	Decision string `json:"decision"`
	// Rule names why, from a closed set: the refusing rule ("domain-not-allowed", "port-not-allowed",
	// "domain-denied", "blocked-name", "non-public-address", "bad-request") or the failure
	// ("resolve-failed", "dial-failed", "upstream-tls"); empty when allowed.
	Rule string `json:"rule,omitempty"`
	// Reason says it in words, for the model and the operator.
	Reason string `json:"reason,omitempty"`
	// Credential names the operator's credential binding whose header the proxy added (TLS terminated).
	Credential string `json:"credential,omitempty"`
	// Connections counts the connections (or plain-http requests) this entry stands for.
	Connections int `json:"connections"`
	// BytesUp and BytesDown are what the call sent and received through them.
	BytesUp   int64 `json:"bytes_up"`
	BytesDown int64 `json:"bytes_down"`
}

// Result is the result envelope (docs/architecture.md): every API path returns this shape, for queued,
// running and finished calls alike.
type Result struct {
	ID          string     `json:"id"`
	Tenant      string     `json:"tenant"`
	Workspace   string     `json:"workspace"`
	Tool        string     `json:"tool"`
	Status      Status     `json:"status"`
	ExitCode    *int       `json:"exit_code,omitempty"`
	Output      string     `json:"output"`
	Stdout      string     `json:"stdout,omitempty"`
	Stderr      string     `json:"stderr,omitempty"`
	Truncated   bool       `json:"truncated"`
	OutputBytes int64      `json:"output_bytes"`
	Error       *ErrorInfo `json:"error,omitempty"`
	Decision    *Decision  `json:"decision,omitempty"`
	Timing      Timing     `json:"timing"`
	Usage       Usage      `json:"usage"`
	Worker      string     `json:"worker,omitempty"`
	// Attempt is the delivery of the call that ran it, from 1, set when a worker starts it: a call run
	// again after its worker was lost has a higher one, and its output starts again from byte 0 (a
	// follower gets a "restart" event). Deliveries that did not start it count too.
	Attempt uint64 `json:"attempt,omitempty"`
	// Image names the image the call ran on by digest (registry/repository@sha256:...); empty on the
	// host view.
	Image string `json:"image,omitempty"`
	// Egress lists the call's network connections through the worker's egress proxy, when it had any.
	Egress []EgressConn `json:"egress,omitempty"`
	// ArgsDigest is "sha256:" and the hex digest of the call's arguments as received: what an approval
	// binds to and what the audit log records instead of the arguments themselves.
	ArgsDigest string `json:"args_digest,omitempty"`
	// CancelRequested asks the worker running the call to kill it (DELETE /v1/calls/{id}).
	CancelRequested bool `json:"cancel_requested,omitempty"`
	// LeaseUntil is when the running worker's claim lapses unless it renews it; a worker that finds a
	// running call with a lapsed lease knows its runner is gone.
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	TraceID    string    `json:"trace_id,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	// Deadline is when a call that has not started ends expired.
	Deadline   time.Time `json:"deadline,omitzero"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// Stored names the output fields ("output", "stdout", "stderr") whose content a worker kept in the
	// output store instead of the record, each with its object's name: no record outgrows a queue message.
	// The dispatcher fills those fields from the store and answers without Stored, so clients never see
	// it.
	Stored map[string]string `json:"stored,omitempty"`
	// Streams describes the full stdout and stderr of a call that ran a command (run_shell, custom tools),
	// by stream name: how much it printed and how much of it can be read by range
	// (GET /v1/calls/{id}/stdout?offset=&limit=, or the read_output tool) for as long as the result is
	// kept. Absent for tools whose output is only the envelope's, and for a stream that printed nothing.
	Streams map[string]*Stream `json:"streams,omitempty"`
}

// The output streams of a call.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
)

// Stream is one full output stream of a call.
type Stream struct {
	// Bytes is how much the process printed on the stream.
	Bytes int64 `json:"bytes"`
	// Kept is how much of it, from its first byte, can be read by range: Bytes, or less when the stream
	// went past the per-call cap (or could not be stored: then 0).
	Kept int64 `json:"kept"`
	// Object names the stored copy in the output store, and Page the size of its pieces: byte n is in
	// object Object + "/" + n/Page, so that a read at any offset starts at its piece. The dispatcher
	// never shows them.
	Object string `json:"object,omitempty"`
	Page   int64  `json:"page,omitempty"`
}

// PageName names piece i of a stream stored in pieces.
func (s *Stream) PageName(i int64) string { return s.Object + "/" + strconv.FormatInt(i, 10) }

// NewResult returns the envelope of a call that has just been accepted with status s.
func NewResult(c *Call, s Status) *Result {
	return &Result{
		ID: c.ID, Tenant: c.Tenant, Workspace: c.Workspace, Tool: c.Tool,
		Status: s, Decision: c.Decision, CreatedAt: c.CreatedAt, Deadline: c.Deadline, ArgsDigest: c.ArgsDigest,
	}
}

// Fail sets a terminal status with an error type and message, and mirrors the message in Output so a model
// that reads only Output still learns what went wrong.
func (r *Result) Fail(s Status, errType, msg string) {
	r.Status = s
	r.Error = &ErrorInfo{Type: errType, Message: msg}
	if r.Output == "" {
		r.Output = msg
	}
}

// NewID returns a fresh call id: "c_" and 26 lowercase base32 characters (130 random bits), valid as a
// NATS subject token and KV key.
func NewID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("read random: %v", err)) // crypto/rand never fails on Linux
	}
	return "c_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// ValidateTenant checks a tenant name: ValidateName, and no '.', because the tenant is a token of NATS
// subjects and consumer names.
func ValidateTenant(name string) error {
	if err := ValidateName("tenant", name); err != nil {
		return err
	}
	if strings.Contains(name, ".") {
		return fmt.Errorf("tenant %q has a '.': use only letters, digits, '_' and '-'", name)
	}
	return nil
}

// MaxNameLen bounds tenant and workspace names.
const MaxNameLen = 64

// ValidateName checks a tenant or workspace name: 1 to MaxNameLen characters of [A-Za-z0-9._-], not starting
// with a dot or dash, and never "." or "..". what names the field in the error ("workspace").
func ValidateName(what, name string) error {
	if name == "" {
		return fmt.Errorf("%s is empty: give a name of letters, digits, '.', '_' or '-'", what)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%s %.20q... is %d characters long: the limit is %d", what, name, len(name), MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return fmt.Errorf("%s %q has the character %q: use only letters, digits, '.', '_' and '-'", what, name, c)
		}
	}
	if name[0] == '.' || name[0] == '-' {
		return fmt.Errorf("%s %q starts with %q: start it with a letter, digit or '_'", what, name, name[0])
	}
	return nil
}

// AuditEvent is one entry of the audit log: a decision or an outcome of a call.
type AuditEvent struct {
	Time       time.Time `json:"time"`
	Event      string    `json:"event"` // accepted, approved, rejected, finished
	Tenant     string    `json:"tenant"`
	CallID     string    `json:"call_id"`
	Tool       string    `json:"tool"`
	Workspace  string    `json:"workspace,omitempty"`
	ArgsDigest string    `json:"args_digest,omitempty"`
	Action     string    `json:"action,omitempty"` // the policy decision
	Rule       string    `json:"rule,omitempty"`
	Status     Status    `json:"status"`
	ErrorType  string    `json:"error_type,omitempty"`
	DurationMS int64     `json:"duration_ms,omitempty"`
	Worker     string    `json:"worker,omitempty"`
	Actor      string    `json:"actor,omitempty"` // who approved or rejected
	// Egress is the finished call's network connections (Result.Egress).
	Egress []EgressConn `json:"egress,omitempty"`
}

// Pending is a call parked for a person's approval, with what the approval binds to.
type Pending struct {
	Call      *Call     `json:"call"`
	ExpiresAt time.Time `json:"expires_at"`
}
