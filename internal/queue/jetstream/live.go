package jetstream

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

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

func (c *Live) liveSubject(callID string) string { return c.cfg.SubjectPrefix + "_output." + callID }

// PublishChunk sends one chunk of call callID's output to whoever follows it. It does not wait for the
// server; it may block briefly while the connection's buffer drains, which is why a worker calls it off
// the path of the container's output. ch.Data is copied before it returns, never kept.
func (c *Live) PublishChunk(ctx context.Context, callID string, ch queue.Chunk) error {
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
// followers of one call on this Live share one subscription, so that ten followers cost the NATS server
// and this process one copy of the stream, not ten.
func (c *Live) FollowOutput(ctx context.Context, callID string, buffer int) (<-chan queue.Chunk, error) {
	f := &follower{ch: make(chan queue.Chunk, buffer)}
	c.mu.Lock()
	if c.topics == nil {
		c.topics = map[string]*topic{}
	}
	t := c.topics[callID]
	if t == nil {
		t = &topic{followers: map[*follower]bool{}}
		sub, err := c.nc.Subscribe(c.liveSubject(callID), t.deliver)
		if err == nil {
			// Messages waiting for the callback are bounded too (nats.go drops beyond, as a slow consumer).
			err = sub.SetPendingLimits(1024, 64<<20) // room for a burst while the callback waits for a CPU
		}
		if err != nil {
			c.mu.Unlock()
			if sub != nil {
				_ = sub.Unsubscribe()
			}
			return nil, fmt.Errorf("follow output of %s: %w", callID, err)
		}
		t.sub = sub
		c.topics[callID] = t
	}
	t.mu.Lock()
	t.followers[f] = true
	t.mu.Unlock()
	c.mu.Unlock()
	leave := func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		t.mu.Lock()
		delete(t.followers, f)
		close(f.ch)
		last := len(t.followers) == 0
		t.mu.Unlock()
		if last {
			_ = t.sub.Unsubscribe()
			delete(c.topics, callID)
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

// Live is the live output of running calls. It implements queue.Live. Safe for concurrent use; it lives
// as long as its Conn.
type Live struct {
	*session
	// mu guards topics: the calls this Live follows, each with one subscription shared by its followers.
	mu     sync.Mutex
	topics map[string]*topic
}

var _ queue.Live = (*Live)(nil)

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

// followBuffer is how many chunks a Follow caller may fall behind before it loses some.
const followBuffer = 256

// Follow calls emit with the bytes of each live chunk of call callID's output published from now on, in
// order and from one goroutine, until ctx ends; it then returns nil. It is FollowOutput for a reader that
// wants the text only (MCP progress notifications): a chunk lost to a slow reader is simply not emitted.
func (c *Live) Follow(ctx context.Context, callID string, emit func(chunk string)) error {
	chunks, err := c.FollowOutput(ctx, callID, followBuffer)
	if err != nil {
		return err
	}
	for ch := range chunks {
		emit(string(ch.Data))
	}
	return nil
}
