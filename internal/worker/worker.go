// Package worker is the worker service: it takes calls off the queue, claims each durably, runs it in a
// fresh container and records its one final result. It is built only on the interfaces it declares here and
// on internal/sandbox; cmd/worker picks the implementations.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"sync"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tools/egress"
)

// Store is the durable record of each call, updated by compare-and-set.
type Store interface {
	Get(ctx context.Context, id string) (queue.Record, error)
	Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error)
	// Wait returns the record once done is true for it, or the latest one with ctx's error.
	Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error)
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
	// Lease is how long a claim on a running call lasts without renewal; the worker renews it every
	// Heartbeat, so it must be several heartbeats long.
	Lease time.Duration
	// Image, when set, is the OCI image (in the runtime's store) that every call runs in, instead of the
	// read-only view of the host's system directories; a custom tool's own image still wins.
	Image string
	// WorkspaceQuota is the most disk space one workspace may use; 0 means no quota.
	WorkspaceQuota int64
	// EgressDir holds the per-call egress proxy sockets; Egress makes each call's proxy from the
	// operator's base rules, which the call's limits (policy's domains and ports) narrow. A nil Egress
	// refuses every call that needs egress.
	EgressDir string
	Egress    *egress.Gateway
	// MaxAttempts is the delivery after which a call that still cannot start is given up with an error;
	// keep it below the queue's max deliveries so the worker, not the server, settles it.
	MaxAttempts uint64
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
	case c.Lease < 2*c.Heartbeat:
		return fmt.Errorf("lease %s must be at least two heartbeats (%s)", c.Lease, 2*c.Heartbeat)
	}
	return nil
}

// Worker runs delivered calls. Safe for concurrent use: Handle runs once per delivery, concurrently.
type Worker struct {
	cfg        Config
	runtime    sandbox.Runtime
	store      Store
	tools      *tools.Registry
	log        *slog.Logger
	now        func() time.Time
	workspaces *Workspaces
}

// New returns a Worker.
func New(cfg Config, rt sandbox.Runtime, store Store, reg *tools.Registry, log *slog.Logger) (*Worker, error) {
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = time.Second
	}
	if cfg.Lease == 0 {
		cfg.Lease = 3 * cfg.Heartbeat
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = 8
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validate worker config: %w", err)
	}
	workspaces, err := NewWorkspaces(WorkspacesConfig{Dir: cfg.WorkspacesDir, UID: cfg.UID, GID: cfg.GID, Quota: cfg.WorkspaceQuota})
	if err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, runtime: rt, store: store, tools: reg, log: log, now: time.Now, workspaces: workspaces}
	return w, nil
}

// mayRunOverQuota reports whether a tool may run in a workspace over its quota: those that read, search or
// delete, and run_shell (so that files can be removed); never one that can only add data.
func mayRunOverQuota(t *tools.Tool) bool {
	switch t.Kind {
	case tools.KindRead, tools.KindSearch, tools.KindDelete, tools.KindExecute, tools.KindFetch:
		return !t.Custom
	}
	return false
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
	log := w.log.With("call_id", c.ID, "tenant", c.Tenant, "tool", c.Tool)
	stopBeat := w.heartbeat(ctx, d)
	s, res := w.process(ctx, c, d.Attempt())
	stopBeat()
	if s == settleRetry && d.Attempt() >= w.cfg.MaxAttempts && ctx.Err() == nil {
		s, res = w.giveUp(settleCtx, c, d.Attempt())
	}
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
		log.InfoContext(ctx, "call finished", "status", res.Status, "exit_code", res.ExitCode, "total_ms", res.Timing.TotalMS,
			"sandbox_ms", res.Timing.SandboxMS, "run_ms", res.Timing.RunMS, "warm", res.Timing.Warm)
	}
}

// heartbeat renews the delivery's ack deadline until the returned stop is called.
func (w *Worker) heartbeat(ctx context.Context, d queue.Delivery) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.every(ctx, func() bool { _ = d.InProgress(ctx); return true })
	}()
	return func() { cancel(); <-done }
}

// every runs fn once per heartbeat until ctx ends or fn returns false. It blocks.
func (w *Worker) every(ctx context.Context, fn func() bool) {
	t := time.NewTicker(w.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !fn() {
				return
			}
		}
	}
}

// Why a running call's context was cancelled.
var (
	errCancelRequested = errors.New("cancelled by request")
	errFenced          = errors.New("claim lost to another writer")
)

