// Fencing: a call runs only under this worker's claim (its lease, then its record moved to running by
// compare-and-set), which the guard keeps alive and gives up when it cannot.

package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/executor"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/sandbox"
)

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
	r.Worker, r.Attempt = w.cfg.ID, attempt // the attempt: what the live output of this run is of
	r.StartedAt = now
	r.LeaseUntil = now.Add(w.cfg.Lease) // for people; the lease itself is judged by the server
	r.Timing.QueuedMS = r.StartedAt.Sub(c.CreatedAt).Milliseconds()
	rev, err := w.store.Update(storeCtx, r, rec.Revision)
	if err != nil {
		// Even a conflict may be this claim itself: a write retried after its reply was lost finds the
		// record moved by its own first attempt.
		rev, renewedAt, err = w.confirmClaim(storeCtx, r, lease, renewedAt)
	}
	if err != nil {
		_ = lease.Release(storeCtx)
		return settleRetry, nil // someone else moved it (a cancel, another worker): look again later
	}
	cl := &claim{rev: rev, result: r, lease: lease, renewedAt: renewedAt, ttl: w.cfg.Lease, margin: w.cfg.Heartbeat}
	if attempt > 1 {
		w.endLive(storeCtx, c.ID) // what an earlier attempt printed is not this run's output
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The guard renews the lease until the result is recorded, not only while the container runs.
	stopGuard := w.guard(runCtx, cancel, cl)
	defer stopGuard()
	// A workspace kept in object storage is brought to its latest checkpoint first; a call whose
	// workspace cannot be does not run.
	var x executor.Execution
	var stored []string
	var runErr error
	unrestored := w.restoreFor(runCtx, c, r)
	if unrestored != nil {
		x = executor.OnHost("", nil, unrestored)
	} else {
		w.noteResident(runCtx, c)
		x, stored, runErr = w.run(runCtx, c, cl)
	}
	cause := context.Cause(runCtx)
	switch { // a claim past its local deadline lapsed, whichever of the guard's checks stopped the call first
	case errors.Is(cause, errLeaseLapsed) || cl.lapsed():
		w.log.WarnContext(ctx, "lease not renewed in time: the call was stopped and nothing is recorded", "call_id", c.ID, "cause", cause)
		return settleLeave, nil // others may have judged the call's runner gone: record nothing
	case errors.Is(cause, errFenced):
		w.log.WarnContext(ctx, "the call's lease was taken while it ran: the call was stopped and nothing is recorded", "call_id", c.ID, "cause", cause)
		_ = lease.Release(storeCtx)
		return settleLeave, nil // the record belongs to another writer now; it settles the call
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
	if unrestored == nil {
		// Durable before the result is: a recorded result's changes are in object storage.
		w.checkpointAfter(storeCtx, c, r)
	}
	r.LeaseUntil = time.Time{}
	stored = append(w.spill(storeCtx, r, cl.rev), stored...)
	s, res := w.recordClaimed(storeCtx, r, cl)
	stopGuard()
	if res != nil {
		w.endLive(storeCtx, c.ID) // its output is in the store now
	}
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
// with its start time. It reads until it can, for at most recordRetryFor, renewing the claim's lease every
// heartbeat meanwhile, so that the lease lives however long the records bucket takes to elect a leader;
// it gives up when the lease could not be renewed in time. It returns the claim's revision and when the
// lease was last renewed, or an error when the claim is not (known to be) this worker's.
func (w *Worker) confirmClaim(ctx context.Context, claimed *call.Result, lease queue.Lease, renewedAt time.Time) (uint64, time.Time, error) {
	attempt, _ := renewTimeouts(w.cfg.Heartbeat)
	giveUp := time.Now().Add(recordRetryFor)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, time.Second, w.cfg.Heartbeat/2) {
		deadline := renewedAt.Add(w.cfg.Lease - w.cfg.Heartbeat)
		now := time.Now()
		if !now.Before(deadline) || now.After(giveUp) {
			return 0, renewedAt, fmt.Errorf("claim call %s: its record could not be read back while the lease lived", claimed.ID)
		}
		rctx, cancel := context.WithDeadline(ctx, earliest(deadline, now.Add(time.Second)))
		rec, err := w.store.Get(rctx, claimed.ID)
		cancel()
		if errors.Is(err, queue.ErrNotFound) {
			return 0, renewedAt, fmt.Errorf("claim call %s: %w", claimed.ID, err) // gone: not this claim's
		}
		if err == nil {
			if r := rec.Result; r.Status == call.StatusRunning && r.Worker == w.cfg.ID && r.StartedAt.Equal(claimed.StartedAt) {
				return rec.Revision, renewedAt, nil
			}
			return 0, renewedAt, fmt.Errorf("claim call %s: %w", claimed.ID, queue.ErrConflict)
		}
		if time.Since(renewedAt) >= w.cfg.Heartbeat {
			sent := time.Now()
			rctx, cancel := context.WithDeadline(ctx, earliest(deadline, sent.Add(attempt)))
			err := lease.Renew(rctx)
			cancel()
			switch {
			case err == nil:
				renewedAt = sent
			case errors.Is(err, queue.ErrConflict):
				return 0, renewedAt, fmt.Errorf("claim call %s: %w", claimed.ID, err)
			}
		}
		select {
		case <-ctx.Done():
			return 0, renewedAt, ctx.Err()
		case <-time.After(wait):
		}
	}
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
		next := time.NewTimer(w.cfg.Heartbeat)
		defer next.Stop()
		attempt, again := renewTimeouts(w.cfg.Heartbeat)
		var failed error // the last renewal's error since the last success: why a claim lapsed
		var failingSince time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-deadline.C:
			case <-next.C:
			}
			if cl.lapsed() {
				cancel(fmt.Errorf("%w (last renewal: %v)", errLeaseLapsed, failed))
				return
			}
			sent := time.Now()
			// Each attempt gets a part of a heartbeat, not all the time left: a write sent to a server that
			// then died or froze (a NATS leader killed mid-request, a stopped server) is never answered,
			// and the next attempt, on the new leader or through the connection's new server, must come
			// before the deadline.
			rctx, rcancel := context.WithDeadline(ctx, earliest(cl.deadline(), sent.Add(attempt)))
			err := cl.lease.Renew(rctx)
			rcancel()
			switch {
			case err == nil:
				if failed != nil {
					w.log.InfoContext(ctx, "lease renewed again", "call_id", cl.result.ID, "failing_for", time.Since(failingSince).Round(time.Millisecond))
				}
				failed = nil
				cl.renewed(sent)
				deadline.Reset(time.Until(cl.deadline()))
				next.Reset(w.cfg.Heartbeat)
			case errors.Is(err, queue.ErrConflict):
				cancel(fmt.Errorf("%w: %v", errFenced, err))
				return
			default:
				if failed == nil {
					failingSince = sent
					w.log.WarnContext(ctx, "renew lease: trying again until the claim's deadline", "call_id", cl.result.ID,
						"deadline_in", time.Until(cl.deadline()).Round(time.Millisecond), "error", err)
				}
				failed = err
				next.Reset(again) // try again soon; the deadline decides
			}
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

// renewAttempt is how many heartbeats the record watch's check of the lease may take.
const renewAttempt = 2

// renewTimeouts are how long one attempt to renew a lease may take, and how soon a failed one is tried
// again: a third of a heartbeat (at most 2 s) and a tenth (at most 250 ms). With the lease at three
// heartbeats and the claim's deadline a heartbeat before it lapses, a renewal lost on its way (its
// server killed or frozen) leaves room for two more attempts before the deadline.
func renewTimeouts(heartbeat time.Duration) (attempt, again time.Duration) {
	return min(heartbeat/3, 2*time.Second), min(heartbeat/10, 250*time.Millisecond)
}

// earliest returns the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
