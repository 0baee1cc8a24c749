package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/tools"
)

// Backlog is the queue as the reconciler sees it, calls that may be stuck and their removal: the
// queue's Backlog contract.
type Backlog = queue.Backlog

// LeaseChecker reports whether anyone holds call id's lease (judged on the queue server's clock).
type LeaseChecker func(ctx context.Context, id string) (bool, error)

// ReconcilerConfig configures a Reconciler.
type ReconcilerConfig struct {
	// Interval is the time between passes (with up to 20% jitter, so replicas spread out).
	Interval time.Duration `yaml:"interval"`
	// InFlightAge is how long a delivered call stays in the queue before the reconciler looks at it: more
	// than a worker needs to record and acknowledge a call it finished. Default: twice the queue's ack
	// wait.
	InFlightAge time.Duration `yaml:"in_flight_age"`
	// WaitingAge is how long a call no worker took stays in the queue before the reconciler looks at it:
	// the longest deadline a call can have (the API's queue_timeout, the default), so that only calls past
	// their deadline are read.
	WaitingAge time.Duration `yaml:"-"`
	// Grace is how old a parked approval without a record must be before it is dropped: the request that
	// parked it failed before recording it, so the call was never accepted.
	Grace time.Duration `yaml:"grace"`
}

// DefaultReconcilerConfig returns the defaults; InFlightAge and WaitingAge are derived from the queue
// and API settings when left zero.
func DefaultReconcilerConfig() ReconcilerConfig {
	return ReconcilerConfig{Interval: 10 * time.Second, Grace: 2 * time.Minute}
}

// ReconcilerDeps are the Reconciler's collaborators.
type ReconcilerDeps struct {
	Store     Store
	Backlog   Backlog
	LeaseHeld LeaseChecker
	Approvals Approvals
	Publisher Publisher
	Tools     *tools.Registry
	Log       *slog.Logger
	// Now is the queue server's clock; default time.Now.
	Now func() time.Time
}

// Reconciler gives every accepted call a final state when no worker will: calls whose deliveries ran out
// (whose runner's lease is gone), calls that waited past their deadline, messages of calls that are
// final already (they hold their tenant's quota), approved calls that were never queued and parked
// approvals that were never recorded. It keeps no state and takes no lock: every change is a
// compare-and-set on the call's record, so every dispatcher replica runs one at once.
type Reconciler struct {
	cfg  ReconcilerConfig
	deps ReconcilerDeps
}

// NewReconciler returns a Reconciler.
func NewReconciler(cfg ReconcilerConfig, deps ReconcilerDeps) (*Reconciler, error) {
	switch {
	case cfg.Interval <= 0 || cfg.InFlightAge <= 0 || cfg.WaitingAge <= 0 || cfg.Grace <= 0:
		return nil, errors.New("new reconciler: interval, in-flight age, waiting age and grace must be positive")
	case deps.Store == nil || deps.Backlog == nil || deps.LeaseHeld == nil || deps.Approvals == nil || deps.Publisher == nil || deps.Tools == nil || deps.Log == nil:
		return nil, errors.New("new reconciler: every dependency but Now is required")
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	return &Reconciler{cfg: cfg, deps: deps}, nil
}

// Run makes a pass every Interval until ctx ends. It blocks.
func (r *Reconciler) Run(ctx context.Context) {
	for {
		jitter := time.Duration(rand.Int64N(int64(r.cfg.Interval)/5 + 1))
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.Interval + jitter):
		}
		if err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.deps.Log.Warn("reconcile calls", "error", err)
		}
	}
}

// Pass settles what it can of the exhausted calls, the stale calls and the parked approvals, once.
func (r *Reconciler) Pass(ctx context.Context) error {
	var errs []error
	for {
		n := 0
		err := r.deps.Backlog.Exhausted(ctx, 100, r.cfg.Interval, func(ctx context.Context, q queue.Stuck) bool {
			n++
			return r.settle(ctx, q)
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("read exhausted calls: %w", err))
		}
		if n < 100 || err != nil {
			break
		}
	}
	if err := r.deps.Backlog.Stale(ctx, r.cfg.InFlightAge, r.cfg.WaitingAge, func(ctx context.Context, q queue.Stuck) { r.settle(ctx, q) }); err != nil {
		errs = append(errs, fmt.Errorf("read stale calls: %w", err))
	}
	errs = append(errs, r.approvals(ctx))
	return errors.Join(errs...)
}

