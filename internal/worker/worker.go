// Package worker is the worker service: it takes calls off the queue, claims each durably, has it run
// (internal/executor runs it in a fresh container; workspace operations run on the host with
// internal/workspace) and records its one final result. It is built only on the interfaces it declares
// here and on internal/sandbox; cmd/worker picks the implementations.
package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/executor"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tools/egress"
	"github.com/toolpool/toolpool/internal/workspace"
)

// Store is the durable record of each call, updated by compare-and-set.
type Store interface {
	Get(ctx context.Context, id string) (queue.Record, error)
	Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error)
	// Wait returns the record once done is true for it, or the latest one with ctx's error.
	Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error)
}

// Leases are the claims of running calls, kept on the queue server's clock: a lease that goes its TTL
// without renewal is gone, whatever any worker's clock says.
type Leases interface {
	// AcquireLease takes call id's lease for holder; queue.ErrExists when someone holds it.
	AcquireLease(ctx context.Context, id, holder string, ttl time.Duration) (queue.Lease, error)
	// LeaseHeld reports whether anyone holds call id's lease.
	LeaseHeld(ctx context.Context, id string) (bool, error)
}

// Outputs keeps output fields too large for a record, by object name (queue.OutputName).
type Outputs interface {
	// PutOutput stores what r yields under name and returns its size.
	PutOutput(ctx context.Context, name string, r io.Reader) (int64, error)
	// DeleteOutput removes an object; a missing one is not an error.
	DeleteOutput(ctx context.Context, name string) error
}

// Creator writes a call's first record, for a call whose dispatcher queued it and stopped before it
// recorded it.
type Creator interface {
	Create(ctx context.Context, r *call.Result) (uint64, error)
}

// Config configures a Worker.
type Config struct {
	// ID names this worker in results, leases and logs.
	ID string
	// WorkspacesDir holds every tenant's workspaces, as WorkspacesDir/<tenant>/<workspace>.
	WorkspacesDir string
	// RunnerBinary is the host path of the static binary mounted read-only as the in-container tool runner.
	RunnerBinary string
	// UID and GID own the workspaces; they must be the sandbox's user.
	UID, GID int
	// Heartbeat is how often a running call's delivery is kept and its lease renewed.
	Heartbeat time.Duration
	// AckWait is the queue's ack wait: a delivery not kept for that long is handed to another worker. At
	// least three heartbeats.
	AckWait time.Duration
	// MaxDeliver is the queue's max deliveries. A call that still cannot start at delivery MaxDeliver-1 is
	// given up with an error by the worker, so that the server never drops it silently.
	MaxDeliver int
	// RetryDelay is how long a call that could not start waits before it is offered again.
	RetryDelay time.Duration
	// Lease is the TTL of a running call's lease on the queue server (cmd/worker's default: three
	// heartbeats, and at least the second the server's TTLs need): at least
	// two heartbeats, at most the ack wait, so that a redelivered call of a vanished worker finds its lease
	// gone. A worker that has not renewed the lease for Lease minus one heartbeat (its own monotonic
	// clock) kills the call and records nothing: by then others may judge the call's runner gone.
	Lease time.Duration
	// CaptureBytes is how much of each of a call's stdout and stderr the sandbox keeps in memory (head and
	// tail), from which the envelope is made; at least the call's output cap. Default 1 MiB.
	CaptureBytes int64
	// FullOutputBytes is how much of each stream of a command (run_shell, custom tools) is kept, from its
	// first byte, in the output store for reading by range; negative keeps none. Default 64 MiB.
	FullOutputBytes int64
	// SpoolDir holds the files in which a running command's full output is gathered before it is stored
	// (unlinked at once, so nothing is left behind). Default os.TempDir().
	SpoolDir string
	// InlineBytes is how large (JSON-encoded) an output field may be inside the record; larger ones go to
	// the output store. Default 64 KiB.
	InlineBytes int
	// Now is the queue server's clock as this worker estimates it, for deadlines and timestamps; default
	// time.Now.
	Now func() time.Time
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
	// Workspaces configures the workspace operations (idle TTL, per-tenant limits, archive limits); its
	// Dir, UID and GID are the fields above.
	Workspaces workspace.Config
}

