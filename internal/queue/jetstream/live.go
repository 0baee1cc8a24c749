package jetstream

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
)

// A running call's output, as its worker reads it from the container, goes to core NATS (not JetStream)
// on one subject per call: it is best effort by design. Nothing is stored, a chunk that nobody follows is
// dropped by the server, and a follower that falls behind loses chunks. The call's record keeps the
// output that counts.

// outputSubject is call id's output subject: "<prefix>_live.<id>", outside the calls stream's
// "<prefix>.<lane>.<tenant>", so that the stream never stores it.
func (c Config) outputSubject(id string) string { return c.SubjectPrefix + "_live." + id }

// PublishOutput sends one chunk of call id's output to whoever follows it. It does not block on the
// network (the client buffers); an error loses only this chunk.
func (c *Conn) PublishOutput(_ context.Context, id string, chunk []byte) error {
	if err := c.nc.Publish(c.cfg.outputSubject(id), chunk); err != nil {
		return fmt.Errorf("publish output of %s: %w", id, err)
	}
	return nil
}

// followBuffer is how many chunks a follower may fall behind before it loses some.
const followBuffer = 256

// Follow calls emit with each chunk of call id's output published from now on, in order, from one
// goroutine, until ctx is done; it then returns nil. It does not know when the call ends: the caller
// stops it by cancelling ctx.
func (c *Conn) Follow(ctx context.Context, id string, emit func(chunk string)) error {
	ch := make(chan *nats.Msg, followBuffer)
	sub, err := c.nc.ChanSubscribe(c.cfg.outputSubject(id), ch)
	if err != nil {
		return fmt.Errorf("follow output of %s: %w", id, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The subscription is in place at the server once Flush returns: nothing published after Follow
	// started, and after a chunk the caller waited for, is missed.
	if err := c.nc.FlushWithContext(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("follow output of %s: %w", id, err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-ch:
			emit(string(m.Data))
		}
	}
}