// process claims the call, runs it and records its final result. It returns how to settle the delivery and
// the final result when this worker recorded one.
//
// The fence against a second execution is the record, not the queue: JetStream matches acks and
// heartbeats by stream sequence, so a stalled worker's late ack can count for a redelivered copy. A call
// runs only after its record moved to running under this worker's lease by compare-and-set; a worker that
// cannot renew its lease kills its container and records nothing.
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
	now := w.now()
	switch {
	case r.Status.Terminal():
		return settleAck, nil // already final (cancelled while queued, or a duplicate delivery)
	case r.Status == call.StatusRunning && now.Before(r.LeaseUntil):
		// Its runner is alive (this is a redelivery after a stall or a lost ack): leave it running there.
		return settleRetry, nil
	case r.Status == call.StatusRunning:
		// Its runner vanished without a result. A call that may have changed files is never run twice.
		if tool, ok := w.tools.Lookup(c.Tool); !ok || !tool.ReadOnly() {
			r.Fail(call.StatusLost, call.ErrLost, fmt.Sprintf("worker %s stopped while running this call; it was not run again because %s can change files: check the workspace and call again if needed", r.Worker, c.Tool))
			r.FinishedAt, r.LeaseUntil = now, time.Time{}
			return w.record(storeCtx, r, rec.Revision)
		}
	case r.Status == call.StatusPendingApproval:
		return settleRetry, nil // published before its approval landed: wait for it
	}
	if r.CancelRequested {
		r.Fail(call.StatusCancelled, call.ErrCancelled, "the call was cancelled before it ran")
		r.FinishedAt = now
		return w.record(storeCtx, r, rec.Revision)
	}
	if !c.Deadline.IsZero() && now.After(c.Deadline) {
		r.Fail(call.StatusExpired, call.ErrExpired, "the call was not started before its deadline and did not run")
		r.FinishedAt = now
		return w.record(storeCtx, r, rec.Revision)
	}

	// Claim: the record moves to running under this worker's lease before the container starts.
	r.Status = call.StatusRunning
	r.Worker = w.cfg.ID
	r.StartedAt = now
	r.LeaseUntil = now.Add(w.cfg.Lease)
	r.Timing.QueuedMS = r.StartedAt.Sub(c.CreatedAt).Milliseconds()
	rev, err := w.store.Update(storeCtx, r, rec.Revision)
	if err != nil {
		return settleRetry, nil // someone else moved it (a cancel, another worker): look again later
	}
	claim := &claim{rev: rev, result: r}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopGuard := w.guard(runCtx, cancel, claim)
	out, runErr := w.run(runCtx, c)
	stopGuard()
	cause := context.Cause(runCtx)
	if errors.Is(cause, errFenced) {
		return settleAck, nil // the record belongs to another writer now; it settles the call
	}
	if errors.Is(runErr, sandbox.ErrNotStarted) && ctx.Err() == nil && cause == nil {
		// Nothing ran: hand it back as queued for this or another worker.
		w.log.WarnContext(ctx, "call did not start; offering it again", "call_id", c.ID, "attempt", attempt, "error", runErr)
		r.Status, r.Worker, r.StartedAt, r.LeaseUntil = call.StatusQueued, "", time.Time{}, time.Time{}
		_, _ = w.store.Update(storeCtx, r, claim.rev)
		return settleRetry, nil
	}
	w.complete(r, c, out, runErr, cause)
	r.LeaseUntil = time.Time{}
	for range 5 {
		s, res := w.record(storeCtx, r, claim.rev)
		if res != nil || s != settleRetry {
			return s, res
		}
		// The record moved while the call ran (a cancel request): record over it if it is still ours.
		cur, err := w.store.Get(storeCtx, c.ID)
		if err != nil {
			break
		}
		if cur.Result.Status.Terminal() || cur.Result.Worker != w.cfg.ID {
			return settleAck, nil
		}
		claim.rev = cur.Revision
	}
	return settleRetry, nil
}

// claim is this worker's hold on a running call's record: the revision it last wrote. guard and process
// share it; rev is updated under mu.
type claim struct {
	mu     sync.Mutex
	rev    uint64
	result *call.Result
}