// Validate checks the configuration, and that the worker's timing fits the queue's.
func (c *Config) Validate() error {
	switch {
	case c.ID == "":
		return errors.New("worker id is empty")
	case c.WorkspacesDir == "" || !path.IsAbs(c.WorkspacesDir):
		return fmt.Errorf("workspaces dir %q must be an absolute path", c.WorkspacesDir)
	case c.Heartbeat <= 0:
		return errors.New("heartbeat interval must be positive")
	case c.AckWait < 3*c.Heartbeat:
		return fmt.Errorf("worker heartbeat %s is not well below the queue's ack wait %s: lower the worker's heartbeat to at most %s, or raise the dispatcher's queue.ack_wait to at least %s",
			c.Heartbeat, c.AckWait, c.AckWait/3, 3*c.Heartbeat)
	case c.Lease < 2*c.Heartbeat:
		return fmt.Errorf("worker lease %s must be at least two heartbeats (%s): raise the lease or lower the heartbeat", c.Lease, 2*c.Heartbeat)
	case c.Lease > c.AckWait:
		return fmt.Errorf("worker lease %s is longer than the queue's ack wait %s: a vanished worker's call would be redelivered while its lease lives; lower the lease to at most %s",
			c.Lease, c.AckWait, c.AckWait)
	case c.MaxDeliver < 3:
		return fmt.Errorf("the queue's max deliver %d is below 3: raise the dispatcher's queue.max_deliver", c.MaxDeliver)
	}
	return nil
}

// Option configures optional behaviour of a Worker.
type Option func(*Worker)

// WithLeases gives the worker its lease store (required).
func WithLeases(l Leases) Option { return func(w *Worker) { w.leases = l } }

// WithOutputs gives the worker a store for outputs too large for a record; without one such outputs are
// cut to fit, and say so.
func WithOutputs(o Outputs) Option { return func(w *Worker) { w.outputs = o } }

// WithCreator lets the worker record a call that was queued but never recorded (its dispatcher stopped
// in between); without one such a call waits for the dispatchers' reconciler.
func WithCreator(c Creator) Option { return func(w *Worker) { w.creator = c } }

// Worker runs delivered calls. Safe for concurrent use: Handle runs once per delivery, concurrently.
type Worker struct {
	cfg       Config
	store     Store
	leases    Leases
	outputs   Outputs
	live      Live
	creator   Creator
	tools     *tools.Registry
	log       *slog.Logger
	now       func() time.Time
	wsm       *workspace.Manager
	exec      *executor.Executor
	transfers Transfers
}

// New returns a Worker.
func New(cfg Config, rt sandbox.Runtime, store Store, reg *tools.Registry, log *slog.Logger, opts ...Option) (*Worker, error) {
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = time.Second
	}
	if cfg.Lease == 0 {
		cfg.Lease = 3 * cfg.Heartbeat
	}
	if cfg.InlineBytes == 0 {
		cfg.InlineBytes = 64 << 10
	}
	if cfg.CaptureBytes == 0 {
		cfg.CaptureBytes = 1 << 20
	}
	if cfg.FullOutputBytes == 0 {
		cfg.FullOutputBytes = 64 << 20
	}
	if cfg.SpoolDir == "" {
		cfg.SpoolDir = os.TempDir()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validate worker config: %w", err)
	}
	if err := os.MkdirAll(cfg.SpoolDir, 0o700); err != nil {
		return nil, fmt.Errorf("create spool dir: %w", err)
	}
	wcfg := cfg.Workspaces
	wcfg.Dir, wcfg.UID, wcfg.GID, wcfg.Quota = cfg.WorkspacesDir, cfg.UID, cfg.GID, cfg.WorkspaceQuota
	wsm, err := workspace.New(wcfg)
	if err != nil {
		return nil, err
	}
	exec := executor.New(executor.Config{
		Worker: cfg.ID, RunnerBinary: cfg.RunnerBinary, Image: cfg.Image, CaptureBytes: cfg.CaptureBytes,
		EgressDir: cfg.EgressDir, Egress: cfg.Egress, Now: cfg.Now,
	}, rt, reg, wsm, log)
	w := &Worker{cfg: cfg, store: store, tools: reg, log: log, now: cfg.Now, wsm: wsm, exec: exec}
	for _, o := range opts {
		o(w)
	}
	if w.leases == nil {
		return nil, errors.New("new worker: a lease store is required (worker.WithLeases)")
	}
	return w, nil
}

// settle is the one decision of what happens to a delivery.
type settle int

