package jetstream_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
)

// dispatcherAndWorker connects to a fresh provisioned JetStream as a dispatcher (c) and as a worker.
func dispatcherAndWorker(t *testing.T) (c, worker *jetstream.Conn) {
	t.Helper()
	var url string
	c = connectWith(t, func(cfg *jetstream.Config) { url = cfg.URL })
	return c, jstest.Connect(t, url, "worker", false)
}

// TestLiveOutput: a reader that starts following a call after it printed replays what was printed, then
// gets each later chunk live, bytes unchanged (binary included), in order, none twice; two readers get
// the same bytes each; a reader that does not read holds up no one and loses nothing; other calls' chunks never reach a reader; a reader's channel
// closes when its context ends; once the call's output is dropped (EndOutput), a new reader gets nothing.
func TestLiveOutput(t *testing.T) {
	c, worker := dispatcherAndWorker(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := call.NewID()
	var want []byte
	publish := func(n int) {
		t.Helper()
		for range n {
			i := len(want) / 300
			data := bytes.Repeat([]byte{byte(i), 0xff, '\n'}, 100)
			if err := worker.Live().PublishChunk(ctx, id, queue.Chunk{Stream: "stderr", Offset: int64(len(want)), Data: data}); err != nil {
				t.Fatal(err)
			}
			if err := worker.Live().PublishChunk(ctx, call.NewID(), queue.Chunk{Stream: "stderr", Offset: int64(len(want)), Data: []byte("other call")}); err != nil {
				t.Fatal(err)
			}
			want = append(want, data...)
		}
	}
	publish(50) // before anyone follows

	late, err := c.Live().FollowOutput(ctx, id, 1000)
	if err != nil {
		t.Fatal(err)
	}
	secondCtx, stopSecond := context.WithCancel(ctx)
	second, err := c.Live().FollowOutput(secondCtx, id, 1000)
	if err != nil {
		t.Fatal(err)
	}
	stuck, err := c.Live().FollowOutput(ctx, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	publish(50) // while they follow
	read := func(name string, chunks <-chan queue.Chunk, at int64) {
		t.Helper()
		for at < int64(len(want)) {
			select {
			case ch := <-chunks:
				if ch.Stream != "stderr" || ch.Offset != at || !bytes.Equal(ch.Data, want[at:ch.End()]) {
					t.Fatalf("%s: chunk %s@%d (%d bytes) after %d bytes, or not the bytes published there", name, ch.Stream, ch.Offset, len(ch.Data), at)
				}
				at = ch.End()
			case <-ctx.Done():
				t.Fatalf("%s: received %d of %d bytes", name, at, len(want))
			}
		}
	}
	read("the late reader", late, 0)
	read("a second reader", second, 0)
	read("the reader that read nothing until now", stuck, 0)

	stopSecond()
	for range second { // closed once its context ended
	}
	if err := worker.Live().EndOutput(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := worker.Live().EndOutput(ctx, call.NewID()); err != nil {
		t.Fatalf("EndOutput of a call without chunks: %v", err)
	}
	afterCtx, stopAfter := context.WithTimeout(ctx, 500*time.Millisecond)
	defer stopAfter()
	after, err := c.Live().FollowOutput(afterCtx, id, 10)
	if err != nil {
		t.Fatal(err)
	}
	for ch := range after {
		t.Fatalf("a reader after EndOutput got a chunk at %d", ch.Offset)
	}
}

// TestFollowShowsPulls: Follow (MCP's progress) shows the reports of a call's image pull as lines for
// people, and the output as printed.
func TestFollowShowsPulls(t *testing.T) {
	c, worker := dispatcherAndWorker(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := call.NewID()
	line := `{"image":"r/x:1","bytes_done":2000000,"bytes_total":4000000,"phase":"fetching"}` + "\n"
	for _, ch := range []queue.Chunk{{Stream: call.StreamPull, Data: []byte(line)}, {Stream: call.StreamStdout, Data: []byte("hi\n")}} {
		if err := worker.Live().PublishChunk(ctx, id, ch); err != nil {
			t.Fatal(err)
		}
	}
	fctx, stop := context.WithCancel(ctx)
	var got []string
	err := c.Live().Follow(fctx, id, func(chunk string) {
		if got = append(got, chunk); len(got) == 2 {
			stop()
		}
	})
	if want := []string{"pulling image r/x:1: 2.0 MB of 4.0 MB (50%)\n", "hi\n"}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("Follow emitted %q (%v), want %q", got, err, want)
	}
}

// TestFollowAcrossAttempts: a call run again (its worker lost) prints from byte 0 again. A follower
// gets the first attempt's chunks (one resent, delivered once), then the later attempt's from their
// first byte with the attempt on each, never a late chunk of the earlier attempt; Follow says that the
// output starts over, then prints the new attempt's.
func TestFollowAcrossAttempts(t *testing.T) {
	c, worker := dispatcherAndWorker(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := call.NewID()
	for _, ch := range []queue.Chunk{
		{Stream: call.StreamStdout, Offset: 0, Data: []byte("first "), Attempt: 1},
		{Stream: call.StreamStdout, Offset: 6, Data: []byte("run\n"), Attempt: 1},
		{Stream: call.StreamStdout, Offset: 6, Data: []byte("run\n"), Attempt: 1}, // resent
		{Stream: call.StreamStdout, Offset: 0, Data: []byte("second"), Attempt: 3},
		{Stream: call.StreamStdout, Offset: 10, Data: []byte("late\n"), Attempt: 1},
		{Stream: call.StreamStdout, Offset: 6, Data: []byte(" run\n"), Attempt: 3},
	} {
		if err := worker.Live().PublishChunk(ctx, id, ch); err != nil {
			t.Fatal(err)
		}
	}
	fctx, stop := context.WithCancel(ctx)
	chunks, err := c.Live().FollowOutput(fctx, id, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []queue.Chunk{
		{Stream: call.StreamStdout, Offset: 0, Data: []byte("first "), Attempt: 1},
		{Stream: call.StreamStdout, Offset: 6, Data: []byte("run\n"), Attempt: 1},
		{Stream: call.StreamStdout, Offset: 0, Data: []byte("second"), Attempt: 3},
		{Stream: call.StreamStdout, Offset: 6, Data: []byte(" run\n"), Attempt: 3},
	}
	for i, w := range want {
		select {
		case ch := <-chunks:
			if ch.Stream != w.Stream || ch.Offset != w.Offset || ch.Attempt != w.Attempt || !bytes.Equal(ch.Data, w.Data) {
				t.Fatalf("chunk %d: %s@%d attempt %d %q, want %s@%d attempt %d %q", i, ch.Stream, ch.Offset, ch.Attempt, ch.Data, w.Stream, w.Offset, w.Attempt, w.Data)
			}
		case <-ctx.Done():
			t.Fatalf("chunk %d never came", i)
		}
	}
	stop()

	fctx, stop = context.WithCancel(ctx)
	var got []string
	err = c.Live().Follow(fctx, id, func(chunk string) {
		if got = append(got, chunk); len(got) == 5 {
			stop()
		}
	})
	wantText := []string{"first ", "run\n", "[toolpool: the call is running again (attempt 3), its worker having been lost: its output starts over]\n", "second", " run\n"}
	if err != nil || !slices.Equal(got, wantText) {
		t.Fatalf("Follow emitted %q (%v), want %q", got, err, wantText)
	}
}

// TestLiveRetention: a call that prints more than the live stream keeps: a reader from the start gets a
// chunk whose offset is past its position (the bytes in between are not kept), then the rest in order,
// each chunk the bytes published at its offset.
func TestLiveRetention(t *testing.T) {
	c, url := jstest.Provisioned(t, func(cfg *jetstream.Config) { cfg.LiveMaxBytes = 1 << 20 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := call.NewID()
	const chunk, chunks = 64 << 10, 40 // 2.5 MiB, over the 1 MiB kept
	data := make([]byte, chunk*chunks)
	for i := range data {
		data[i] = byte(i * 7 % 251)
	}
	for i := range chunks {
		if err := c.Live().PublishChunk(ctx, id, queue.Chunk{Stream: "stdout", Offset: int64(i * chunk), Data: data[i*chunk : (i+1)*chunk]}); err != nil {
			t.Fatal(err)
		}
	}
	// Chunks are published without an acknowledgement: follow once the stream has stored them all, or
	// a chunk still on its way lands after the follower started and is delivered beside older ones.
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 30*time.Second, "every chunk stored", func() bool {
		s, err := js.Stream(ctx, jetstream.DefaultConfig().Stream+"_LIVE")
		return err == nil && s.CachedInfo().State.LastSeq >= chunks
	})
	got, err := c.Live().FollowOutput(ctx, id, 4)
	if err != nil {
		t.Fatal(err)
	}
	var at, missing int64
	for at < int64(len(data)) {
		select {
		case ch := <-got:
			if ch.Offset < at || !bytes.Equal(ch.Data, data[ch.Offset:ch.End()]) {
				t.Fatalf("chunk at %d after %d bytes, or not the bytes published there", ch.Offset, at)
			}
			missing += ch.Offset - at
			at = ch.End()
		case <-ctx.Done():
			t.Fatalf("received up to byte %d of %d", at, len(data))
		}
	}
	if missing < int64(len(data))-1<<20 {
		t.Fatalf("%d bytes reported missing, want at least the %d over what the stream keeps", missing, len(data)-1<<20)
	}
}

// TestOpenOutput: a stored output reads from any offset, and a missing one is queue.ErrNotFound.
func TestOpenOutput(t *testing.T) {
	c := connect(t)
	ctx := context.Background()
	data := bytes.Repeat([]byte("0123456789"), 50000) // 500 000 bytes: several object chunks
	if _, err := c.Outputs().PutOutput(ctx, "c_x/1/full-stdout/0", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	rd, err := c.Outputs().OpenOutput(ctx, "c_x/1/full-stdout/0", 300001)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	b, err := io.ReadAll(rd)
	if err != nil || !bytes.Equal(b, data[300001:]) {
		t.Fatalf("read %d bytes (%v), want the %d from offset 300001", len(b), err, len(data)-300001)
	}
	if _, err := c.Outputs().OpenOutput(ctx, "c_x/1/nothing", 0); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("missing object: %v, want queue.ErrNotFound", err)
	}
}

// TestOpenOutputWaitsForALaggingReplica: an object that a reader does not find at once (a replica that has
// not caught up with the write its record names) is found when it appears within a moment; one that never
// appears is queue.ErrNotFound after that moment.
func TestOpenOutputWaitsForALaggingReplica(t *testing.T) {
	c := connect(t)
	ctx := context.Background()
	put := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		_, err := c.Outputs().PutOutput(ctx, "c_y/1/stdout", strings.NewReader("late"))
		put <- err
	}()
	b, err := c.Outputs().ReadOutput(ctx, "c_y/1/stdout", 0, -1)
	if perr := <-put; perr != nil {
		t.Fatal(perr)
	}
	if err != nil || string(b) != "late" {
		t.Fatalf("read %q (%v), want the object written 300ms after the read began", b, err)
	}
	began := time.Now()
	if _, err := c.Outputs().ReadOutput(ctx, "c_y/1/never", 0, -1); !errors.Is(err, queue.ErrNotFound) || time.Since(began) > 5*time.Second {
		t.Fatalf("missing object: %v after %s, want queue.ErrNotFound within a few seconds", err, time.Since(began))
	}
}

// TestOpenOutputSlowReader: a reader with no deadline of its own that takes longer than nats.go's default
// five seconds still reads the whole object (a large workspace archive streamed to a slow client).
func TestOpenOutputSlowReader(t *testing.T) {
	c := connect(t)
	ctx := context.Background()
	data := bytes.Repeat([]byte("0123456789"), 200000) // 2 MB: many object chunks
	if _, err := c.Outputs().PutOutput(ctx, "c_y/1/archive", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	rd, err := c.Outputs().OpenOutput(ctx, "c_y/1/archive", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	first := make([]byte, 10)
	if _, err := io.ReadFull(rd, first); err != nil {
		t.Fatal(err)
	}
	time.Sleep(7 * time.Second)
	rest, err := io.ReadAll(rd)
	if err != nil || !bytes.Equal(append(first, rest...), data) {
		t.Fatalf("read %d of %d bytes after a pause (%v)", len(first)+len(rest), len(data), err)
	}
}

// TestLiveConfig: the live stream's bounds are checked, with what to set.
func TestLiveConfig(t *testing.T) {
	cfg := jetstream.DefaultConfig()
	cfg.URL = "nats://127.0.0.1:4222"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	small := cfg
	small.LiveMaxBytes = 1000
	if err := small.Validate(); err == nil || !strings.Contains(err.Error(), "queue live_max_bytes 1000 is below 1 MiB") {
		t.Errorf("live_max_bytes 1000: %v", err)
	}
	short := cfg
	short.LiveMaxAge = time.Second
	if err := short.Validate(); err == nil || !strings.Contains(err.Error(), "queue live_max_age 1s is below 1m") {
		t.Errorf("live_max_age 1s: %v", err)
	}
}

// BenchmarkLiveCall is what retaining a call's output costs its worker, per call: publishing ten
// 100-byte lines (stored by the live stream) and dropping them when the call ends (EndOutput), against
// the publishing alone. One in-process server, single replica.
func BenchmarkLiveCall(b *testing.B) {
	_, url := jstest.Provisioned(b, nil)
	worker := jstest.Connect(b, url, "worker", false)
	ctx := context.Background()
	line := bytes.Repeat([]byte("x"), 99)
	line = append(line, '\n')
	publish := func(id string) {
		for i := range 10 {
			if err := worker.Live().PublishChunk(ctx, id, queue.Chunk{Stream: "stdout", Offset: int64(i * len(line)), Data: line}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("publish", func(b *testing.B) {
		for range b.N {
			publish(call.NewID())
		}
	})
	b.Run("publish+end", func(b *testing.B) {
		for range b.N {
			id := call.NewID()
			publish(id)
			if err := worker.Live().EndOutput(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
	})
}
