// Recording: writing a call's final result, retried through a store outage.

package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

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
		case ownFinal(cur.Result, r):
			return settleAck, cur.Result // our own write, whose reply was lost: recorded, outputs and all
		case cur.Result.Status.Terminal():
			return settleAck, nil // final by another writer (the call judged lost): its outputs are not ours
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

// ownFinal reports whether cur is the final result r that this worker wrote: a write applied though its
// reply was lost, found when its retry meets it.
func ownFinal(cur, r *call.Result) bool {
	return cur.Status.Terminal() && cur.Status == r.Status && cur.Worker == r.Worker &&
		cur.StartedAt.Equal(r.StartedAt) && cur.FinishedAt.Equal(r.FinishedAt)
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
