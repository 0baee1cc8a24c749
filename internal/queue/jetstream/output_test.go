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

// TestFollowOutput: a follower of one call gets that call's chunks, in order, from a worker's separate
// connection, and none of another call's; the calls stream stores none of them.
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
	var mu sync.Mutex
	var got []string
	first := make(chan struct{})
	followed := make(chan error, 1)
	go func() {
		followed <- dispatcher.Live().Follow(ctx, id, func(chunk string) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, chunk)
			if len(got) == 1 {
				close(first)
			}
		})
	}()
	// Follow may not have subscribed yet: publish a probe until one arrives, then the chunks that count.
	probe := time.NewTicker(20 * time.Millisecond)
	defer probe.Stop()
wait:
	for {
		if err := worker.Live().PublishChunk(ctx, id, queue.Chunk{Stream: "stdout", Data: []byte("probe\n")}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-first:
			break wait
		case <-probe.C:
		case <-ctx.Done():
			t.Fatal("Follow got nothing in 30s")
		}
	}
	for i := range 50 {
		if err := worker.Live().PublishChunk(ctx, other, queue.Chunk{Stream: "stdout", Data: []byte("other\n")}); err != nil {
			t.Fatal(err)
		}
		if err := worker.Live().PublishChunk(ctx, id, queue.Chunk{Stream: "stdout", Data: []byte(strings.Repeat("x", i) + "\n")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := worker.Live().PublishChunk(ctx, id, queue.Chunk{Stream: "stdout", Data: []byte("end\n")}); err != nil {
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
	var chunks []string
	for _, c := range got {
		if c != "probe\n" {
			chunks = append(chunks, c)
		}
	}
	if len(chunks) != 51 {
		t.Fatalf("got %d chunks of the call, want 51: %q", len(chunks), chunks)
	}
	for i, c := range chunks[:50] {
		if c != strings.Repeat("x", i)+"\n" {
			t.Fatalf("chunk %d is %q: out of order or another call's", i, c)
		}
	}
	st, err := dispatcher.Calls().State(context.Background())
	if err != nil || st.Pending != 0 {
		t.Errorf("the calls stream holds %+v (%v), want no output in it", st, err)
	}
}
