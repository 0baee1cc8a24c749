package worker

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
	"github.com/toolpool/toolpool/internal/sandbox"
)

// printRuntime prints data on stdout through the spec's watcher in pieces of piece bytes, the way the
// containerd runtime's output copy does, and captures it like the runtime.
type printRuntime struct {
	data  []byte
	piece int
}

func (r printRuntime) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	capw := sandbox.NewCapWriter(spec.Limits.OutputBytes)
	for b := r.data; len(b) > 0; {
		n := min(r.piece, len(b))
		capw.Write(b[:n])
		if spec.Stdout != nil {
			spec.Stdout.Write(b[:n])
		}
		b = b[n:]
	}
	return sandbox.Outcome{Stdout: capw.Captured()}, nil
}

// chunkLog is a Live that records chunks, and the calls whose chunks were dropped (with how many chunks
// had been published then); block makes every publish wait until released; onEnd, if set, runs at each
// EndOutput.
type chunkLog struct {
	mu     sync.Mutex
	chunks []queue.Chunk
	ended  []string
	endAt  []int
	block  chan struct{}
	onEnd  func(id string)
}

func (l *chunkLog) EndOutput(_ context.Context, id string) error {
	if l.onEnd != nil {
		l.onEnd(id)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = append(l.ended, id)
	l.endAt = append(l.endAt, len(l.chunks))
	return nil
}

func (l *chunkLog) PublishChunk(_ context.Context, id string, ch queue.Chunk) error {
	if l.block != nil {
		<-l.block
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	ch.Data = bytes.Clone(ch.Data) // the publisher reuses its buffer
	l.chunks = append(l.chunks, ch)
	return nil
}

// TestFullOutputKeptAndStreamed: a command's whole stdout (bigger than the model's cap and the sandbox's
// capture, with bytes that are not UTF-8) is stored byte for byte, every live chunk is the stream's bytes
// at its offset, and the envelope's output is bounded and names read_output with the call's id.
func TestFullOutputKeptAndStreamed(t *testing.T) {
	var data bytes.Buffer
	for i := 0; data.Len() < 3<<20; i++ {
		fmt.Fprintf(&data, "line %d é\xff\n", i)
	}
	st := queuetest.NewStore()
	outs := &memOutputs{objs: map[string][]byte{}}
	live := &chunkLog{}
	w := newTestWorkerWith(t, slowConfig(t), printRuntime{data: data.Bytes(), piece: 32 << 10}, st,
		WithLeases(newFakeLeases()), WithOutputs(outs), WithLive(live))
	c := newCall("run_shell", shellArgs)
	c.Limits.OutputBytes = 30000
	st.Put(call.NewResult(c, call.StatusQueued))
	w.Handle(context.Background(), &fakeDelivery{c: c})
	got, _ := st.Get(context.Background(), c.ID)
	r := got.Result
	s := r.Streams[call.StreamStdout]
	if r.Status != call.StatusOK || s == nil || s.Bytes != int64(data.Len()) || s.Kept != int64(data.Len()) {
		t.Fatalf("status %s, stdout stream %+v, want %d bytes kept", r.Status, s, data.Len())
	}
	var stored []byte
	for i := int64(0); i*s.Page < s.Kept; i++ {
		stored = append(stored, outs.objs[s.PageName(i)]...)
	}
	if !bytes.Equal(stored, data.Bytes()) || s.Page != 1<<20 {
		t.Fatalf("stored %d bytes in pages of %d, not the %d printed", len(stored), s.Page, data.Len())
	}
	if len(r.Output) > 30000 || !strings.Contains(r.Output, `read_output {"call_id":"`+c.ID+`","stream":"stdout","offset":`) || !r.Truncated {
		t.Errorf("output (%d bytes, truncated %v) does not name read_output for this call:\n%.600s", len(r.Output), r.Truncated, r.Output)
	}
	live.mu.Lock()
	defer live.mu.Unlock()
	var seen int64
	for _, ch := range live.chunks {
		if ch.Stream != call.StreamStdout || ch.End() > int64(data.Len()) || !bytes.Equal(ch.Data, data.Bytes()[ch.Offset:ch.End()]) {
			t.Fatalf("chunk %s@%d (%d bytes) is not the stream's bytes there", ch.Stream, ch.Offset, len(ch.Data))
		}
		if ch.Offset < seen {
			t.Fatalf("chunk at %d after one ending at %d", ch.Offset, seen)
		}
		seen = ch.End()
	}
	if seen == 0 {
		t.Error("nothing was published live")
	}
}

// TestLiveOutputEnds: the worker drops a call's live chunks once the call's output is stored and its
// result recorded, after its last chunk was published; a later attempt drops them before it runs too
// (an earlier attempt's output is not this run's), and its chunks, running record and result carry its
// attempt, so that a reader of the earlier attempt's output knows the output starts over.
func TestLiveOutputEnds(t *testing.T) {
	st := queuetest.NewStore()
	outs := &memOutputs{objs: map[string][]byte{}}
	live := &chunkLog{}
	c := newCall("run_shell", shellArgs)
	var states []call.Status
	var attempts []uint64
	live.onEnd = func(id string) {
		rec, err := st.Get(context.Background(), id)
		if err != nil {
			t.Errorf("read the record at EndOutput: %v", err)
			return
		}
		states = append(states, rec.Result.Status)
		attempts = append(attempts, rec.Result.Attempt)
	}
	w := newTestWorkerWith(t, slowConfig(t), printRuntime{data: bytes.Repeat([]byte("x"), 300000), piece: 1000}, st,
		WithLeases(newFakeLeases()), WithOutputs(outs), WithLive(live))
	st.Put(call.NewResult(c, call.StatusQueued))
	w.Handle(context.Background(), &fakeDelivery{c: c, attempt: 2})
	live.mu.Lock()
	defer live.mu.Unlock()
	if len(live.ended) != 2 || live.ended[0] != c.ID || live.ended[1] != c.ID {
		t.Fatalf("EndOutput called for %v, want the call's id twice (before the second attempt ran, and once it was recorded)", live.ended)
	}
	if live.endAt[0] != 0 || live.endAt[1] != len(live.chunks) || len(live.chunks) == 0 {
		t.Errorf("EndOutput after %v of %d chunks, want before the first and after the last", live.endAt, len(live.chunks))
	}
	if len(states) != 2 || states[0] != call.StatusRunning || states[1] != call.StatusOK {
		t.Errorf("the record at each EndOutput: %v, want running (claimed, not yet run), then ok (recorded)", states)
	}
	if len(attempts) != 2 || attempts[0] != 2 || attempts[1] != 2 {
		t.Errorf("the record's attempt at each EndOutput: %v, want 2 (running) and 2 (recorded)", attempts)
	}
	for i, ch := range live.chunks {
		if ch.Attempt != 2 {
			t.Fatalf("chunk %d of attempt %d, want 2", i, ch.Attempt)
		}
	}
}

// TestLiveOutputComplete: output that never fills the pending buffer is published whole, in order, up
// to its last byte (published after the process ended), with no UTF-8 sequence split between chunks.
func TestLiveOutputComplete(t *testing.T) {
	data := []byte(strings.Repeat("héllo wörld ", 20000)) // 260 000 bytes, printed in 1 000-byte pieces
	data = data[:200000]
	st := queuetest.NewStore()
	live := &chunkLog{}
	w := newTestWorkerWith(t, slowConfig(t), printRuntime{data: data, piece: 1000}, st,
		WithLeases(newFakeLeases()), WithOutputs(&memOutputs{objs: map[string][]byte{}}), WithLive(live))
	c := newCall("run_shell", shellArgs)
	st.Put(call.NewResult(c, call.StatusQueued))
	w.Handle(context.Background(), &fakeDelivery{c: c})
	live.mu.Lock()
	defer live.mu.Unlock()
	var got []byte
	for _, ch := range live.chunks {
		if ch.Offset != int64(len(got)) {
			t.Fatalf("chunk at %d after %d bytes", ch.Offset, len(got))
		}
		if !utf8.Valid(ch.Data) {
			t.Errorf("chunk at %d splits a UTF-8 sequence", ch.Offset)
		}
		got = append(got, ch.Data...)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("published %d bytes, want all %d", len(got), len(data))
	}
}

// TestStuckLiveNeverSlowsTheCall: with a publisher that never returns, a call printing 8 MiB still
// finishes, keeps its whole output, and waits for the stuck publisher no longer than liveFlushWait.
func TestStuckLiveNeverSlowsTheCall(t *testing.T) {
	old := liveFlushWait
	liveFlushWait = 200 * time.Millisecond
	defer func() { liveFlushWait = old }()
	data := bytes.Repeat([]byte("x"), 8<<20)
	st := queuetest.NewStore()
	outs := &memOutputs{objs: map[string][]byte{}}
	live := &chunkLog{block: make(chan struct{})}
	defer close(live.block)
	w := newTestWorkerWith(t, slowConfig(t), printRuntime{data: data, piece: 4 << 10}, st,
		WithLeases(newFakeLeases()), WithOutputs(outs), WithLive(live))
	c := newCall("run_shell", shellArgs)
	st.Put(call.NewResult(c, call.StatusQueued))
	done := make(chan struct{})
	go func() { w.Handle(context.Background(), &fakeDelivery{c: c}); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the call waits for a stuck live publisher")
	}
	got, _ := st.Get(context.Background(), c.ID)
	if s := got.Result.Streams[call.StreamStdout]; s == nil || s.Kept != int64(len(data)) {
		t.Fatalf("stdout stream %+v, want all %d bytes kept", s, len(data))
	}
}

func TestRuneCut(t *testing.T) {
	tests := []struct {
		name string
		b    string
		n    int
		want int
	}{
		{"ascii", "abcdef", 4, 4},
		{"whole rune at the cut", "aé", 3, 3},
		{"inside a two-byte rune", "aé", 2, 1},
		{"inside a four-byte rune", "a😀", 3, 1},
		{"invalid byte", "a\xff\xfe", 3, 3},
		{"empty", "", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := runeCut([]byte(tt.b), tt.n); got != tt.want {
				t.Errorf("runeCut(%q, %d) = %d, want %d", tt.b, tt.n, got, tt.want)
			}
		})
	}
}

// pullingRuntime reports a pull of the spec's image, then prints as printRuntime does.
type pullingRuntime struct{ printRuntime }

func (r pullingRuntime) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	if spec.OnPull != nil {
		spec.OnPull(sandbox.PullProgress{Image: spec.Image, Done: 1, Total: 3, Phase: sandbox.PullFetching})
		spec.OnPull(sandbox.PullProgress{Image: spec.Image, Done: 3, Total: 3, Phase: sandbox.PullDone})
	}
	return r.printRuntime.Run(ctx, spec)
}

