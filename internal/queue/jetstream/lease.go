package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/toolpool/toolpool/internal/queue"
)

// Leases live in their own bucket, one key per running call, each revision written with a per-message
// TTL (Nats-TTL) and stamped by the server: the server removes a lease that goes a TTL without renewal,
// on its own clock. A reader also counts a lease whose last write is older than its TTL by the server's
// clock (Conn.Now) as gone, should the server not have removed it yet: no client compares its own clock
// with another client's. The value is "<holder> <token> <ttl>": the token names one acquisition, so that
// a write whose reply was lost can be recognised as its own.

// Leases is the leases of running calls, in the leases bucket. It implements queue.Leases. Safe for
// concurrent use; it lives as long as its Conn.
type Leases struct {
	*session
	kv jetstream.KeyValue
}

var _ queue.Leases = (*Leases)(nil)

// AcquireLease takes the lease of call id for holder, for ttl (at least a second). queue.ErrExists: another
// holder has it. A lease that lapsed but was not removed yet is taken over by compare-and-set. The caller
// must Release it or let it lapse.
func (s *Leases) AcquireLease(ctx context.Context, id, holder string, ttl time.Duration) (queue.Lease, error) {
	if ttl < time.Second {
		return nil, fmt.Errorf("acquire lease of call %s: ttl %s is below the server's 1s", id, ttl)
	}
	l := &lease{s: s, id: id, value: holder + " " + nuid.Next() + " " + strconv.FormatInt(int64(ttl), 10), ttl: ttl}
	rev, err := s.kv.Create(ctx, id, []byte(l.value), jetstream.KeyTTL(ttl))
	if err == nil {
		l.rev = rev
		return l, nil
	}
	// A create retried after its reply was lost finds the key made by its own first attempt.
	e, gerr := s.kv.Get(ctx, id)
	switch {
	case gerr == nil && string(e.Value()) == l.value:
		l.rev = e.Revision()
		return l, nil
	case gerr == nil && s.lapsed(e):
		if err := l.write(ctx, e.Revision()); err != nil {
			return nil, fmt.Errorf("take over lapsed lease of call %s: %w", id, err)
		}
		return l, nil
	case errors.Is(err, jetstream.ErrKeyExists):
		return nil, fmt.Errorf("acquire lease of call %s: %w", id, queue.ErrExists)
	}
	return nil, fmt.Errorf("acquire lease of call %s: %w", id, err)
}

// LeaseHeld reports whether anyone holds the lease of call id: false once it was released or lapsed on
// the server's clock. It reads from the stream's leader.
func (s *Leases) LeaseHeld(ctx context.Context, id string) (bool, error) {
	e, err := s.kv.Get(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read lease of call %s: %w", id, err)
	}
	return !s.lapsed(e), nil
}

// lapsed reports whether lease entry e was last written longer than its TTL ago, on the server's clock,
// however far off this client's estimate of that clock may be: a live lease is never judged gone early.
func (s *Leases) lapsed(e jetstream.KeyValueEntry) bool {
	f := strings.Fields(string(e.Value()))
	if len(f) != 3 {
		return false
	}
	ns, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return false
	}
	return !s.now().Add(-s.clock.uncertainty()).Before(e.Created().Add(time.Duration(ns)))
}

type lease struct {
	s         *Leases
	id, value string
	ttl       time.Duration
	mu        sync.Mutex
	rev       uint64
	released  bool
}

// write stores the lease at revision rev (compare-and-set) with a fresh TTL. Called with mu held or
// before the lease is shared.
func (l *lease) write(ctx context.Context, rev uint64) error {
	msg := nats.NewMsg("$KV." + l.s.cfg.leaseBucket() + "." + l.id)
	msg.Data = []byte(l.value)
	ack, err := l.s.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(l.ttl))
	if err != nil {
		// A write whose reply was lost leaves a newer revision of ours: it was applied.
		e, gerr := l.s.kv.Get(ctx, l.id)
		switch {
		case gerr == nil && string(e.Value()) == l.value && e.Revision() != rev:
			l.rev = e.Revision()
			return nil
		case isWrongSequence(err) && readBackAnswered(gerr):
			return queue.ErrConflict
		case isWrongSequence(err):
			// Refused, maybe by our own write whose reply was lost: unknown until the lease can be read.
			return fmt.Errorf("read back the lease after a refused write: %w", gerr)
		}
		return err
	}
	l.rev = ack.Sequence
	return nil
}

// Renew writes the lease again at the revision this holder last wrote, with a fresh TTL. The server
// refuses it when the lease lapsed (its removal marker is a newer revision) or was taken.
func (l *lease) Renew(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.write(ctx, l.rev); err != nil {
		return fmt.Errorf("renew lease of call %s: %w", l.id, err)
	}
	return nil
}

// Release deletes the lease if it is still this holder's. It is idempotent.
func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return nil
	}
	err := l.s.kv.Delete(ctx, l.id, jetstream.LastRevision(l.rev))
	if err != nil && !isWrongSequence(err) && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("release lease of call %s: %w", l.id, err)
	}
	l.released = true
	return nil
}
