package worker

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
)

// fakeSink records the chunks published per call.
type fakeSink struct {
	mu     sync.Mutex
	chunks map[string][]string
}

func (s *fakeSink) PublishOutput(_ context.Context, id string, chunk []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.chunks == nil {
		s.chunks = map[string][]string{}
	}
	s.chunks[id] = append(s.chunks[id], string(chunk))
	return nil
}

func (s *fakeSink) of(id string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.chunks[id]
}

// TestLiveOutputOfCommands: a command's output reaches the sink before its result is recorded; the
// output of the in-container tool runner (read_file) is the worker's own and is never published.
func TestLiveOutputOfCommands(t *testing.T) {
	for _, tt := range []struct {
		tool, args string
		live       bool
	}{
		{"run_shell", shellArgs, true},
		{"read_file", `{"path":"a"}`, false},
	} {
		t.Run(tt.tool, func(t *testing.T) {
			st := queuetest.NewStore()
			rt := &fakeRuntime{}
			sink := &fakeSink{}
			w := newTestWorker(t, rt, st)
			WithOutputSink(sink)(w)
			c := newCall(tt.tool, tt.args)
			st.Put(call.NewResult(c, call.StatusQueued))
			w.Handle(context.Background(), &fakeDelivery{c: c})
			if got := st.Result(c.ID); tt.live && got.Status != call.StatusOK { // the fake prints no runner's JSON
				t.Fatalf("status %s %+v", got.Status, got.Error)
			}
			if (rt.specs[0].Live != nil) != tt.live {
				t.Errorf("the spec has a live writer: %v, want %v", rt.specs[0].Live != nil, tt.live)
			}
			if got := strings.Join(sink.of(c.ID), ""); (got == "done\n") != tt.live {
				t.Errorf("published %q, live %v", got, tt.live)
			}
		})
	}
}

// TestLiveOutputLimits: at most max bytes go out, with a note of how much more was printed; chunks are at
// most liveChunk bytes and never split a UTF-8 character, even one that arrived in two writes.
func TestLiveOutputLimits(t *testing.T) {
	sink := &fakeSink{}
	const max = 3 * liveChunk
	l, finish := startLive(context.Background(), sink, "c1", max)
	l.Write([]byte("é")[:1]) // half a character: nothing of it goes out until the rest arrives
	l.send(context.Background(), false)
	if got := sink.of("c1"); len(got) != 0 {
		t.Errorf("half a character was sent: %q", got)
	}
	l.Write([]byte("é")[1:])
	big := strings.Repeat("ü", liveChunk) // 2*liveChunk bytes
	l.Write([]byte(big))
	l.Write([]byte(strings.Repeat("z", 2*liveChunk)))
	finish()
	finish() // idempotent
	chunks := sink.of("c1")
	all := strings.Join(chunks, "")
	body, note, _ := strings.Cut(all, "\n[live output stopped here: ")
	if len(body) != max || !strings.HasPrefix(body, "é"+big[:10]) || !strings.Contains(note, "more bytes were printed") {
		t.Fatalf("sent %d bytes then %q; want %d and a note", len(body), note, max)
	}
	if dropped := fmt.Sprintf("%d more bytes", 4*liveChunk+2-max); !strings.HasPrefix(note, dropped) {
		t.Errorf("note %q does not say %q", note, dropped)
	}
	for i, c := range chunks[:len(chunks)-1] { // all but the note
		if len(c) > liveChunk || !utf8.ValidString(c) {
			t.Errorf("chunk %d: %d bytes, valid UTF-8 %v", i, len(c), utf8.ValidString(c))
		}
	}
}