const (
	settleAck   settle = iota // done: a final result is recorded, or the call was already final
	settleRetry               // not started here: offer it again
	settleTerm                // undeliverable: never offer it again
	// settleLeave leaves the delivery unsettled: the call belongs to a runner elsewhere (alive, or about
	// to be judged gone), whose heartbeats and ack count for the message; if it vanishes, the queue
	// delivers the call again after the ack wait.
	settleLeave
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
	if s == settleRetry && d.Attempt() >= uint64(w.cfg.MaxDeliver-1) && ctx.Err() == nil {
		s, res = w.giveUp(settleCtx, c, d.Attempt())
	}
	switch s {
	case settleAck:
		err = d.Ack(settleCtx)
	case settleRetry:
		err = d.Nak(settleCtx, w.cfg.RetryDelay)
	case settleTerm:
		err = d.Term(settleCtx, "no record for this call")
	case settleLeave:
		log.Info("call belongs to another runner (its lease lives); delivery left to it", "attempt", d.Attempt())
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

// Why a running call's context was cancelled.
var (
	errCancelRequested = executor.ErrCancelRequested
	errFenced          = errors.New("claim lost to another writer")
	errLeaseLapsed     = errors.New("lease not renewed in time")
)

// adoptAfter is the delivery from which a worker records a call that has no record itself: the
// dispatcher queues a call before it records it, so the first deliveries may simply be early.
const adoptAfter = 3

// recordPolls are the delays between the reads of a delivery that found no record, waiting for the
// dispatcher to write it (which it does right after it queued the call, so most often within a few
// milliseconds), before the delivery is handed back to the queue: about half a second in all.
var recordPolls = []time.Duration{2 * time.Millisecond, 4 * time.Millisecond, 8 * time.Millisecond, 16 * time.Millisecond,
	32 * time.Millisecond, 64 * time.Millisecond, 125 * time.Millisecond, 250 * time.Millisecond}

// process claims the call, runs it and records its final result. It returns how to settle the delivery and
// the final result when this worker recorded one.
//
// The fence against a second execution is the record and the lease, not the queue: JetStream matches acks
// and heartbeats by stream sequence, so a stalled worker's late ack can count for a redelivered copy. A
// call runs only after this worker took its lease and moved its record to running by compare-and-set; a
// worker that cannot renew its lease in time kills its container and records nothing.
func (w *Worker) process(ctx context.Context, c *call.Call, attempt uint64) (settle, *call.Result) {
	storeCtx := context.WithoutCancel(ctx)
	rec, err := w.store.Get(storeCtx, c.ID)
	// The dispatcher records a call right after it is queued: a delivery that beats the record waits a
	// moment for it rather than go back to the queue for a redelivery.
	for i := 0; errors.Is(err, queue.ErrNotFound) && attempt < adoptAfter && i < len(recordPolls); i++ {
		select {
		case <-ctx.Done():
			return settleRetry, nil
		case <-time.After(recordPolls[i]):
		}
		rec, err = w.store.Get(storeCtx, c.ID)
	}
	if errors.Is(err, queue.ErrNotFound) {
		if w.creator == nil || attempt < adoptAfter {
			return settleRetry, nil
		}
		rec, err = w.adopt(storeCtx, c)
	}
	if err != nil {
		return settleRetry, nil
	}
	r := rec.Result
	now := w.now()
	switch {
	case r.Status.Terminal():
		return settleAck, nil // already final (cancelled while queued, or a duplicate delivery)
	case r.Status == call.StatusRunning:
		held, err := w.leases.LeaseHeld(storeCtx, c.ID)
		switch {
		case err != nil:
			return settleRetry, nil
		case held:
			// Its runner is alive (this is a redelivery after a stall): leave the call to it.
			return settleLeave, nil
		}
		// Its runner vanished without a result. A call that may have changed files is never run twice.
		if tool, ok := w.tools.Lookup(c.Tool); !ok || !tool.ReadOnly() {
			r.Fail(call.StatusLost, call.ErrLost, fmt.Sprintf("worker %s stopped while running this call (its lease lapsed); it was not run again because %s can change files: check the workspace and call again if needed", r.Worker, c.Tool))
			r.FinishedAt, r.LeaseUntil = now, time.Time{}
			return w.record(storeCtx, r, rec.Revision)
		}
	case r.Status == call.StatusPendingApproval:
		return settleRetry, nil // published before its approval landed: wait for it
	}
	switch {
	case r.CancelRequested:
		r.Fail(call.StatusCancelled, call.ErrCancelled, "the call was cancelled before it ran")
		r.FinishedAt = now
		return w.record(storeCtx, r, rec.Revision)
	case !c.Deadline.IsZero() && now.After(c.Deadline):
		r.Fail(call.StatusExpired, call.ErrExpired, "the call was not started before its deadline and did not run")
		r.FinishedAt = now
		return w.record(storeCtx, r, rec.Revision)
	case r.ArgsDigest != c.ArgsDigest:
		r.Fail(call.StatusError, call.ErrInvalidParams, "two requests with the same idempotency_key but different arguments were queued at once; this call did not run: call again with a new idempotency_key")
		r.FinishedAt = now
		return w.record(storeCtx, r, rec.Revision)
	}

	// Claim: the lease first (on the server's clock), then the record moves to running under it by
	// compare-and-set, before the container starts.
	renewedAt := time.Now()
	lease, err := w.leases.AcquireLease(storeCtx, c.ID, w.cfg.ID, w.cfg.Lease)
	if err != nil {
		return settleRetry, nil // another worker is claiming it, or a vanished claimer's lease has not lapsed yet
	}
	r.Status = call.StatusRunning
	r.Worker = w.cfg.ID
	r.StartedAt = now
	r.LeaseUntil = now.Add(w.cfg.Lease) // for people; the lease itself is judged by the server
	r.Timing.QueuedMS = r.StartedAt.Sub(c.CreatedAt).Milliseconds()
	rev, err := w.store.Update(storeCtx, r, rec.Revision)
	if err != nil {
		// Even a conflict may be this claim itself: a write retried after its reply was lost finds the
		// record moved by its own first attempt.
		rev, err = w.confirmClaim(storeCtx, r, renewedAt.Add(w.cfg.Lease-w.cfg.Heartbeat))
	}
	if err != nil {
		_ = lease.Release(storeCtx)
		return settleRetry, nil // someone else moved it (a cancel, another worker): look again later
	}
	cl := &claim{rev: rev, result: r, lease: lease, renewedAt: renewedAt, ttl: w.cfg.Lease, margin: w.cfg.Heartbeat}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The guard renews the lease until the result is recorded, not only while the container runs.
	stopGuard := w.guard(runCtx, cancel, cl)
	defer stopGuard()
	x, stored, runErr := w.run(runCtx, c, cl.rev)
	cause := context.Cause(runCtx)
	switch {
	case errors.Is(cause, errFenced):
		w.log.WarnContext(ctx, "the call's lease was taken while it ran: the call was stopped and nothing is recorded", "call_id", c.ID)
		_ = lease.Release(storeCtx)
		return settleLeave, nil // the record belongs to another writer now; it settles the call
	case errors.Is(cause, errLeaseLapsed) || cl.lapsed():
		w.log.WarnContext(ctx, "lease not renewed in time: the call was stopped and nothing is recorded", "call_id", c.ID)
		return settleLeave, nil // others may have judged the call's runner gone: record nothing
	}
	if errors.Is(runErr, sandbox.ErrNotStarted) && ctx.Err() == nil && cause == nil {
		// Nothing ran: hand it back as queued for this or another worker.
		w.log.WarnContext(ctx, "call did not start; offering it again", "call_id", c.ID, "attempt", attempt, "error", runErr)
		r.Status, r.Worker, r.StartedAt, r.LeaseUntil = call.StatusQueued, "", time.Time{}, time.Time{}
		_, _ = w.store.Update(storeCtx, r, cl.rev)
		_ = lease.Release(storeCtx)
		return settleRetry, nil
	}
	w.exec.Finish(r, c, x, runErr, cause)
	r.LeaseUntil = time.Time{}
	stored = append(w.spill(storeCtx, r, cl.rev), stored...)
	s, res := w.recordClaimed(storeCtx, r, cl)
	stopGuard()
	if res == nil {
		if s == settleRetry {
			// The record kept moving under this claim, or could not be written: the next delivery judges
			// the call by its record and lease.
			w.log.WarnContext(ctx, "could not record the result of a call that ran: offering the delivery again", "call_id", c.ID, "status", r.Status)
		}
		w.dropOutputs(storeCtx, stored)
	}
	_ = lease.Release(storeCtx)
	return s, res
}

// confirmClaim finds out whether a claim whose write failed (no answer in a leader election, or a
// conflict with its own applied first attempt) was applied: the record then shows this worker's claim,
// with its start time. It reads until before, and returns the
// claim's revision, or an error when the claim is not (known to be) this worker's.
func (w *Worker) confirmClaim(ctx context.Context, claimed *call.Result, before time.Time) (uint64, error) {
	var rec queue.Record
	err := retry(ctx, before, 100*time.Millisecond, time.Second, func() (bool, error) {
		var err error
		rec, err = w.store.Get(ctx, claimed.ID)
		return err == nil, err
	})
	if err != nil {
		return 0, fmt.Errorf("claim call %s: %w", claimed.ID, err)
	}
	if r := rec.Result; r.Status == call.StatusRunning && r.Worker == w.cfg.ID && r.StartedAt.Equal(claimed.StartedAt) {
		return rec.Revision, nil
	}
	return 0, fmt.Errorf("claim call %s: %w", claimed.ID, queue.ErrConflict)
}

// adopt records a call that was queued but never recorded, as queued.
func (w *Worker) adopt(ctx context.Context, c *call.Call) (queue.Record, error) {
	r := call.NewResult(c, call.StatusQueued)
	rev, err := w.creator.Create(ctx, r)
	if errors.Is(err, queue.ErrExists) {
		return w.store.Get(ctx, c.ID)
	}
	if err != nil {
		return queue.Record{}, err
	}
	w.log.WarnContext(ctx, "recorded a call its dispatcher queued but did not record", "call_id", c.ID)
	return queue.Record{Result: r, Revision: rev}, nil
}

// recordClaimed writes the final result of a call this worker ran under claim cl. When the record moved
// while the call ran (a cancel request), it records over it as long as the call is still this worker's.
// It acknowledges the delivery only once the record is final: a record that looks taken is judged by the
// lease (a read may come from a replica that lags), and one that was taken is left to its new owner.
func (w *Worker) recordClaimed(ctx context.Context, r *call.Result, cl *claim) (settle, *call.Result) {
	rev := cl.rev
	for range 10 {
		if cl.lapsed() {
			w.log.WarnContext(ctx, "lease not renewed in time to record the result: nothing is recorded", "call_id", r.ID)
			return settleLeave, nil
		}
		s, res := w.record(ctx, r, rev)
		if res != nil || s != settleRetry {
			return s, res
		}
		cur, err := w.store.Get(ctx, r.ID)
		switch {
		case err != nil:
		case cur.Result.Status.Terminal():
			return settleAck, nil // final already (our own write whose reply was lost, or a cancel)
		case cur.Result.Status == call.StatusRunning && cur.Result.Worker == w.cfg.ID:
			rev = cur.Revision
			continue
		default:
			if err := cl.lease.Renew(ctx); errors.Is(err, queue.ErrConflict) {
				return settleLeave, nil // taken: its new owner settles the call
			}
		}
		select {
		case <-ctx.Done():
			return settleRetry, nil
		case <-time.After(w.cfg.Heartbeat):
		}
	}
	return settleRetry, nil
}

// claim is this worker's hold on a running call: the record revision of its claim, and its lease with the
// local monotonic time of its last successful renewal.
type claim struct {
	rev    uint64
	result *call.Result
	lease  queue.Lease
	ttl    time.Duration
	margin time.Duration

	mu        sync.Mutex
	renewedAt time.Time // when the last successful renewal was sent (monotonic)
}

// deadline is when the worker must have stopped the call unless it renews: a margin before the server
// can consider the lease lapsed, since the server's TTL started no earlier than renewedAt.
func (c *claim) deadline() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.renewedAt.Add(c.ttl - c.margin)
}

func (c *claim) lapsed() bool { return !time.Now().Before(c.deadline()) }

func (c *claim) renewed(sent time.Time) {
	c.mu.Lock()
	c.renewedAt = sent
	c.mu.Unlock()
}

// guard keeps the claim alive while the call runs: it renews the lease every heartbeat, cancels the run
// with errLeaseLapsed when no renewal succeeded before the claim's deadline (measured on the local
// monotonic clock, so a frozen or partitioned worker stops its call before others judge it gone), with
// errFenced when the server refuses a renewal or the record is no longer this worker's, and with
// errCancelRequested when a cancel is requested.
func (w *Worker) guard(ctx context.Context, cancel context.CancelCauseFunc, cl *claim) (stop func()) {
	ctx, stopCtx := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // renew, and stop the call at the claim's deadline
		defer wg.Done()
		deadline := time.NewTimer(time.Until(cl.deadline()))
		defer deadline.Stop()
		tick := time.NewTicker(w.cfg.Heartbeat)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-deadline.C:
			case <-tick.C:
			}
			if cl.lapsed() {
				cancel(errLeaseLapsed)
				return
			}
			sent := time.Now()
			// Each attempt gets a few heartbeats, not all the time left: a write sent to a server that
			// then died (a NATS leader killed mid-request) is never answered, and the next attempt, on the
			// new leader, must come before the deadline.
			rctx, rcancel := context.WithDeadline(ctx, earliest(cl.deadline(), sent.Add(renewAttempt*w.cfg.Heartbeat)))
			err := cl.lease.Renew(rctx)
			rcancel()
			switch {
			case err == nil:
				cl.renewed(sent)
				deadline.Reset(time.Until(cl.deadline()))
			case errors.Is(err, queue.ErrConflict):
				cancel(errFenced)
				return
			}
			// Any other failure: try again next heartbeat; the deadline decides.
		}
	}()
	go func() { // watch for a cancel request, to act within a second rather than a heartbeat
		defer wg.Done()
		id := cl.result.ID
		for {
			r, err := w.store.Wait(ctx, id, func(r *call.Result) bool {
				return r.CancelRequested || r.Worker != w.cfg.ID || r.Status != call.StatusRunning
			})
			if ctx.Err() != nil {
				return
			}
			if err != nil || r == nil {
				// The store could not be read (NATS electing a leader): watch again, or a cancel
				// requested later would never be seen.
				select {
				case <-ctx.Done():
					return
				case <-time.After(w.cfg.Heartbeat):
				}
				continue
			}
			if r.CancelRequested {
				cancel(errCancelRequested)
				return
			}
			// The record looks taken. A final state is never stale, and it ends the call. Anything else
			// may be a read from a replica that lags (the record as it was before the claim), and nobody
			// takes a call whose lease lives: the lease decides.
			if r.Status.Terminal() {
				cancel(errFenced)
				return
			}
			rctx, rcancel := context.WithTimeout(ctx, renewAttempt*w.cfg.Heartbeat)
			err = cl.lease.Renew(rctx)
			rcancel()
			if errors.Is(err, queue.ErrConflict) {
				cancel(errFenced)
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(w.cfg.Heartbeat):
			}
		}
	}()
	return func() { stopCtx(); wg.Wait() }
}

