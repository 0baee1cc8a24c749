package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Backlog is what the dispatchers' reconciler reads: calls the queue gave up delivering (from the
// max-deliveries advisories), and calls that have sat in the queue for long. Both are safe to run in every
// dispatcher at once: the advisories go through one shared durable consumer, and every settlement is a
// compare-and-set on the call's record. It implements queue.Backlog. Safe for concurrent use; it lives as
// long as its Conn.
type Backlog struct{ *session }

var _ queue.Backlog = (*Backlog)(nil)

// staleScanLimit bounds how many messages of one lane a Stale pass reads in each of its two ranges.
const staleScanLimit = 1000

// Exhausted hands fn each call whose deliveries ran out since the last call of Exhausted (by any
// dispatcher), at most max of them. When fn returns true the advisory is done; when it returns false the
// call is offered again after retry (its runner may still be alive). A call whose message is gone already
// is not offered. It does not block waiting for advisories.
func (c *Backlog) Exhausted(ctx context.Context, max int, retry time.Duration, fn func(context.Context, queue.Stuck) bool) error {
	cons, err := c.js.Consumer(ctx, c.cfg.advisoryStream(), reconcilerConsumer)
	if err != nil {
		return fmt.Errorf("find consumer %s of %s: %w", reconcilerConsumer, c.cfg.advisoryStream(), err)
	}
	batch, err := cons.FetchNoWait(max)
	if err != nil {
		return fmt.Errorf("fetch max-deliveries advisories: %w", err)
	}
	calls, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return fmt.Errorf("get stream %s: %w", c.cfg.Stream, err)
	}
	var errs []error
	for msg := range batch.Messages() {
		var adv struct {
			Stream     string `json:"stream"`
			StreamSeq  uint64 `json:"stream_seq"`
			Deliveries uint64 `json:"deliveries"`
		}
		if json.Unmarshal(msg.Data(), &adv) != nil || adv.Stream != c.cfg.Stream {
			_ = msg.Term()
			continue
		}
		raw, err := calls.GetMsg(ctx, adv.StreamSeq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			errs = append(errs, msg.Ack()) // settled and removed already
			continue
		}
		if err != nil {
			errs = append(errs, msg.NakWithDelay(retry), fmt.Errorf("read exhausted call at %d: %w", adv.StreamSeq, err))
			continue
		}
		st := stuckFrom(raw)
		st.Delivered, st.Exhausted, st.Deliveries = true, true, adv.Deliveries
		if fn(ctx, st) {
			errs = append(errs, msg.Ack())
		} else {
			errs = append(errs, msg.NakWithDelay(retry))
		}
	}
	return errors.Join(append(errs, batch.Error())...)
}

// Stale hands fn, lane by lane, each call that a worker was handed and that has been in the queue for
// inFlightAge or longer (its record may be final with a lost ack, or missing), and each call that no
// worker was handed yet and that has waited waitingAge or longer (past any deadline). Ages are on the
// server's clock. It reads at most staleScanLimit messages per lane and range, and only the messages
// in those ranges, so a long backlog of young calls costs nothing.
func (c *Backlog) Stale(ctx context.Context, inFlightAge, waitingAge time.Duration, fn func(context.Context, queue.Stuck)) error {
	s, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return fmt.Errorf("get stream %s: %w", c.cfg.Stream, err)
	}
	now := c.now()
	var errs []error
	for l := range c.cfg.Lanes {
		cons, err := s.Consumer(ctx, c.cfg.laneConsumer(l))
		if err != nil {
			errs = append(errs, fmt.Errorf("find consumer %s: %w", c.cfg.laneConsumer(l), err))
			continue
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("read consumer %s: %w", c.cfg.laneConsumer(l), err))
			continue
		}
		filter := c.cfg.laneFilter(l)
		// Delivered and not acknowledged: between the ack floor and the last delivered message.
		seq := ci.AckFloor.Stream + 1
		for range staleScanLimit {
			raw, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
			if err != nil || raw.Sequence > ci.Delivered.Stream {
				errs = append(errs, ignoreNotFound(err))
				break
			}
			seq = raw.Sequence + 1
			if now.Sub(raw.Time) >= inFlightAge {
				st := stuckFrom(raw)
				st.Delivered = true
				fn(ctx, st)
			}
		}
		// Never delivered: in order of arrival, so the scan stops at the first young one.
		seq = ci.Delivered.Stream + 1
		for range staleScanLimit {
			raw, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
			if err != nil || now.Sub(raw.Time) < waitingAge {
				errs = append(errs, ignoreNotFound(err))
				break
			}
			seq = raw.Sequence + 1
			fn(ctx, stuckFrom(raw))
		}
	}
	return errors.Join(errs...)
}

// Remove deletes the call message at seq from the queue (its call is settled); a message removed
// already is not an error.
func (c *Backlog) Remove(ctx context.Context, seq uint64) error {
	s, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return fmt.Errorf("get stream %s: %w", c.cfg.Stream, err)
	}
	err = s.DeleteMsg(ctx, seq)
	// The API's reason comes as text only: 10043 is "sequence not found", removed already.
	if errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) && strings.Contains(err.Error(), "err_code=10043") {
		return nil
	}
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("remove call message %d: %w", seq, err)
	}
	return nil
}

func stuckFrom(raw *jetstream.RawStreamMsg) queue.Stuck {
	st := queue.Stuck{Seq: raw.Sequence, Queued: raw.Time}
	var c call.Call
	if json.Unmarshal(raw.Data, &c) == nil && c.ID != "" {
		st.Call = &c
	}
	return st
}

func ignoreNotFound(err error) error {
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	return err
}
