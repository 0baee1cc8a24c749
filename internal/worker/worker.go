// Package worker is the worker service: it takes calls off the queue, claims each durably, runs it in a
// fresh container and records its one final result. It is built only on the interfaces it declares here and
// on internal/sandbox; cmd/worker picks the implementations.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tools"
)

// Store is the durable record of each call, updated by compare-and-set.
type Store interface {
	Get(ctx context.Context, id string) (queue.Record, error)
	Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error)
}

// Config configures a Worker.
type Config struct {
	// ID names this worker in results and logs.
	ID string
	// WorkspacesDir holds every tenant's workspaces, as WorkspacesDir/<tenant>/<workspace>.
	WorkspacesDir string
	// RunnerBinary is the host path of the static binary mounted read-only as the in-container tool runner.
	RunnerBinary string
	// UID and GID own the workspaces; they must be the sandbox's user.
	UID, GID int
	// Heartbeat is how often a running call's claim on its delivery is renewed; keep it well below the
	// queue's ack wait.
	Heartbeat time.Duration
	// RetryDelay is how long a call that could not start waits before it is offered again.
	RetryDelay time.Duration
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	switch {
	case c.ID == "":
		return errors.New("worker id is empty")
	case c.WorkspacesDir == "" || !path.IsAbs(c.WorkspacesDir):
		return fmt.Errorf("workspaces dir %q must be an absolute path", c.WorkspacesDir)
	case c.Heartbeat <= 0:
		return errors.New("heartbeat interval must be positive")
	}
	return nil
}

// Worker runs delivered calls. Safe for concurrent use: Handle runs once per delivery, concurrently.
type Worker struct {
	cfg     Config
	runtime sandbox.Runtime
	store   Store
	tools   *tools.Registry
	log     *slog.Logger
	now     func() time.Time
}

// Option configures optional behaviour of a Worker.
type Option func(*Worker)

// WithClock replaces time.Now, for tests.
func WithClock(now func() time.Time) Option { return func(w *Worker) { w.now = now } }

// New returns a Worker.
func New(cfg Config, rt sandbox.Runtime, store Store, reg *tools.Registry, log *slog.Logger, opts ...Option) (*Worker, error) {
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = time.Second
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validate worker config: %w", err)
	}
	if err := os.MkdirAll(cfg.WorkspacesDir, 0o755); err != nil {
		return nil, fmt.Errorf("create workspaces dir: %w", err)
	}
	w := &Worker{cfg: cfg, runtime: rt, store: store, tools: reg, log: log, now: time.Now}
	for _, o := range opts {
		o(w)
	}
	return w, nil
}

// settle is the one decision of what happens to a delivery.
type settle int

const (
	settleAck   settle = iota // done: a final result is recorded, or the call was already final
	settleRetry               // not started here: offer it again
	settleTerm                // undeliverable: never offer it again
)

// Handle processes one delivery to the end and settles it. It blocks for the call's run. Cancelling ctx
// (the worker shutting down) kills a running call's container and records the call as cancelled.
func (w *Worker) Handle(ctx context.Context, d queue.Delivery) {
	settleCtx := context.WithoutCancel(ctx)
	c, err := d.Call()
	if err != nil {
		w.log.Error("drop undecodable call", "error", err)
		_ = d.Term(settleCtx, err.Error())
		return
	}
	log := w.log.With("call_id", c.ID, "tenant", c.Tenant, "tool", c.Tool, "worker", w.cfg.ID)
	stopBeat := w.heartbeat(ctx, d)
	s, res := w.process(ctx, c, d.Attempt())
	stopBeat()
	switch s {
	case settleAck:
		err = d.Ack(settleCtx)
	case settleRetry:
		err = d.Nak(settleCtx, w.cfg.RetryDelay)
	case settleTerm:
		err = d.Term(settleCtx, "no record for this call")
	}
	if err != nil {
		log.Warn("settle delivery", "error", err)
	}
	if res != nil {
		log.Info("call finished", "status", res.Status, "exit_code", res.ExitCode, "total_ms", res.Timing.TotalMS,
			"sandbox_ms", res.Timing.SandboxMS, "run_ms", res.Timing.RunMS, "trace_id", res.TraceID)
	}
}

