package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Live output travels on the subjects PREFIX_output.<call id>, which the live stream (Config.liveStream,
// provisioned with the others) keeps while the call runs, bounded by Config.LiveMaxBytes and LiveMaxAge:
// a reader joining at any moment replays the call's chunks through an ordered consumer of its own, then
// follows the new ones on the same consumer, with no gap and no duplicate between the two. A chunk's
// stream and offset ride in headers, its bytes unchanged in the body (binary output is never re-encoded
// on the wire). The worker drops a call's chunks (EndOutput) once its output is stored and its result
// recorded: from then on readers read the output store.

const (
	hdrStream  = "Toolpool-Stream"
	hdrOffset  = "Toolpool-Offset"
	hdrAttempt = "Toolpool-Attempt"
)

// liveReadChunks bounds the chunks (64 KiB at most each) one follower's consumer holds in flight in this
// process, sent by the server ahead of the reader, on top of the follower's channel. It is a count of
// messages: nats.go's byte bound (PullMaxBytes) let a slow follower hold its call's whole retained
// output (10 followers of a 2 MiB output: 97 MiB of heap, against 6 MiB counted in messages).
const liveReadChunks = 4

// liveRetry is how long a follower waits before reading again after its consumer failed.
const liveRetry = 250 * time.Millisecond

// liveEndWait bounds removing a follower's consumer, and dropping a call's chunks.
const liveEndWait = 10 * time.Second

func (c *Live) liveSubject(callID string) string { return c.cfg.SubjectPrefix + "_output." + callID }

// PublishChunk sends one chunk of call callID's output to the live stream. It does not wait for the
// server's acknowledgement (a core publish the stream stores); it may block briefly while the
// connection's buffer drains, which is why a worker calls it off the path of the container's output.
// ch.Data is copied before it returns, never kept.
func (c *Live) PublishChunk(ctx context.Context, callID string, ch queue.Chunk) error {
	msg := nats.NewMsg(c.liveSubject(callID))
	msg.Header.Set(hdrStream, ch.Stream)
	msg.Header.Set(hdrOffset, strconv.FormatInt(ch.Offset, 10))
	if ch.Attempt > 0 {
		msg.Header.Set(hdrAttempt, strconv.FormatUint(ch.Attempt, 10))
	}
	msg.Data = ch.Data
	if err := c.nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("publish output of %s: %w", callID, err)
	}
	return nil
}