// renewAttempt is how many heartbeats one attempt to renew a lease may take.
const renewAttempt = 2

// earliest returns the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// spill moves every output field whose JSON encoding is larger than InlineBytes into the output store,
// named by the call, its claim revision and the field, and returns the names it stored. A field that
// cannot be stored is cut to fit the record, with a note.
func (w *Worker) spill(ctx context.Context, r *call.Result, claimRev uint64) []string {
	var stored []string
	for _, f := range []struct {
		name string
		text *string
	}{{"output", &r.Output}, {"stdout", &r.Stdout}, {"stderr", &r.Stderr}} {
		if encodedLen(*f.text) <= w.cfg.InlineBytes {
			continue
		}
		name := queue.OutputName(r.ID, claimRev, f.name)
		text := *f.text
		if err := w.putOutput(ctx, name, func() io.Reader { return strings.NewReader(text) }); err == nil {
			if r.Stored == nil {
				r.Stored = map[string]string{}
			}
			r.Stored[f.name] = name
			*f.text = ""
			stored = append(stored, name)
			continue
		}
		*f.text = cutUTF8(*f.text, w.cfg.InlineBytes/6) + "\n[toolpool could not store the rest of this output and cut it here]"
		r.Truncated = true
	}
	return stored
}

// outputRetryForTest bounds how long storing an output is retried while the store is unreachable; a
// variable only for tests.
var outputRetryForTest = 30 * time.Second