// TestPullProgressPublishedLive: the reports of a call's image pull go to its live output as the pull
// stream, one JSON line each at contiguous offsets, before its output; all are dropped with the output.
func TestPullProgressPublishedLive(t *testing.T) {
	st := queuetest.NewStore()
	live := &chunkLog{}
	w := newTestWorkerWith(t, slowConfig(t), pullingRuntime{printRuntime{data: []byte("hi\n"), piece: 3}}, st,
		WithLeases(newFakeLeases()), WithOutputs(&memOutputs{objs: map[string][]byte{}}), WithLive(live))
	c := newCall("run_shell", shellArgs)
	c.Image = "reg.example/x:1"
	st.Put(call.NewResult(c, call.StatusQueued))
	w.Handle(context.Background(), &fakeDelivery{c: c})
	live.mu.Lock()
	defer live.mu.Unlock()
	var pulls []queue.Chunk
	for _, ch := range live.chunks {
		if ch.Stream == call.StreamPull {
			pulls = append(pulls, ch)
		}
	}
	first := `{"image":"reg.example/x:1","bytes_done":1,"bytes_total":3,"phase":"fetching"}` + "\n"
	if len(pulls) != 2 || string(pulls[0].Data) != first || pulls[0].Offset != 0 || pulls[1].Offset != int64(len(first)) ||
		!strings.HasSuffix(string(pulls[1].Data), `"phase":"done"}`+"\n") || live.chunks[0].Stream != call.StreamPull {
		t.Fatalf("live chunks %+v, want two pull lines first, at contiguous offsets", live.chunks)
	}
	if len(live.ended) != 1 || live.ended[0] != c.ID {
		t.Errorf("live output dropped for %v, want the call's once", live.ended)
	}
}