// FollowOutput delivers call callID's output from its first byte retained: the chunks the live stream
// retains, then each chunk published later, through an ordered consumer of the call's subject that is
// this follower's alone (a consumer in the server's memory, deleted when ctx ends). Chunks wait in the
// server, not here: a follower holds at most buffer chunks in its channel and liveReadChunks in flight.
func (c *Live) FollowOutput(ctx context.Context, callID string, buffer int) (<-chan queue.Chunk, error) {
	cons, err := c.js.OrderedConsumer(ctx, c.cfg.liveStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{c.liveSubject(callID)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		// A backstop for a follower whose process died: the server removes the consumer after this.
		InactiveThreshold: time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("follow output of %s: %w", callID, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(liveReadChunks))
	if err != nil {
		return nil, fmt.Errorf("follow output of %s: %w", callID, err)
	}
	out := make(chan queue.Chunk, max(buffer, 0))
	at := map[string]int64{} // per stream, where the chunks delivered end
	var runs attempts
	var once sync.Once
	stop := func() {
		once.Do(func() {
			it.Stop()
			// The server would keep the consumer for its inactive threshold: remove it now.
			dctx, cancel := context.WithTimeout(context.Background(), liveEndWait)
			defer cancel()
			if info := cons.CachedInfo(); info != nil {
				_ = c.js.DeleteConsumer(dctx, c.cfg.liveStream(), info.Name)
			}
		})
	}
	go func() {
		<-ctx.Done()
		stop()
	}()
	go func() {
		defer close(out)
		defer stop()
		for {
			m, err := it.Next()
			if err != nil {
				if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
					return
				}
				// A missed heartbeat or a server away: the ordered consumer recreates itself after the
				// last chunk delivered; look again shortly.
				select {
				case <-ctx.Done():
					return
				case <-time.After(liveRetry):
				}
				continue
			}
			ch, ok := chunkOf(m)
			if !ok || !runs.admit(ch) {
				continue
			}
			if runs.restarted {
				clear(at) // a later attempt's output, from its first byte
			}
			// Trim what the reader has: a chunk it has whole is skipped, one it has in part is cut.
			if have := at[ch.Stream]; ch.Offset < have {
				if ch.End() <= have {
					continue
				}
				ch.Data, ch.Offset = ch.Data[have-ch.Offset:], have
			}
			at[ch.Stream] = ch.End()
			select {
			case out <- ch:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// attempts follows which attempt of a call a reader's chunks are of.
type attempts struct {
	current   uint64 // the latest attempt delivered; 0: none with an attempt yet
	restarted bool   // the chunk last admitted is the first of a later attempt than one delivered before
}

// admit reports whether ch is to be delivered: not when it is of an earlier attempt than one delivered
// (a lost worker's chunk that landed late). restarted then says whether it begins a later attempt.
// Chunks whose attempt is not known (0) are taken as of the current one.
func (a *attempts) admit(ch queue.Chunk) bool {
	a.restarted = false
	switch {
	case ch.Attempt == 0 || ch.Attempt == a.current:
	case ch.Attempt < a.current:
		return false
	default:
		a.restarted = a.current != 0
		a.current = ch.Attempt
	}
	return true
}

// chunkOf decodes a chunk from the live stream; false for a message that is not one.
func chunkOf(m jetstream.Msg) (queue.Chunk, bool) {
	h := m.Headers()
	off, err := strconv.ParseInt(h.Get(hdrOffset), 10, 64)
	if err != nil || off < 0 {
		return queue.Chunk{}, false
	}
	attempt, _ := strconv.ParseUint(h.Get(hdrAttempt), 10, 64) // absent: 0, not known
	return queue.Chunk{Stream: h.Get(hdrStream), Offset: off, Data: m.Data(), Attempt: attempt}, true
}

// EndOutput drops call callID's chunks from the live stream: the worker calls it once the call's output
// is stored and its final record written, after which readers read the output store. Dropping chunks
// of a call that has none is not an error.
func (c *Live) EndOutput(ctx context.Context, callID string) error {
	s, err := c.stream(ctx)
	if err == nil {
		err = s.Purge(ctx, jetstream.WithPurgeSubject(c.liveSubject(callID)))
	}
	if err != nil {
		return fmt.Errorf("drop live output of %s: %w", callID, err)
	}
	return nil
}

// stream looks the live stream up once (a worker may start before the dispatcher that provisions it).
func (c *Live) stream(ctx context.Context) (jetstream.Stream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live != nil {
		return c.live, nil
	}
	s, err := c.js.Stream(ctx, c.cfg.liveStream())
	if err != nil {
		return nil, err
	}
	c.live = s
	return s, nil
}

// Live is the live output of running calls. It implements queue.Live. Safe for concurrent use; it lives
// as long as its Conn.
type Live struct {
	*session
	mu   sync.Mutex
	live jetstream.Stream // the live stream, once looked up
}

var _ queue.Live = (*Live)(nil)

// followBuffer is how many chunks wait for a Follow caller's emit.
const followBuffer = 16

// Follow calls emit with the bytes of call callID's output from its first byte retained, then live, in
// order and from one goroutine, until ctx ends; it then returns nil. Bytes that are not retained show as
// a note ("[... 1024 bytes of stdout not kept live ...]"). It is FollowOutput for a reader that wants the
// text only (MCP progress notifications).
func (c *Live) Follow(ctx context.Context, callID string, emit func(chunk string)) error {
	chunks, err := c.FollowOutput(ctx, callID, followBuffer)
	if err != nil {
		return err
	}
	at := map[string]int64{}
	var runs attempts
	for ch := range chunks {
		if runs.admit(ch); runs.restarted {
			clear(at)
			emit(fmt.Sprintf("[toolpool: the call is running again (attempt %d), its worker having been lost: its output starts over]\n", ch.Attempt))
		}
		if ch.Stream == call.StreamPull { // the image's pull, as lines for people
			for line := range strings.Lines(string(ch.Data)) {
				var p call.PullProgress
				if json.Unmarshal([]byte(line), &p) == nil {
					emit(p.String() + "\n")
				}
			}
			continue
		}
		if gap := ch.Offset - at[ch.Stream]; gap > 0 {
			emit(fmt.Sprintf("[... %d bytes of %s not kept live ...]\n", gap, ch.Stream))
		}
		at[ch.Stream] = ch.End()
		emit(string(ch.Data))
	}
	return nil
}