// putOutput stores what open yields under name, retrying (with a fresh reader from open) while the store
// is unreachable.
func (w *Worker) putOutput(ctx context.Context, name string, open func() io.Reader) error {
	if w.outputs == nil {
		return errors.New("no output store")
	}
	err := retry(ctx, time.Now().Add(outputRetryForTest), 50*time.Millisecond, 2*time.Second, func() (bool, error) {
		_, err := w.outputs.PutOutput(ctx, name, open())
		return err == nil, err
	})
	if err != nil {
		w.log.ErrorContext(ctx, "store output", "name", name, "error", err)
	}
	return err
}

// dropOutputs removes outputs this worker stored for a result it could not record.
func (w *Worker) dropOutputs(ctx context.Context, names []string) {
	for _, n := range names {
		if err := w.outputs.DeleteOutput(ctx, n); err != nil {
			w.log.WarnContext(ctx, "delete unrecorded output (it expires with the result TTL)", "name", n, "error", err)
		}
	}
}

// encodedLen is the length of s as a JSON string.
func encodedLen(s string) int {
	if len(s) < 1024 { // at most 6 bytes per byte, never over any sensible limit
		return 6 * len(s)
	}
	b, _ := json.Marshal(s)
	return len(b)
}

// cutUTF8 returns at most n bytes of s, not splitting a UTF-8 sequence.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// giveUp ends a call that could not be started in MaxDeliver-1 deliveries, unless it is final already,
// running under a live lease elsewhere, or waiting for its approval.
func (w *Worker) giveUp(ctx context.Context, c *call.Call, attempt uint64) (settle, *call.Result) {
	rec, err := w.store.Get(ctx, c.ID)
	if err != nil {
		return settleRetry, nil
	}
	r := rec.Result
	switch {
	case r.Status.Terminal():
		return settleAck, nil
	case r.Status == call.StatusRunning:
		if held, err := w.leases.LeaseHeld(ctx, c.ID); err != nil || held {
			return settleLeave, nil
		}
	case r.Status == call.StatusPendingApproval:
		return settleAck, nil // the approval (or the reconciler, after it) queues it again
	}
	r.Fail(call.StatusError, call.ErrInternal, fmt.Sprintf("toolpool could not start the call in %d attempts; it did not run. Retry later.", attempt))
	r.FinishedAt, r.LeaseUntil = w.now(), time.Time{}
	return w.record(ctx, r, rec.Revision)
}

