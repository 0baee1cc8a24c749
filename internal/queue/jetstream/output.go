package jetstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Outputs too large for a record live in an object store (chunked, so no message is larger than a chunk),
// kept as long as the records (ResultTTL) and replicated like them. Objects are named with
// queue.OutputName.

// outputPutTimeout bounds a PutOutput whose ctx has no deadline. Without one, nats.go waits its default
// five seconds for each chunk's acknowledgement, which a loaded server (or one electing a leader) misses.
const outputPutTimeout = 2 * time.Minute

// PutOutput stores what r yields under name, replacing any object of that name, and returns its size. It
// streams: r is read in chunks, never held whole. It gives up when ctx ends, or after outputPutTimeout
// when ctx has no deadline.
func (c *Conn) PutOutput(ctx context.Context, name string, r io.Reader) (int64, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, outputPutTimeout)
		defer cancel()
	}
	info, err := c.outs.Put(ctx, jetstream.ObjectMeta{Name: name}, r)
	if err != nil {
		return 0, fmt.Errorf("store output %s: %w", name, err)
	}
	return int64(info.Size), nil
}

// ReadOutput returns up to limit bytes of the object name from offset on (limit < 0: to the end).
// queue.ErrNotFound if there is no such object (it expired with its record, or was never stored).
func (c *Conn) ReadOutput(ctx context.Context, name string, offset, limit int64) ([]byte, error) {
	obj, err := c.OpenOutput(ctx, name, offset)
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
func (c *Conn) DeleteOutput(ctx context.Context, name string) error {
	if err := c.outs.Delete(ctx, name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("delete output %s: %w", name, err)
	}
	return nil
}
