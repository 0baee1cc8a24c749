package worker

import (
	"context"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"
)

// OutputSink carries a running call's output, as the container prints it, to whoever follows the call
// (the dispatcher's MCP progress notifications). It is best effort: the call's result keeps the output
// that counts.
type OutputSink interface {
	// PublishOutput sends one chunk of call id's output. It must not block for long; an error loses
	// only that chunk.
	PublishOutput(ctx context.Context, id string, chunk []byte) error
}

// Option configures optional behaviour of a Worker.
type Option func(*Worker)

// WithOutputSink publishes the output of calls that run a command (not the in-container tool runner,
// whose output is for the worker) as it is printed, in chunks of at most liveChunk bytes sent every
// liveInterval, and at most the call's output cap (or liveMax) in all.
func WithOutputSink(s OutputSink) Option { return func(w *Worker) { w.output = s } }

const (
	liveInterval = 100 * time.Millisecond
	liveChunk    = 16 << 10
	liveMax      = 1 << 20
)

// liveOutput is a sandbox.Spec.Live that batches what the process prints and sends it to an OutputSink
// from its own goroutine, so the process's output never waits for the network. Safe for concurrent use.
type liveOutput struct {
	sink OutputSink
	id   string

	mu      sync.Mutex
	buf     []byte
	left    int64 // bytes that may still be sent
	dropped int64 // bytes past the cap
	ready   chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

// startLive starts sending id's output to sink, at most max bytes of it; the returned finish sends what
// is left and stops. ctx bounds the sends.
func startLive(ctx context.Context, sink OutputSink, id string, max int64) (*liveOutput, func()) {
	l := &liveOutput{sink: sink, id: id, left: max, ready: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go l.loop(ctx)
	var once sync.Once
	return l, func() { once.Do(func() { close(l.stop); <-l.done }) }
}

// Write keeps p for the next send, up to the cap, and never fails or blocks.
func (l *liveOutput) Write(p []byte) (int, error) {
	l.mu.Lock()
	keep := min(int64(len(p)), l.left)
	l.buf = append(l.buf, p[:keep]...)
	l.left -= keep
	l.dropped += int64(len(p)) - keep
	full := len(l.buf) >= liveChunk
	l.mu.Unlock()
	if full {
		select {
		case l.ready <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

func (l *liveOutput) loop(ctx context.Context) {
	defer close(l.done)
	t := time.NewTicker(liveInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-l.ready:
		case <-l.stop:
			l.send(ctx, true)
			return
		}
		l.send(ctx, false)
	}
}

// send sends what is buffered, in chunks of at most liveChunk bytes that end on whole UTF-8 characters
// (unless last: then everything goes, with a note of what the cap dropped).
func (l *liveOutput) send(ctx context.Context, last bool) {
	l.mu.Lock()
	cut := len(l.buf)
	if !last {
		cut = runeBoundary(l.buf)
	}
	out := l.buf[:cut:cut]
	l.buf = append([]byte(nil), l.buf[cut:]...)
	dropped := l.dropped
	l.mu.Unlock()
	for len(out) > 0 {
		n := min(len(out), liveChunk)
		if n < len(out) {
			n = runeBoundary(out[:n])
		}
		if n == 0 {
			n = min(len(out), liveChunk)
		}
		_ = l.sink.PublishOutput(ctx, l.id, out[:n])
		out = out[n:]
	}
	if last && dropped > 0 {
		_ = l.sink.PublishOutput(ctx, l.id, fmt.Appendf(nil, "\n[live output stopped here: %d more bytes were printed; the result has the end]\n", dropped))
	}
}

// runeBoundary is the length of b without a UTF-8 character that is cut at its end.
func runeBoundary(b []byte) int {
	for k := 1; k <= utf8.UTFMax && k <= len(b); k++ {
		if utf8.RuneStart(b[len(b)-k]) {
			if !utf8.FullRune(b[len(b)-k:]) {
				return len(b) - k
			}
			break
		}
	}
	return len(b)
}