// recordRetryFor bounds how long a final result is retried while the store is unreachable (a NATS restart).
const recordRetryFor = 2 * time.Minute

// record writes r at revision rev. A conflict returns settleRetry at once for the caller to decide; any
// other error is retried with backoff for recordRetryFor, so that a store outage does not lose a result.
func (w *Worker) record(ctx context.Context, r *call.Result, rev uint64) (settle, *call.Result) {
	var conflict bool
	err := retry(ctx, time.Now().Add(recordRetryFor), 50*time.Millisecond, 2*time.Second, func() (bool, error) {
		_, err := w.store.Update(ctx, r, rev)
		conflict = errors.Is(err, queue.ErrConflict)
		return err == nil || conflict, err
	})
	switch {
	case err == nil:
		return settleAck, r
	case !conflict && ctx.Err() == nil:
		w.log.ErrorContext(ctx, "record result", "call_id", r.ID, "error", err)
	}
	return settleRetry, nil
}

// retry calls try until it reports done, ctx ends or the time is past until, waiting first between tries
// and twice as long each time up to most. It returns try's last error (ctx's when ctx ended first).
func retry(ctx context.Context, until time.Time, first, most time.Duration, try func() (done bool, err error)) error {
	for wait := first; ; wait = min(2*wait, most) {
		done, err := try()
		if done || time.Now().Add(wait).After(until) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// run runs call c under claim: a workspace operation on the host, any other call in a fresh container
// (the executor). A command's full output is gathered while it runs and stored, named by the call and
// claim, before run returns; stored names what was stored.
func (w *Worker) run(ctx context.Context, c *call.Call, claim uint64) (x executor.Execution, stored []string, err error) {
	if workspace.IsOp(c.Tool) {
		out, conns, failed := w.runWorkspaceOp(ctx, c)
		return executor.OnHost(out, conns, failed), nil, nil
	}
	var capt *storedCapture
	x, err = w.exec.Run(ctx, c, func() (executor.Capture, error) {
		keep := w.cfg.FullOutputBytes
		if w.outputs == nil {
			keep = 0
		}
		cp, err := newCapture(c.ID, w.cfg.SpoolDir, keep, w.live)
		if err != nil {
			return nil, err
		}
		capt = &storedCapture{capture: cp, w: w, name: func(stream string) string {
			return queue.OutputName(c.ID, claim, "full-"+stream)
		}}
		return capt, nil
	})
	if capt != nil {
		stored = capt.stored
	}
	return x, stored, err
}
