package jetstream

import (
	"bytes"
	"context"
	"io"
	"testing"
	"testing/iotest"
	"time"
)

// smallReads returns at most n bytes a Read, like an HTTP request's body or a pipe.
type smallReads struct {
	r io.Reader
	n int
}

func (s smallReads) Read(p []byte) (int, error) { return s.r.Read(p[:min(len(p), s.n)]) }

// TestObjectPutsFillTheirChunks: an output or checkpoint object read a kilobyte at a time is stored in
// chunks of the store's full chunk size, not one per read: 1000-byte reads of 1 MiB made 1049 chunks,
// and an upload of tens of megabytes from an HTTP body stalled nats.go's 4000 unacknowledged publishes.
func TestObjectPutsFillTheirChunks(t *testing.T) {
	c := provisioned(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cps, err := c.Checkpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}

	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB: eight chunks of 128 KiB
	const wantChunks = 8
	if n, err := c.Outputs().PutOutput(ctx, "upload/x", smallReads{bytes.NewReader(data), 1000}); err != nil || n != int64(len(data)) {
		t.Fatalf("PutOutput: %d bytes, %v; want %d", n, err, len(data))
	}
	info, err := c.Outputs().store.GetInfo(ctx, "upload/x")
	if err != nil {
		t.Fatal(err)
	}
	if info.Chunks != wantChunks {
		t.Errorf("output stored in %d chunks, want %d of the store's chunk size", info.Chunks, wantChunks)
	}
	got, err := c.Outputs().ReadOutput(ctx, "upload/x", 0, -1)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadOutput: %d bytes, %v; want the %d bytes put", len(got), err, len(data))
	}

	if err := cps.Put(ctx, "t/chunks/x", iotest.HalfReader(smallReads{bytes.NewReader(data), 3000})); err != nil {
		t.Fatal(err)
	}
	info, err = cps.store.GetInfo(ctx, "t/chunks/x")
	if err != nil {
		t.Fatal(err)
	}
	if info.Chunks != wantChunks {
		t.Errorf("checkpoint object stored in %d chunks, want %d", info.Chunks, wantChunks)
	}
}

// TestFullReadsKeepsWhatPrecedesAnError: a reader's error is returned after the bytes read before it,
// never instead of them, and then on every Read.
func TestFullReadsKeepsWhatPrecedesAnError(t *testing.T) {
	r := fullReads(io.MultiReader(bytes.NewReader([]byte("abc")), iotest.ErrReader(io.ErrClosedPipe)))
	p := make([]byte, 8)
	if n, err := r.Read(p); n != 3 || err != nil || string(p[:n]) != "abc" {
		t.Fatalf("first Read: %d %q %v, want the 3 bytes and no error", n, p[:n], err)
	}
	for range 2 {
		if n, err := r.Read(p); n != 0 || err != io.ErrClosedPipe {
			t.Fatalf("Read after: %d %v, want the reader's error", n, err)
		}
	}
	r = fullReads(bytes.NewReader(nil))
	if n, err := r.Read(p); n != 0 || err != io.EOF {
		t.Fatalf("empty: %d %v, want EOF", n, err)
	}
}
