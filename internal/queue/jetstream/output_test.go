package jetstream_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
)

// TestFollowOutput: Follow of one call gets that call's text from its first byte, what was printed
// before it started included, in order, from a worker's separate connection, with a note where bytes
// are missing, and none of another call's; the calls stream stores none of them.
func TestFollowOutput(t *testing.T) {
	var url string
	dispatcher := connectWith(t, func(c *jetstream.Config) { url = c.URL })
	wcfg := jetstream.DefaultConfig()
	wcfg.URL, wcfg.Name = url, "worker"
	worker, err := jetstream.Connect(context.Background(), wcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(worker.Close)

	id, other := call.NewID(), call.NewID()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var off int64
	print := func(i int) {
		t.Helper()
		data := []byte(strings.Repeat("x", i) + "\n")
		if err := worker.Live().PublishChunk(ctx, other, queue.Chunk{Stream: "stdout", Offset: off, Data: []byte("other\n")}); err != nil {
			t.Fatal(err)
		}
		if err := worker.Live().PublishChunk(ctx, id, queue.Chunk{Stream: "stdout", Offset: off, Data: data}); err != nil {
			t.Fatal(err)
		}
		off += int64(len(data))
	}
	for i := range 25 {
		print(i)
	}
	var mu sync.Mutex
	var got []string
	followed := make(chan error, 1)
	go func() {
		followed <- dispatcher.Live().Follow(ctx, id, func(chunk string) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, chunk)
		})
	}()
	for i := 25; i < 50; i++ {
		print(i)
	}
	off += 7 // seven bytes never published
	if err := worker.Live().PublishChunk(ctx, id, queue.Chunk{Stream: "stdout", Offset: off, Data: []byte("end\n")}); err != nil {
		t.Fatal(err)
	}
	for {
		mu.Lock()
		n := len(got)
		last := ""
		if n > 0 {
			last = got[n-1]
		}
		mu.Unlock()
		if last == "end\n" {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Follow got %d chunks in 30s, last %q", n, last)
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	if err := <-followed; err != nil {
		t.Errorf("Follow returned %v after its context ended, want nil", err)
	}
	mu.Lock()
	defer mu.Unlock()
	chunks := got
	if len(chunks) != 52 {
		t.Fatalf("got %d chunks of the call, want 52: %q", len(chunks), chunks)
	}
	for i, c := range chunks[:50] {
		if c != strings.Repeat("x", i)+"\n" {
			t.Fatalf("chunk %d is %q: out of order or another call's", i, c)
		}
	}
	if chunks[50] != "[... 7 bytes of stdout not kept live ...]\n" {
		t.Errorf("the note of the missing bytes is %q", chunks[50])
	}
	st, err := dispatcher.Calls().State(context.Background())
	if err != nil || st.Pending != 0 {
		t.Errorf("the calls stream holds %+v (%v), want no output in it", st, err)
	}
}
