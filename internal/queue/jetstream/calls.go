package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Calls is the calls queue: the work-queue stream, one subject per tenant in its lane, and the lanes'
// durable consumers. Publish is in this file, Consume and ConsumeWith in consume.go. It implements
// queue.Calls. Safe for concurrent use; it lives as long as its Conn.
type Calls struct{ *session }

var _ queue.Calls = (*Calls)(nil)

// subject is the calls subject of a tenant: PREFIX.<lane>.<tenant>.
func (c *Calls) subject(tenant string) (string, int) {
	l := LaneOf(tenant, c.cfg.Lanes)
	return c.cfg.SubjectPrefix + "." + strconv.Itoa(l) + "." + tenant, l
}

// Publish enqueues a call on its tenant's subject in its lane. The call id is the message id, so a publish
// retried within the duplicate window (2 minutes) is stored once. A call larger than the server's
// maximum message is refused with queue.ErrTooLarge, a tenant at its quota with queue.ErrTenantFull.
func (c *Calls) Publish(ctx context.Context, cl *call.Call) error {
	subject, lane := c.subject(cl.Tenant)
	return c.publishOn(ctx, cl, subject, c.cfg.bellSubject(lane))
}

// PublishTo enqueues a call on worker's own queue, PREFIX_home.<worker>.<tenant> (the worker's id
// base64url-encoded), which the worker's WorkerCalls fetches first and other workers' once it stopped or
// its presence lapsed (routed.go); worker "" is Publish. Otherwise as Publish.
func (c *Calls) PublishTo(ctx context.Context, cl *call.Call, worker string) error {
	if worker == "" {
		return c.Publish(ctx, cl)
	}
	return c.publishOn(ctx, cl, c.cfg.homeSubject(worker, cl.Tenant), c.cfg.homeBell(worker))
}

// publishOn stores call cl on subject and rings bell, which wakes the idle workers that fetch it.
func (c *Calls) publishOn(ctx context.Context, cl *call.Call, subject, bell string) error {
	data, err := json.Marshal(cl)
	if err != nil {
		return fmt.Errorf("encode call %s: %w", cl.ID, err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set(jetstream.MsgIDHeader, cl.ID)
	if cl.TraceParent != "" {
		msg.Header.Set("traceparent", cl.TraceParent)
	}
	if size := int64(len(data) + 512); size > c.nc.MaxPayload() {
		return fmt.Errorf("publish call %s of %d bytes (the server takes %d): %w", cl.ID, len(data), c.nc.MaxPayload(), queue.ErrTooLarge)
	}
	if err := c.publish(ctx, msg); err != nil {
		if strings.Contains(err.Error(), "maximum messages per subject exceeded") {
			return fmt.Errorf("publish call %s: %w", cl.ID, queue.ErrTenantFull)
		}
		return fmt.Errorf("publish call %s: %w", cl.ID, err)
	}
	// Wake idle workers: an empty core message, lost harmlessly when nobody listens.
	_ = c.nc.Publish(bell, nil)
	return nil
}

// publishRetryFor bounds how long a publish that got no answer is tried again: longer than a stream
// leader election (4 to 9 seconds), so that losing a server does not refuse calls for that long.
const publishRetryFor = 20 * time.Second

// publish stores msg in the calls stream, trying again while the server does not answer (a leader
// election, a reconnect). Trying again is safe: the message id makes the stream keep one copy. An answer
// that refuses the message is final.
func (c *Calls) publish(ctx context.Context, msg *nats.Msg) error {
	deadline := time.Now().Add(publishRetryFor)
	backoff := 250 * time.Millisecond
	for {
		_, err := c.js.PublishMsg(ctx, msg)
		var apiErr *jetstream.APIError
		if err == nil || errors.As(err, &apiErr) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// QueueState is the number of calls waiting for a worker (delivered and running calls not counted), the
// age of the oldest of them, and the calls waiting in each lane (indexed by lane, one entry per lane).
type QueueState struct {
	Pending   uint64
	OldestAge time.Duration
	Lanes     []uint64
}

// State reads the queue's depth and the age of its oldest waiting call from JetStream: per lane, the
// undelivered count of its consumer and the first message past what the consumer delivered. It costs two
// API calls per lane with calls waiting, one per idle lane. It is a gauge: a consumer counts a message a
// moment after its publish was acknowledged, so a call published just before may not be counted yet.
func (c *Calls) State(ctx context.Context) (QueueState, error) {
	s, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return QueueState{}, fmt.Errorf("get stream %s: %w", c.cfg.Stream, err)
	}
	st := QueueState{Lanes: make([]uint64, c.cfg.Lanes)}
	now := c.now()
	for l := range c.cfg.Lanes {
		cons, err := s.Consumer(ctx, c.cfg.laneConsumer(l))
		if err != nil {
			return QueueState{}, fmt.Errorf("find consumer %s: %w", c.cfg.laneConsumer(l), err)
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			return QueueState{}, fmt.Errorf("read consumer %s: %w", c.cfg.laneConsumer(l), err)
		}
		if ci.NumPending == 0 {
			continue
		}
		st.Pending += ci.NumPending
		st.Lanes[l] = ci.NumPending
		if msg, err := s.GetMsg(ctx, ci.Delivered.Stream+1, jetstream.WithGetMsgSubject(c.cfg.laneFilter(l))); err == nil {
			st.OldestAge = max(st.OldestAge, now.Sub(msg.Time))
		}
	}
	return st, nil
}
