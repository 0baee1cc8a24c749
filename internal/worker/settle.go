// Settling a delivery: Handle decides, once, whether it is acked, offered again, terminated or left to
// the call's runner elsewhere.

package worker

import (
	"context"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

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
	// A call that may change a workspace kept in object storage runs under the workspace's home, held
	// until its result is recorded: one such call at a time per workspace, on every worker.
	s, res := settleRetry, (*call.Result)(nil)
	if homes, ok := w.takeHomes(ctx, c); ok {
		s, res = w.process(ctx, c, d.Attempt())
		homes.release()
	}
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