// guard keeps the claim alive while the call runs: it renews the lease every heartbeat and watches the
// record, cancelling the run with errCancelRequested when a cancel is requested and with errFenced when
// the lease cannot be renewed because the record is no longer this worker's.
func (w *Worker) guard(ctx context.Context, cancel context.CancelCauseFunc, cl *claim) (stop func()) {
	ctx, stopCtx := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // renew
		defer wg.Done()
		w.every(ctx, func() bool { return w.renew(ctx, cancel, cl) })
	}()
	go func() { // watch for a cancel request, to act within a second rather than a heartbeat
		defer wg.Done()
		id := cl.result.ID
		r, err := w.store.Wait(ctx, id, func(r *call.Result) bool {
			return r.CancelRequested || r.Worker != w.cfg.ID || r.Status != call.StatusRunning
		})
		if err != nil || r == nil {
			return
		}
		if r.Worker != w.cfg.ID || r.Status != call.StatusRunning {
			cancel(errFenced)
			return
		}
		cancel(errCancelRequested)
	}()
	return func() { stopCtx(); wg.Wait() }
}

// giveUp ends a call that could not be started in MaxAttempts deliveries, unless it is final already or
// running under a live lease elsewhere.
func (w *Worker) giveUp(ctx context.Context, c *call.Call, attempt uint64) (settle, *call.Result) {
	rec, err := w.store.Get(ctx, c.ID)
	if err != nil {
		return settleRetry, nil
	}
	r := rec.Result
	switch {
	case r.Status.Terminal():
		return settleAck, nil
	case r.Status == call.StatusRunning && w.now().Before(r.LeaseUntil):
		return settleRetry, nil
	case r.Status == call.StatusPendingApproval:
		return settleAck, nil // the approval republishes it
	}
	r.Fail(call.StatusError, call.ErrInternal, fmt.Sprintf("toolpool could not start the call in %d attempts; it did not run. Retry later.", attempt))
	r.FinishedAt, r.LeaseUntil = w.now(), time.Time{}
	return w.record(ctx, r, rec.Revision)
}

// recordRetryFor bounds how long a final result is retried while the store is unreachable (a NATS restart).
const recordRetryFor = 2 * time.Minute

// record writes r at revision rev. A conflict returns settleRetry at once for the caller to decide; any
// other error is retried with backoff for recordRetryFor, so that a store outage does not lose a result.
// renew extends the claim's lease by one compare-and-set. It returns false, after cancelling the run,
// when the record is no longer this worker's (errFenced) or a cancel was requested (errCancelRequested).
func (w *Worker) renew(ctx context.Context, cancel context.CancelCauseFunc, cl *claim) bool {
	cl.mu.Lock()
	r := *cl.result
	r.LeaseUntil = w.now().Add(w.cfg.Lease)
	rev, err := w.store.Update(ctx, &r, cl.rev)
	if err == nil {
		cl.rev = rev
	}
	cl.mu.Unlock()
	if err == nil || !errors.Is(err, queue.ErrConflict) {
		return true // renewed, or a transient failure the lease has room for
	}
	cur, err := w.store.Get(ctx, r.ID)
	switch {
	case err != nil:
		return true
	case cur.Result.Worker != w.cfg.ID || cur.Result.Status != call.StatusRunning:
		cancel(errFenced)
		return false
	case cur.Result.CancelRequested:
		cancel(errCancelRequested)
	}
	cl.mu.Lock()
	cl.rev = cur.Revision
	cl.mu.Unlock()
	return !cur.Result.CancelRequested
}

