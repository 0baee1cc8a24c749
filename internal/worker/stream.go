package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Live publishes a running call's output as it is printed, to whoever follows the call, and drops it
// once the call's output is stored: the publishing half of queue.Live.
type Live interface {
	// PublishChunk sends one chunk; best effort (a lost chunk is missed by live readers only, who read it
	// from the output store later). It may block while the connection drains. ch.Data is the caller's
	// again once it returns: it must not be kept.
	PublishChunk(ctx context.Context, callID string, ch queue.Chunk) error
	// EndOutput drops the chunks retained for the call's live readers.
	EndOutput(ctx context.Context, callID string) error
}

// liveEndWait bounds dropping a call's live chunks.
const liveEndWait = 10 * time.Second

// endLive drops call id's live chunks, once its output is stored and its result recorded (readers then
// read the store), or before a later attempt runs it (its chunks start again from byte 0). A failure
// only costs the live stream's space until its age or size bound drops them; it is logged.
func (w *Worker) endLive(ctx context.Context, id string) {
	if w.live == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), liveEndWait)
	defer cancel()
	if err := w.live.EndOutput(ctx, id); err != nil {
		w.log.WarnContext(ctx, "drop live output", "call_id", id, "error", err)
	}
}

// WithLive makes the worker publish the output of commands (run_shell, custom tools) live as it is
// printed; without it only the final result and the stored full output are seen.
func WithLive(l Live) Option { return func(w *Worker) { w.live = l } }

// pullReporter returns what tells call id's live readers how the pull of its image goes: each report is
// one JSON line (call.PullProgress) on the live stream call.StreamPull, which the event stream shows as
// status events. Best effort, like the output: a report the server does not take is missed. Nil without
// a live stream. The reports are of attempt attempt of the call.
func (w *Worker) pullReporter(ctx context.Context, id string, attempt uint64) func(call.PullProgress) {
	if w.live == nil {
		return nil
	}
	var offset int64
	return func(p call.PullProgress) {
		line, _ := json.Marshal(p)
		line = append(line, '\n')
		if err := w.live.PublishChunk(ctx, id, queue.Chunk{Stream: call.StreamPull, Offset: offset, Data: line, Attempt: attempt}); err != nil {
			w.log.DebugContext(ctx, "publish pull progress", "call_id", id, "error", err)
		}
		offset += int64(len(line))
	}
}

const (
	// liveChunkBytes bounds one published chunk.
	liveChunkBytes = 64 << 10
	// livePendingBytes bounds what waits, per stream, for the publisher: output printed while it is full
	// is not published live (readers see the jump in offsets and catch up from the store).
	livePendingBytes = 256 << 10
)

