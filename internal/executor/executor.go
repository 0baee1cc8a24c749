// Package executor is the one package that turns a call into a container: it plans a tool call
// (tools.Plan, the call's workspace and quota, its egress, its limits) into a sandbox.Spec, runs it on a
// sandbox.Runtime, and assembles the sandbox.Outcome into the call's call.Result (Finish). It also runs
// the one workspace operation that needs a container, a git clone (Clone).
//
// It knows nothing of the queue: claiming, fencing, recording and settling deliveries are the worker's
// (internal/worker), which calls Run and Finish once it holds a call's claim. A command's full output is
// gathered by a Capture the caller supplies.
package executor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy/deniedpath"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tools/egress"
	"github.com/toolpool/toolpool/internal/workspace"
)

// Config configures an Executor.
type Config struct {
	// Worker names the worker this executor runs for, in the messages of results.
	Worker string
	// RunnerBinary is the host path of the static binary mounted read-only as the in-container tool runner.
	RunnerBinary string
	// Image, when set, is the OCI image (in the runtime's store) that every call runs in, instead of the
	// read-only view of the host's system directories; a custom tool's own image still wins.
	Image string
	// CaptureBytes is how much of each of a call's stdout and stderr the sandbox keeps in memory (head and
	// tail), from which the envelope is made; at least the call's output cap.
	CaptureBytes int64
	// EgressDir holds the per-call egress proxy sockets; Egress makes each call's proxy from the
	// operator's base rules, which the call's limits (policy's domains and ports) narrow. A nil Egress
	// refuses every call that needs egress.
	EgressDir string
	Egress    *egress.Gateway
	// Now is the clock of results' timestamps; default time.Now.
	Now func() time.Time
}

// Executor runs calls in fresh containers. Safe for concurrent use.
type Executor struct {
	cfg        Config
	runtime    sandbox.Runtime
	tools      *tools.Registry
	workspaces *workspace.Manager
	log        *slog.Logger
	finder     deniedpath.Finder // what the denied globs match in each workspace (hiddenPaths)
}

// New returns an Executor that runs calls on rt, their tools looked up in reg and their workspaces
// prepared and held by ws.
func New(cfg Config, rt sandbox.Runtime, reg *tools.Registry, ws *workspace.Manager, log *slog.Logger) *Executor {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Executor{cfg: cfg, runtime: rt, tools: reg, workspaces: ws, log: log}
}

// ErrCancelRequested is the cause with which the caller of Run cancels its context when the call's
// cancel was requested (Finish then records the call as cancelled by request); any other cause reads as
// the worker shutting down.
var ErrCancelRequested = errors.New("cancelled by request")

// Capture gathers a command's output (run_shell, custom tools) while its container runs, besides what the
// sandbox keeps for the envelope.
type Capture interface {
	// Stdout and Stderr receive the streams as the container prints them (sandbox.Spec's watchers).
	Stdout() io.Writer
	Stderr() io.Writer
	// Finish ends the capture once the container is gone; started is false when it never started
	// (sandbox.ErrNotStarted). It returns the streams it kept, by name (call.StreamStdout, StreamStderr).
	Finish(ctx context.Context, started bool) map[string]*call.Stream
}

// Execution is how one call's execution went, for Finish. Its zero value is a call that did not start.
type Execution struct {
	tool    *tools.Tool
	timeout time.Duration
	out     sandbox.Outcome
	failed  *call.ErrorInfo
	// streams are a command's full output streams, as its Capture kept them.
	streams map[string]*call.Stream
	egress  []call.EgressConn
	// output is a host operation's JSON output.
	output string
}

// OnHost is the Execution of a call carried out on the host rather than in a container (a workspace
// operation): its JSON output, or the error to report, and the connections its egress proxy made (a
// clone's).
func OnHost(output string, egress []call.EgressConn, failed *call.ErrorInfo) Execution {
	return Execution{output: output, egress: egress, failed: failed}
}
