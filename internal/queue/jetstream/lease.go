package jetstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/toolpool/toolpool/internal/queue"
)

// Leases live in their own bucket, one key per running call, each revision written with a per-message
// TTL (Nats-TTL): the server removes a lease that goes a TTL without renewal, on its own clock, and no
// client compares clocks to decide whether a lease lapsed.

// AcquireLease takes the lease of call id for holder, for ttl (at least a second). queue.ErrExists: another
// holder has it. The caller must Release it or let it lapse.
func (c *Conn) AcquireLease(ctx context.Context, id, holder string, ttl time.Duration) (queue.Lease, error) {
	if ttl < time.Second {
		return nil, fmt.Errorf("acquire lease of call %s: ttl %s is below the server's 1s", id, ttl)
	}
	// The value names this acquisition, so that a write whose reply was lost can be recognised as ours.
	l := &lease{c: c, id: id, token: holder + " " + nuid.Next(), ttl: ttl}
	rev, err := c.leases.Create(ctx, id, []byte(l.token), jetstream.KeyTTL(ttl))
	if err != nil {
		// A create retried after its reply was lost finds the key made by its own first attempt.
		if rev, ok := l.mine(ctx); ok {
			l.rev = rev
			return l, nil
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("acquire lease of call %s: %w", id, queue.ErrExists)
		}
		return nil, fmt.Errorf("acquire lease of call %s: %w", id, err)
	}
	l.rev = rev
	return l, nil
}

// LeaseHeld reports whether anyone holds the lease of call id: false once it was released or lapsed on
// the server's clock.
func (c *Conn) LeaseHeld(ctx context.Context, id string) (bool, error) {
	_, err := c.leases.Get(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read lease of call %s: %w", id, err)
	}
	return true, nil
}

type lease struct {
	c         *Conn
	id, token string
	ttl       time.Duration
	mu        sync.Mutex
	rev       uint64
	released  bool
}

// mine reads the lease and reports whether its current revision is this acquisition's: a write whose
// reply was lost (a leader election) may have been applied.
func (l *lease) mine(ctx context.Context) (uint64, bool) {
	e, err := l.c.leases.Get(ctx, l.id)
	if err != nil || string(e.Value()) != l.token {
		return 0, false
	}
	return e.Revision(), true
}

// Renew writes the lease again at the revision this holder last wrote, with a fresh TTL. The server
// refuses it when the lease lapsed (its removal marker is a newer revision) or was taken.
func (l *lease) Renew(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	msg := nats.NewMsg("$KV." + l.c.cfg.leaseBucket() + "." + l.id)
	msg.Data = []byte(l.token)
	ack, err := l.c.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(l.rev), jetstream.WithMsgTTL(l.ttl))
	if err != nil {
		// A renewal whose reply was lost leaves a newer revision of ours: that is a renewal, not a loss.
		if rev, ok := l.mine(ctx); ok && rev != l.rev {
			l.rev = rev
			return nil
		}
		if isWrongSequence(err) {
			return fmt.Errorf("renew lease of call %s: %w", l.id, queue.ErrConflict)
		}
		return fmt.Errorf("renew lease of call %s: %w", l.id, err)
	}
	l.rev = ack.Sequence
	return nil
}

// Release deletes the lease if it is still this holder's. It is idempotent.
func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return nil
	}
	err := l.c.leases.Delete(ctx, l.id, jetstream.LastRevision(l.rev))
	if err != nil && !isWrongSequence(err) && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("release lease of call %s: %w", l.id, err)
	}
	l.released = true
	return nil
}