// settle decides a call the queue still holds, and reports whether it is settled (final and removed).
func (r *Reconciler) settle(ctx context.Context, q queue.Stuck) bool {
	if q.Call == nil { // undecodable: no worker can run it
		return r.remove(ctx, q)
	}
	now := r.deps.Now()
	pastDeadline := !q.Call.Deadline.IsZero() && now.After(q.Call.Deadline)
	rec, err := r.deps.Store.Get(ctx, q.Call.ID)
	if errors.Is(err, queue.ErrNotFound) {
		// Queued, never recorded: its dispatcher stopped in between. A worker records it when it takes
		// it; one that no worker can take any more ends here.
		if !q.Exhausted && !pastDeadline {
			return false
		}
		res := call.NewResult(q.Call, call.StatusQueued)
		if pastDeadline {
			expire(res, now)
		} else {
			res.Fail(call.StatusError, call.ErrInternal, fmt.Sprintf("toolpool queued the call but lost track of it before it started (%d deliveries, no record); it did not run: call again", q.Deliveries))
			res.FinishedAt = now.UTC()
		}
		if _, err := r.deps.Store.Create(ctx, res); err != nil && !errors.Is(err, queue.ErrExists) {
			r.deps.Log.Warn("reconcile: record call", "call_id", q.Call.ID, "error", err)
			return false
		}
		return r.remove(ctx, q)
	}
	if err != nil {
		return false
	}
	res := rec.Result
	switch {
	case res.Status.Terminal():
		return r.remove(ctx, q) // its ack was lost, or it was cancelled while queued: free its quota slot
	case (res.Status == call.StatusQueued || res.Status == call.StatusPendingApproval) && pastDeadline:
		expire(res, now)
	case res.Status == call.StatusQueued && q.Exhausted:
		res.Fail(call.StatusError, call.ErrInternal, fmt.Sprintf("toolpool could not start the call in %d deliveries; it did not run. Retry later.", q.Deliveries))
		res.FinishedAt = now.UTC()
	case res.Status == call.StatusRunning && q.Exhausted:
		held, err := r.deps.LeaseHeld(ctx, res.ID)
		if err != nil || held {
			return false // its runner is alive: it records the result; look again later
		}
		msg := fmt.Sprintf("worker %s stopped while running this call (its lease lapsed) and the queue gave up redelivering it; it was not run again: check the workspace and call again if needed", res.Worker)
		if tool, ok := r.deps.Tools.Lookup(res.Tool); ok && tool.ReadOnly() {
			msg = fmt.Sprintf("worker %s stopped while running this call (its lease lapsed) and the queue gave up redelivering it; %s only reads, so calling again is safe", res.Worker, res.Tool)
		}
		res.Fail(call.StatusLost, call.ErrLost, msg)
		res.FinishedAt, res.LeaseUntil = now.UTC(), time.Time{}
	default:
		return false // waiting or running as it should
	}
	if _, err := r.deps.Store.Update(ctx, res, rec.Revision); err != nil {
		return false // someone else moved it: look again next pass
	}
	r.deps.Log.Info("reconciled call", "call_id", res.ID, "tenant", res.Tenant, "status", res.Status, "reason", res.Error.Message)
	return r.remove(ctx, q)
}

func (r *Reconciler) remove(ctx context.Context, q queue.Stuck) bool {
	if err := r.deps.Backlog.Remove(ctx, q.Seq); err != nil {
		r.deps.Log.Warn("reconcile: remove settled call from the queue", "seq", q.Seq, "error", err)
		return false
	}
	return true
}

// approvals settles parked approvals: approved calls whose publish never happened are queued, expired
// and decided ones are dropped, and parked calls that were never recorded (never accepted) are dropped.
func (r *Reconciler) approvals(ctx context.Context) error {
	parked, err := r.deps.Approvals.ListPending(ctx, "*")
	if err != nil {
		return fmt.Errorf("list parked approvals: %w", err)
	}
	now := r.deps.Now()
	var errs []error
	for _, p := range parked {
		c := p.Call
		rec, err := r.deps.Store.Get(ctx, c.ID)
		switch {
		case errors.Is(err, queue.ErrNotFound):
			if now.Sub(c.CreatedAt) > r.cfg.Grace {
				errs = append(errs, r.deps.Approvals.DeletePending(ctx, c.Tenant, c.ID))
			}
			continue
		case err != nil:
			errs = append(errs, err)
			continue
		}
		res := rec.Result
		switch res.Status {
		case call.StatusPendingApproval:
			if res.Deadline.IsZero() || now.Before(res.Deadline) {
				continue
			}
			expire(res, now)
			if _, err := r.deps.Store.Update(ctx, res, rec.Revision); err != nil {
				continue
			}
		case call.StatusQueued:
			// Approved, and the approver's dispatcher may have stopped before queueing it. Publishing again
			// is safe: within two minutes the queue drops the duplicate, and later a worker finds the record
			// moved on and drops the copy.
			c.Deadline = res.Deadline
			if err := r.deps.Publisher.Publish(ctx, c); err != nil {
				errs = append(errs, fmt.Errorf("queue approved call %s: %w", c.ID, err))
				continue
			}
		}
		errs = append(errs, r.deps.Approvals.DeletePending(ctx, c.Tenant, c.ID))
	}
	return errors.Join(errs...)
}
