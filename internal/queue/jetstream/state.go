package jetstream

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/queue"
)

// SharedState is the named blobs of state that every dispatcher shares (the approve-always rules), in
// the state bucket. It implements queue.SharedState. Safe for concurrent use; it lives as long as its
// Conn.
type SharedState struct{ *session }

var _ queue.SharedState = (*SharedState)(nil)

// UpdateState changes a named blob of shared state by compare-and-set: it reads the current value (nil
// when there is none), stores what edit returns, and starts over when another writer changed the blob
// meanwhile, so that concurrent writers (every dispatcher replica) never lose each other's changes. An
// error from edit is returned as it is and nothing is stored.
func (c *SharedState) UpdateState(ctx context.Context, key string, edit func(old []byte) ([]byte, error)) error {
	kv, err := c.js.KeyValue(ctx, c.cfg.stateBucket())
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", c.cfg.stateBucket(), err)
	}
	for attempt := 0; ; attempt++ {
		var old []byte
		var rev uint64
		e, err := kv.Get(ctx, key)
		switch {
		case err == nil:
			old, rev = e.Value(), e.Revision()
		case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
			if e != nil {
				rev = e.Revision()
			}
		default:
			return fmt.Errorf("read state %s: %w", key, err)
		}
		next, err := edit(old)
		if err != nil {
			return err
		}
		_, err = kv.Update(ctx, key, next, rev)
		if err == nil {
			return nil
		}
		if !isWrongSequence(err) || attempt >= 20 {
			return fmt.Errorf("update state %s: %w", key, err)
		}
	}
}

// WatchState calls onChange with the blob's current value (if any) and with every later value, until ctx
// ends. It returns once the watch is set up.
func (c *SharedState) WatchState(ctx context.Context, key string, onChange func([]byte)) error {
	kv, err := c.js.KeyValue(ctx, c.cfg.stateBucket())
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", c.cfg.stateBucket(), err)
	}
	w, err := kv.Watch(ctx, key, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("watch state %s: %w", key, err)
	}
	go func() {
		defer w.Stop()
		for e := range w.Updates() {
			if e != nil {
				onChange(e.Value())
			}
		}
	}()
	return nil
}