// heartbeat renews the delivery's ack deadline until the returned stop is called.
func (w *Worker) heartbeat(ctx context.Context, d queue.Delivery) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(w.cfg.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = d.InProgress(ctx)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// process claims the call, runs it and records its final result. It returns how to settle the delivery and
// the final result when this worker recorded one.
func (w *Worker) process(ctx context.Context, c *call.Call, attempt uint64) (settle, *call.Result) {
	storeCtx := context.WithoutCancel(ctx)
	rec, err := w.store.Get(storeCtx, c.ID)
	if errors.Is(err, queue.ErrNotFound) {
		return settleTerm, nil
	}
	if err != nil {
		return settleRetry, nil
	}
	r := rec.Result
	switch {
	case r.Status.Terminal():
		return settleAck, nil // already final (cancelled while queued, or a duplicate delivery)
	case r.Status == call.StatusRunning:
		// A worker claimed it and then vanished before recording a result. A call that may have changed
		// files is never run twice.
		if tool, ok := w.tools.Lookup(c.Tool); !ok || !tool.ReadOnly() {
			r.Fail(call.StatusLost, call.ErrLost, fmt.Sprintf("worker %s stopped while running this call; it was not run again because %s can change files: check the workspace and call again if needed", r.Worker, c.Tool))
			r.FinishedAt = w.now()
			return w.record(storeCtx, r, rec.Revision)
		}
	}
	if !c.Deadline.IsZero() && w.now().After(c.Deadline) {
		r.Fail(call.StatusExpired, call.ErrExpired, "the call was not started before its deadline and did not run")
		r.FinishedAt = w.now()
		return w.record(storeCtx, r, rec.Revision)
	}

	// Claim: the record moves to running before the container starts.
	r.Status = call.StatusRunning
	r.Worker = w.cfg.ID
	r.StartedAt = w.now()
	r.Timing.QueuedMS = r.StartedAt.Sub(c.CreatedAt).Milliseconds()
	rev, err := w.store.Update(storeCtx, r, rec.Revision)
	if err != nil {
		// Someone else moved it (a cancel, another worker): look again on the next delivery.
		return settleRetry, nil
	}
	out, runErr := w.run(ctx, c)
	if errors.Is(runErr, sandbox.ErrNotStarted) && ctx.Err() == nil {
		// Nothing ran: hand it back as queued for this or another worker.
		w.log.Warn("call did not start; offering it again", "call_id", c.ID, "attempt", attempt, "error", runErr)
		r.Status, r.Worker, r.StartedAt = call.StatusQueued, "", time.Time{}
		if _, err := w.store.Update(storeCtx, r, rev); err != nil {
			return settleRetry, nil
		}
		return settleRetry, nil
	}
	w.complete(r, c, out, runErr, ctx.Err())
	return w.record(storeCtx, r, rev)
}

func (w *Worker) record(ctx context.Context, r *call.Result, rev uint64) (settle, *call.Result) {
	if _, err := w.store.Update(ctx, r, rev); err != nil {
		if errors.Is(err, queue.ErrConflict) {
			return settleAck, nil // another writer recorded the final state (a cancel)
		}
		w.log.Error("record result", "call_id", r.ID, "error", err)
		return settleRetry, nil
	}
	return settleAck, r
}

// run plans the call's process and runs it in a fresh container.
func (w *Worker) run(ctx context.Context, c *call.Call) (runOutcome, error) {
	tool, ok := w.tools.Lookup(c.Tool)
	if !ok {
		return runOutcome{planErr: &call.ErrorInfo{Type: call.ErrNotFound, Message: fmt.Sprintf("unknown tool %q", c.Tool)}}, nil
	}
	inv, err := tool.Plan(c.Args)
	if err != nil {
		return runOutcome{tool: tool, planErr: &call.ErrorInfo{Type: call.ErrInvalidParams, Message: err.Error()}}, nil
	}
	ws, err := w.prepareWorkspace(c.Tenant, c.Workspace)
	if err != nil {
		return runOutcome{}, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	timeout := time.Duration(c.Limits.TimeoutMS) * time.Millisecond
	if inv.Timeout > 0 && (timeout == 0 || inv.Timeout < timeout) {
		timeout = inv.Timeout
	}
	if timeout == 0 {
		timeout = tool.DefaultTimeout
	}
	spec := sandbox.Spec{
		ID: c.ID, Argv: inv.Argv, Env: inv.Env, Cwd: inv.Cwd, Stdin: inv.Stdin, WorkspaceDir: ws, Image: inv.Image,
		Limits: sandbox.Limits{
			Timeout: timeout, OutputBytes: c.Limits.OutputBytes, MemoryBytes: c.Limits.MemoryBytes,
			PIDs: c.Limits.PIDs, CPUMillis: c.Limits.CPUMillis, Network: c.Limits.Network,
		},
	}
	if inv.Runner {
		spec.Mounts = append(spec.Mounts, sandbox.Mount{Source: w.cfg.RunnerBinary, Destination: tools.RunnerPath})
	}
	out, err := w.runtime.Run(ctx, spec)
	return runOutcome{tool: tool, out: out, timeout: timeout}, err
}

type runOutcome struct {
	tool    *tools.Tool
	timeout time.Duration
	out     sandbox.Outcome
	planErr *call.ErrorInfo
}

// complete fills r with the final state of a call that ran (or failed to plan).
func (w *Worker) complete(r *call.Result, c *call.Call, ro runOutcome, runErr, cancelErr error) {
	r.FinishedAt = w.now()
	r.Timing.TotalMS = r.FinishedAt.Sub(c.CreatedAt).Milliseconds()
	if ro.planErr != nil {
		r.Fail(call.StatusError, ro.planErr.Type, ro.planErr.Message)
		return
	}
	o := ro.out
	r.Timing.SandboxMS = o.SandboxTime.Milliseconds()
	r.Timing.RunMS = o.RunTime.Milliseconds()
	r.Usage = call.Usage{MaxRSSBytes: o.MaxRSSBytes, CPUMS: o.CPUTime.Milliseconds(), WallMS: o.RunTime.Milliseconds(), Signal: o.Signal}
	if ro.tool != nil {
		ro.tool.Finish(tools.Run{
			Stdout: []byte(o.Stdout.String()), Stderr: []byte(o.Stderr.String()),
			StdoutBytes: o.Stdout.Total, StderrBytes: o.Stderr.Total,
			ExitCode: o.ExitCode, OutputBytes: c.Limits.OutputBytes,
		}).Apply(r)
		if o.Stdout.Truncated() || o.Stderr.Truncated() {
			r.Truncated = true
		}
	}
	switch {
	case cancelErr != nil:
		r.Fail(call.StatusCancelled, call.ErrCancelled, "the worker shut down while the call ran; its container was killed. Call again.")
	case runErr != nil:
		r.Status = call.StatusError
		r.Error = &call.ErrorInfo{Type: call.ErrInternal, Message: "toolpool failed to run the call: " + runErr.Error()}
	case o.TimedOut:
		r.Status = call.StatusTimeout
		r.Error = &call.ErrorInfo{Type: call.ErrTimeout, Message: fmt.Sprintf("the call ran past its timeout of %s and every process of it was killed; what it printed before is above. Use a longer timeout_ms or a faster command.", ro.timeout)}
		r.Output += "\n[timed out: " + r.Error.Message + "]"
	case o.OOMKilled:
		r.Status = call.StatusError
		r.Error = &call.ErrorInfo{Type: call.ErrOOM, Message: fmt.Sprintf("the call ran out of memory (peak %d MiB) and was killed; use less memory, or process the data in smaller pieces", o.MaxRSSBytes>>20)}
		r.Output += "\n[" + r.Error.Message + "]"
	}
}
