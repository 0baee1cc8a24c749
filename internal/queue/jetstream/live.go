package jetstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/queue"
)

// Live output travels on core NATS subjects PREFIX_output.<call id>, outside every stream: nothing is
// stored, so a flood costs the servers no disk and a reader that is not there misses nothing it cannot
// read from the output store later. A chunk's stream and offset ride in headers, its bytes unchanged in
// the body (binary output is never re-encoded on the wire).

const (
	hdrStream = "Toolpool-Stream"
	hdrOffset = "Toolpool-Offset"
)

func (c *Conn) liveSubject(callID string) string { return c.cfg.SubjectPrefix + "_output." + callID }

// PublishChunk sends one chunk of call callID's output to whoever follows it. It does not wait for the
// server; it may block briefly while the connection's buffer drains, which is why a worker calls it off
// the path of the container's output. ch.Data is copied before it returns, never kept.
func (c *Conn) PublishChunk(ctx context.Context, callID string, ch queue.Chunk) error {
	msg := nats.NewMsg(c.liveSubject(callID))
	msg.Header.Set(hdrStream, ch.Stream)
	msg.Header.Set(hdrOffset, strconv.FormatInt(ch.Offset, 10))
	msg.Data = ch.Data
	if err := c.nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("publish output of %s: %w", callID, err)
	}
	return nil
}

// FollowOutput delivers call callID's live chunks, from the moment it returns, on the returned channel
// until ctx ends, when the channel is closed. The channel holds at most buffer chunks: a receiver that
// falls further behind loses chunks (the publisher never waits for it) and sees the jump in Offset. All
// followers of one call on this Conn share one subscription, so that ten followers cost the NATS server
// and this process one copy of the stream, not ten.
func (c *Conn) FollowOutput(ctx context.Context, callID string, buffer int) (<-chan queue.Chunk, error) {
	f := &follower{ch: make(chan queue.Chunk, buffer)}
	c.live.mu.Lock()
	if c.live.topics == nil {
		c.live.topics = map[string]*topic{}
	}
	t := c.live.topics[callID]
	if t == nil {
		t = &topic{followers: map[*follower]bool{}}
		sub, err := c.nc.Subscribe(c.liveSubject(callID), t.deliver)
		if err == nil {
			// Messages waiting for the callback are bounded too (nats.go drops beyond, as a slow consumer).
			err = sub.SetPendingLimits(1024, 64<<20) // room for a burst while the callback waits for a CPU
		}
		if err != nil {
			c.live.mu.Unlock()
			if sub != nil {
				_ = sub.Unsubscribe()
			}
			return nil, fmt.Errorf("follow output of %s: %w", callID, err)
		}
		t.sub = sub
		c.live.topics[callID] = t
	}
	t.mu.Lock()
	t.followers[f] = true
	t.mu.Unlock()
	c.live.mu.Unlock()
	leave := func() {
		c.live.mu.Lock()
		defer c.live.mu.Unlock()
		t.mu.Lock()
		delete(t.followers, f)
		close(f.ch)
		last := len(t.followers) == 0
		t.mu.Unlock()
		if last {
			_ = t.sub.Unsubscribe()
			delete(c.live.topics, callID)
		}
	}
	// The subscription must reach the server before the caller reads the call's state, or chunks
	// printed in between would be missed without a gap to show it.
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.nc.FlushWithContext(fctx); err != nil {
		leave()
		return nil, fmt.Errorf("follow output of %s: %w", callID, err)
	}
	go func() {
		<-ctx.Done()
		leave()
	}()
	return f.ch, nil
}

// liveTopics are the calls this Conn follows, each with one subscription shared by its followers.
type liveTopics struct {
	mu     sync.Mutex
	topics map[string]*topic
}

type topic struct {
	sub       *nats.Subscription
	mu        sync.Mutex
	followers map[*follower]bool
}

type follower struct{ ch chan queue.Chunk }

// deliver hands a chunk to every follower with room for it, never waiting.
func (t *topic) deliver(m *nats.Msg) {
	off, err := strconv.ParseInt(m.Header.Get(hdrOffset), 10, 64)
	if err != nil || off < 0 {
		return
	}
	ch := queue.Chunk{Stream: m.Header.Get(hdrStream), Offset: off, Data: m.Data}
	t.mu.Lock()
	defer t.mu.Unlock()
	for f := range t.followers {
		select {
		case f.ch <- ch:
		default: // behind: dropped; the follower sees the gap
		}
	}
}

// OpenOutput returns a reader of the object name from offset on; the caller closes it. It streams: the
// object is never held whole. queue.ErrNotFound if there is no such object.
//
// A ctx without a deadline is bounded by outputReadTimeout: without one, nats.go stops reading an object
// after its default five seconds, which cuts a large download short.
func (c *Conn) OpenOutput(ctx context.Context, name string, offset int64) (io.ReadCloser, error) {
	if _, ok := ctx.Deadline(); !ok {
		bounded, cancel := context.WithTimeout(ctx, outputReadTimeout)
		rc, err := c.openOutput(bounded, name, offset)
		if err != nil {
			cancel()
			return nil, err
		}
		return &cancelOnClose{ReadCloser: rc, cancel: cancel}, nil
	}
	return c.openOutput(ctx, name, offset)
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

func (c *Conn) openOutput(ctx context.Context, name string, offset int64) (io.ReadCloser, error) {
	obj, err := c.outs.Get(ctx, name)
	for wait, deadline := 10*time.Millisecond, time.Now().Add(outputLag); errors.Is(err, jetstream.ErrObjectNotFound) && time.Now().Add(wait).Before(deadline); wait = min(2*wait, 250*time.Millisecond) {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read output %s: %w", name, ctx.Err())
		case <-time.After(wait):
		}
		obj, err = c.outs.Get(ctx, name)
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

// followBuffer is how many chunks a Follow caller may fall behind before it loses some.
const followBuffer = 256

// Follow calls emit with the bytes of each live chunk of call callID's output published from now on, in
// order and from one goroutine, until ctx ends; it then returns nil. It is FollowOutput for a reader that
// wants the text only (MCP progress notifications): a chunk lost to a slow reader is simply not emitted.
func (c *Conn) Follow(ctx context.Context, callID string, emit func(chunk string)) error {
	chunks, err := c.FollowOutput(ctx, callID, followBuffer)
	if err != nil {
		return err
	}
	for ch := range chunks {
		emit(string(ch.Data))
	}
	return nil
}