func (w *Worker) record(ctx context.Context, r *call.Result, rev uint64) (settle, *call.Result) {
	deadline := w.now().Add(recordRetryFor)
	backoff := 50 * time.Millisecond
	for {
		_, err := w.store.Update(ctx, r, rev)
		if err == nil {
			return settleAck, r
		}
		if errors.Is(err, queue.ErrConflict) || w.now().After(deadline) {
			if !errors.Is(err, queue.ErrConflict) {
				w.log.ErrorContext(ctx, "record result", "call_id", r.ID, "error", err)
			}
			return settleRetry, nil
		}
		select {
		case <-ctx.Done():
			return settleRetry, nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
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
	ws, err := w.workspaces.Prepare(c.Tenant, c.Workspace)
	var over *QuotaError
	switch {
	case errors.As(err, &over) && !mayRunOverQuota(tool):
		return runOutcome{tool: tool, planErr: &call.ErrorInfo{Type: call.ErrQuota, Message: over.Error() +
			". Reading, searching, deleting and run_shell (for rm) still work."}}, nil
	case err != nil && over == nil:
		return runOutcome{}, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	quota := w.workspaces.Quota()
	switch {
	case quota == 0:
		quota = -1 // no quota: the sandbox neither measures nor caps
	case over != nil:
		quota = max(ws.Bytes, 1) // over quota: the call may shrink the workspace, never grow it
	}
	timeout := time.Duration(c.Limits.TimeoutMS) * time.Millisecond
	if inv.Timeout > 0 && (timeout == 0 || inv.Timeout < timeout) {
		timeout = inv.Timeout
	}
	if timeout == 0 {
		timeout = tool.DefaultTimeout
	}
	spec := sandbox.Spec{
		ID: c.ID, Argv: inv.Argv, Env: inv.Env, Cwd: inv.Cwd, Stdin: inv.Stdin, WorkspaceDir: ws.Dir, Image: cmp.Or(inv.Image, w.cfg.Image),
		Limits: sandbox.Limits{
			Timeout: timeout, OutputBytes: c.Limits.OutputBytes, MemoryBytes: c.Limits.MemoryBytes,
			PIDs: c.Limits.PIDs, CPUMillis: c.Limits.CPUMillis, Network: c.Limits.Network, WorkspaceBytes: quota,
		},
	}
	if inv.Runner {
		spec.Mounts = append(spec.Mounts, sandbox.Mount{Source: w.cfg.RunnerBinary, Destination: tools.RunnerPath})
	}
	finishEgress, err := w.withEgress(ctx, c, inv, &spec)
	if err != nil {
		return runOutcome{}, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	out, err := w.runtime.Run(ctx, spec)
	egressConns := finishEgress()
	if errors.Is(err, sandbox.ErrNoProgram) {
		// Nothing ran, and nothing would elsewhere: the call's own mistake, like arguments that do not plan.
		root := "the host's /usr"
		if spec.Image != "" {
			root = "image " + spec.Image
		}
		return runOutcome{tool: tool, planErr: &call.ErrorInfo{Type: call.ErrNotFound, Message: fmt.Sprintf(
			"the program %q does not exist in this sandbox's root filesystem (%s); use a program it has", spec.Argv[0], root)}}, nil
	}
	return runOutcome{tool: tool, out: out, timeout: timeout, egress: egressConns}, err
}

type runOutcome struct {
	tool    *tools.Tool
	timeout time.Duration
	out     sandbox.Outcome
	planErr *call.ErrorInfo
	egress  []call.EgressConn
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
	r.Timing.Warm = o.Warm
	r.Usage = call.Usage{MaxRSSBytes: o.MaxRSSBytes, CPUMS: o.CPUTime.Milliseconds(), WallMS: o.RunTime.Milliseconds(), Signal: o.Signal}
	if o.WorkspaceBytes >= 0 {
		r.Usage.WorkspaceBytes = o.WorkspaceBytes
		w.workspaces.Record(c.Tenant, c.Workspace, o.WorkspaceBytes) // the next call need not measure again
	}
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
	r.Egress = ro.egress
	r.Output += egressNote(ro.egress)
	switch {
	case errors.Is(cancelErr, errCancelRequested):
		r.Status = call.StatusCancelled
		r.Error = &call.ErrorInfo{Type: call.ErrCancelled, Message: "the call was cancelled while it ran; its container was killed"}
		r.Output += "\n[cancelled: " + r.Error.Message + "]"
	case cancelErr != nil:
		r.Status = call.StatusCancelled
		r.Error = &call.ErrorInfo{Type: call.ErrCancelled, Message: "the worker shut down while the call ran; its container was killed. Call again."}
		r.Output += "\n[cancelled: " + r.Error.Message + "]"
	case runErr != nil:
		r.Status = call.StatusError
		r.Error = &call.ErrorInfo{Type: call.ErrInternal, Message: "toolpool failed to run the call: " + runErr.Error()}
	case o.TimedOut:
		r.Status = call.StatusTimeout
		r.Error = &call.ErrorInfo{Type: call.ErrTimeout, Message: fmt.Sprintf("the call ran past its timeout of %s and every process of it was killed; what it printed before is above. Use a longer timeout_ms or a faster command.", ro.timeout)}
		r.Output += "\n[timed out: " + r.Error.Message + "]"
	case o.QuotaExceeded:
		r.Status = call.StatusError
		r.Error = &call.ErrorInfo{Type: call.ErrQuota, Message: fmt.Sprintf("the workspace grew past its quota of %s (it uses %s) and the call was stopped; later calls that add files are refused until files are deleted to bring it under the quota",
			formatBytes(w.workspaces.Quota()), formatBytes(o.WorkspaceBytes))}
		r.Output += "\n[" + r.Error.Message + "]"
	case o.OOMKilled:
		r.Status = call.StatusError
		r.Error = &call.ErrorInfo{Type: call.ErrOOM, Message: fmt.Sprintf("the call ran out of memory (peak %d MiB) and was killed; use less memory, or process the data in smaller pieces", o.MaxRSSBytes>>20)}
		r.Output += "\n[" + r.Error.Message + "]"
	}
}