// capture receives a command's stdout and stderr as the container prints them (sandbox.Spec's watchers):
// it keeps each stream, from its first byte up to a cap, in a spool file for the output store, and
// hands what it can to a publisher goroutine for live readers. Writes never wait for the publisher or
// for NATS: a slow or absent reader never slows the call, and memory stays bounded by the pending
// buffers whatever the call prints.
type capture struct {
	callID  string
	attempt uint64 // the call's attempt whose output this is: its chunks carry it
	live    Live
	streams [2]*spool // stdout, stderr
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

// spool is one stream of a capture; it is the io.Writer handed to the sandbox.
type spool struct {
	c    *capture
	name string

	mu         sync.Mutex
	file       *os.File // nil: nothing is kept
	max        int64
	kept       int64
	total      int64
	pending    []byte
	pendingOff int64
}

// newCapture starts capturing the output of attempt attempt of call callID, keeping up to keep bytes of
// each stream in files under dir (keep <= 0 or dir "": none) and publishing it to live (nil: nothing is
// published). The caller must call finish.
func newCapture(callID string, attempt uint64, dir string, keep int64, live Live) (*capture, error) {
	c := &capture{callID: callID, attempt: attempt, live: live, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	for i, name := range []string{call.StreamStdout, call.StreamStderr} {
		s := &spool{c: c, name: name, max: keep}
		if keep > 0 && dir != "" {
			f, err := os.CreateTemp(dir, callID+"-"+name+"-*")
			if err != nil {
				c.discard()
				return nil, fmt.Errorf("create spool for %s of %s: %w", name, callID, err)
			}
			_ = os.Remove(f.Name()) // the open file is all we need; nothing is left behind
			s.file = f
		}
		c.streams[i] = s
	}
	if live != nil {
		go c.publish()
	} else {
		close(c.done)
	}
	return c, nil
}

func (c *capture) stdout() io.Writer { return c.streams[0] }
func (c *capture) stderr() io.Writer { return c.streams[1] }

// Write keeps p in the spool (up to the cap) and queues it for live readers when there is room. It
// never blocks for long and never fails.
func (s *spool) Write(p []byte) (int, error) {
	s.mu.Lock()
	off := s.total
	s.total += int64(len(p))
	if s.file != nil && s.kept < s.max {
		k := min(int64(len(p)), s.max-s.kept)
		n, err := s.file.Write(p[:k])
		s.kept += int64(n)
		if err != nil {
			s.max = s.kept // a full disk: keep what was written, stop there
		}
	}
	queued := false
	if s.c.live != nil {
		if len(s.pending) == 0 {
			s.pendingOff = off
		}
		if s.pendingOff+int64(len(s.pending)) == off && len(s.pending)+len(p) <= livePendingBytes {
			s.pending = append(s.pending, p...)
			queued = true
		}
	}
	s.mu.Unlock()
	if queued {
		select {
		case s.c.wake <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// take removes the next chunk to publish, its bytes copied into buf's storage (so that one buffer serves
// every chunk of a call), and reports false when there is none. Unless final, it holds back a UTF-8
// sequence cut at the end of what was printed, so that text chunks stay text.
func (s *spool) take(final bool, buf []byte) (queue.Chunk, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(len(s.pending), liveChunkBytes)
	if n < len(s.pending) || !final {
		n = runeCut(s.pending, n)
	}
	if n == 0 {
		return queue.Chunk{}, false
	}
	ch := queue.Chunk{Stream: s.name, Offset: s.pendingOff, Data: append(buf[:0], s.pending[:n]...)}
	s.pending = s.pending[:copy(s.pending, s.pending[n:])]
	s.pendingOff += int64(n)
	return ch, true
}

// runeCut moves a cut at n back to the start of a UTF-8 sequence that the cut would split, when b is text
// there; it never moves it by more than a sequence's length.
func runeCut(b []byte, n int) int {
	for i := n; i > 0 && i > n-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i-1]) {
			if !utf8.FullRune(b[i-1 : n]) {
				return i - 1 // a sequence that continues past the cut
			}
			return n
		}
	}
	return n
}

// publish sends pending chunks until finish, then what is left.
func (c *capture) publish() {
	defer close(c.done)
	ctx := context.Background()
	var buf []byte // reused for every chunk: PublishChunk does not keep it
	for {
		final := false
		select {
		case <-c.wake:
		case <-c.stop:
			final = true
		}
		for _, s := range c.streams {
			for ch, ok := s.take(final, buf); ok; ch, ok = s.take(final, buf) {
				ch.Attempt = c.attempt
				_ = c.live.PublishChunk(ctx, c.callID, ch)
				buf = ch.Data
			}
		}
		if final {
			return
		}
	}
}

// outputPage is the size of the pieces a stream is stored in: a range read starts at its piece.
const outputPage = 1 << 20

// liveFlushWait bounds how long finish waits for the last chunks to be published; a variable for tests.
var liveFlushWait = 5 * time.Second

// finish publishes what is left, stores each stream that printed anything with put (under the name
// that name gives it) and returns the streams for the call's record, and the object names it stored.
// A stream that could not be stored is reported with nothing kept.
func (c *capture) finish(ctx context.Context, name func(stream string) string, put func(ctx context.Context, name string, open func() io.Reader) error) (map[string]*call.Stream, []string) {
	close(c.stop)
	select {
	case <-c.done:
	case <-time.After(liveFlushWait):
	}
	defer c.discard()
	var streams map[string]*call.Stream
	var stored []string
	for _, s := range c.streams {
		s.mu.Lock()
		total, kept, f := s.total, s.kept, s.file
		s.mu.Unlock()
		if total == 0 {
			continue
		}
		st := &call.Stream{Bytes: total}
		if kept > 0 && put != nil {
			st.Object, st.Page = name(s.name), outputPage
			var names []string
			var err error
			for i := int64(0); i*outputPage < kept && err == nil; i++ {
				from := i * outputPage
				err = put(ctx, st.PageName(i), func() io.Reader { return io.NewSectionReader(f, from, min(outputPage, kept-from)) })
				if err == nil {
					names = append(names, st.PageName(i))
				}
			}
			stored = append(stored, names...)
			st.Kept = min(int64(len(names))*outputPage, kept) // what was stored, from the first byte
			if st.Kept == 0 {
				st.Object, st.Page = "", 0
			}
		}
		if streams == nil {
			streams = map[string]*call.Stream{}
		}
		streams[s.name] = st
	}
	return streams, stored
}

// discard closes the spool files (already unlinked).
func (c *capture) discard() {
	for _, s := range c.streams {
		if s != nil && s.file != nil {
			_ = s.file.Close()
		}
	}
}

// storedCapture is a capture whose streams go to the output store once the command is done, named by
// name; stored lists what was stored. It is the executor's Capture of a command.
type storedCapture struct {
	*capture
	w      *Worker
	name   func(stream string) string
	stored []string
}

func (s *storedCapture) Stdout() io.Writer { return s.stdout() }
func (s *storedCapture) Stderr() io.Writer { return s.stderr() }

// Finish stores the kept streams (nothing when the container never started, or without an output store)
// and returns them.
func (s *storedCapture) Finish(ctx context.Context, started bool) map[string]*call.Stream {
	var put func(context.Context, string, func() io.Reader) error
	if s.w.outputs != nil && started {
		put = s.w.putOutput
	}
	streams, stored := s.finish(ctx, s.name, put)
	s.stored = stored
	return streams
}
