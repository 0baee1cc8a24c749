package jetstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/queue"
)

// Outputs is the store of outputs too large for a record: an object store (chunked, so no message is
// larger than a chunk), kept as long as the records (ResultTTL) and replicated like them. Objects are
// named with queue.OutputName. It implements queue.Outputs. Safe for concurrent use; it lives as long as
// its Conn.
type Outputs struct {
	*session
	store jetstream.ObjectStore
}

var _ queue.Outputs = (*Outputs)(nil)

// outputPutTimeout bounds a PutOutput whose ctx has no deadline.
const outputPutTimeout = 2 * time.Minute

// PutOutput stores what r yields under name, replacing any object of that name, and returns its size. It
// streams: r is read in chunks, never held whole. It gives up when ctx ends (after outputPutTimeout when
// ctx has no deadline), and as soon as one chunk waits longer than the connection's JetStream timeout
// (nats.go's default, five seconds) for its acknowledgement: a stream leader killed with a chunk in flight
// never acknowledges it, and the put is better failed and tried again than held until its deadline.
func (s *Outputs) PutOutput(ctx context.Context, name string, r io.Reader) (int64, error) {
	putCtx, release := chunkBounded(ctx, outputPutTimeout)
	defer release()
	info, err := s.store.Put(putCtx, jetstream.ObjectMeta{Name: name}, fullReads(r))
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return 0, fmt.Errorf("store output %s: %w", name, err)
	}
	return int64(info.Size), nil
}

// chunkBounded returns a context that ends when ctx does, or after limit when ctx has no deadline, and
// that has no deadline itself: nats.go's object store bounds each chunk's acknowledgement only under a
// context without one, and otherwise waits for a lost acknowledgement until the deadline (seen in the
// cluster: every put in flight when the object store's leader was killed hung for its whole timeout).
// release ends it and frees its timer; call it when done.
func chunkBounded(ctx context.Context, limit time.Duration) (_ context.Context, release func()) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(limit)
	}
	bounded, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopFollowing := context.AfterFunc(ctx, cancel)
	timer := time.AfterFunc(time.Until(deadline), cancel)
	return bounded, func() {
		stopFollowing()
		timer.Stop()
		cancel()
	}
}

// ReadOutput returns up to limit bytes of the object name from offset on (limit < 0: to the end).
// queue.ErrNotFound if there is no such object (it expired with its record, or was never stored).
func (s *Outputs) ReadOutput(ctx context.Context, name string, offset, limit int64) ([]byte, error) {
	obj, err := s.OpenOutput(ctx, name, offset)
	if err != nil {
		return nil, err
	}
	defer obj.Close()
	var rd io.Reader = obj
	if limit >= 0 {
		rd = io.LimitReader(obj, limit)
	}
	b, err := io.ReadAll(rd)
	if err != nil {
		return nil, fmt.Errorf("read output %s: %w", name, err)
	}
	return b, nil
}

// DeleteOutput removes the object name; a missing object is not an error.
func (s *Outputs) DeleteOutput(ctx context.Context, name string) error {
	if err := s.store.Delete(ctx, name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("delete output %s: %w", name, err)
	}
	return nil
}

// OpenOutput returns a reader of the object name from offset on; the caller closes it. It streams: the
// object is never held whole. queue.ErrNotFound if there is no such object.
//
// A ctx without a deadline is bounded by outputReadTimeout: without one, nats.go stops reading an object
// after its default five seconds, which cuts a large download short.
func (s *Outputs) OpenOutput(ctx context.Context, name string, offset int64) (io.ReadCloser, error) {
	if _, ok := ctx.Deadline(); !ok {
		bounded, cancel := context.WithTimeout(ctx, outputReadTimeout)
		rc, err := s.openOutput(bounded, name, offset)
		if err != nil {
			cancel()
			return nil, err
		}
		return &cancelOnClose{ReadCloser: rc, cancel: cancel}, nil
	}
	return s.openOutput(ctx, name, offset)
}

// outputReadTimeout bounds reading one stored object when the caller set no deadline.
const outputReadTimeout = 30 * time.Minute

// cancelOnClose releases a reader's context when the reader is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (r *cancelOnClose) Close() error {
	err := r.ReadCloser.Close()
	r.cancel()
	return err
}

// outputLag bounds how long openOutput looks again for an object it did not find. Every object read is
// named by a record or an operation written after the object, so a miss right after is a replica of a
// replicated store that has not caught up (direct gets are answered by any replica): seen in a 3-server
// cluster as "call not found" for a result's stored stdout read the moment its record was final.
const outputLag = 2 * time.Second

func (s *Outputs) openOutput(ctx context.Context, name string, offset int64) (io.ReadCloser, error) {
	obj, err := s.store.Get(ctx, name)
	for wait, deadline := 10*time.Millisecond, time.Now().Add(outputLag); errors.Is(err, jetstream.ErrObjectNotFound) && time.Now().Add(wait).Before(deadline); wait = min(2*wait, 250*time.Millisecond) {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read output %s: %w", name, ctx.Err())
		case <-time.After(wait):
		}
		obj, err = s.store.Get(ctx, name)
	}
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("read output %s: %w", name, queue.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read output %s: %w", name, err)
	}
	if offset > 0 {
		if _, err := io.CopyN(io.Discard, obj, offset); err != nil && !errors.Is(err, io.EOF) {
			obj.Close()
			return nil, fmt.Errorf("read output %s: %w", name, err)
		}
	}
	return obj, nil
}
