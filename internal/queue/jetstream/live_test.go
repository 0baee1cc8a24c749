package jetstream_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/queue"
)

// TestLiveOutput: followers of a call on one Conn share its chunks, bytes unchanged (binary included);
// a follower that does not read loses chunks without holding up the others; a follower's channel closes
// when its context ends, and chunks of other calls never reach it.
func TestLiveOutput(t *testing.T) {
	c := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fast, err := c.Live().FollowOutput(ctx, "c_a", 1000)
	if err != nil {
		t.Fatal(err)
	}
	stuckCtx, stopStuck := context.WithCancel(ctx)
	stuck, err := c.Live().FollowOutput(stuckCtx, "c_a", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Live().PublishChunk(ctx, "c_b", queue.Chunk{Stream: "stdout", Offset: 0, Data: []byte("other call")}); err != nil {
		t.Fatal(err)
	}
	var want []byte
	for i := range 100 {
		data := bytes.Repeat([]byte{byte(i), 0xff, '\n'}, 100)
		if err := c.Live().PublishChunk(ctx, "c_a", queue.Chunk{Stream: "stderr", Offset: int64(len(want)), Data: data}); err != nil {
			t.Fatal(err)
		}
		want = append(want, data...)
	}
	var got []byte
	for len(got) < len(want) {
		select {
		case ch := <-fast:
			if ch.Stream != "stderr" || ch.Offset != int64(len(got)) {
				t.Fatalf("chunk %s@%d after %d bytes", ch.Stream, ch.Offset, len(got))
			}
			got = append(got, ch.Data...)
		case <-ctx.Done():
			t.Fatalf("received %d of %d bytes", len(got), len(want))
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the chunks' bytes changed on the way")
	}
	if n := len(stuck); n != 1 {
		t.Errorf("the follower that never read holds %d chunks, want its buffer of 1", n)
	}
	stopStuck()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case _, ok := <-stuck:
			if !ok {
				return
			}
		case <-time.After(time.Until(deadline)):
			t.Fatal("the channel of a follower whose context ended was not closed")
		}
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
