package jetstream

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/queue"
)

// The tests in this file kill the mutants `make mutants` found surviving in the lease, record and output
// code (the baseline, scripts/mutants-baseline.txt, names each), and the classes behind them.

// provisioned starts an in-process server and returns a connection with the streams and buckets made.
func provisioned(t *testing.T) *Conn {
	t.Helper()
	srv, err := StartEmbedded(EmbeddedConfig{Listen: "127.0.0.1:-1", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	cfg := DefaultConfig()
	cfg.URL, cfg.Provision = srv.URL(), true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// lostCreateReply is the real leases bucket, except that the reply to a Create the server applied is
// lost on the way back, as when the connection drops with it in flight: Create stores the key and
// returns a timeout.
type lostCreateReply struct{ jetstream.KeyValue }

func (kv lostCreateReply) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if _, err := kv.KeyValue.Create(ctx, key, value, opts...); err != nil {
		return 0, err
	}
	return 0, nats.ErrTimeout
}

// TestAcquireLeaseAfterALostReply: a lease whose create was applied but whose reply was lost is the
// acquirer's own, at the revision the server stored: it renews, is held, and releases. Another holder's
// lease found that way is still refused.
func TestAcquireLeaseAfterALostReply(t *testing.T) {
	c := provisioned(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leases := &Leases{session: c.session, kv: lostCreateReply{c.leases.kv}}

	l, err := leases.AcquireLease(ctx, "c_lost", "w1", 30*time.Second)
	if err != nil {
		t.Fatalf("acquire with the reply lost: %v, want the lease its create stored", err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("renew after the lost reply: %v (the lease must carry the stored revision)", err)
	}
	if held, err := leases.LeaseHeld(ctx, "c_lost"); err != nil || !held {
		t.Fatalf("LeaseHeld = %v, %v; want true", held, err)
	}
	if _, err := leases.AcquireLease(ctx, "c_lost", "w2", 30*time.Second); !errors.Is(err, queue.ErrExists) {
		t.Fatalf("another holder's acquire = %v, want queue.ErrExists", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if held, err := leases.LeaseHeld(ctx, "c_lost"); err != nil || held {
		t.Fatalf("LeaseHeld after release = %v, %v; want false", held, err)
	}
}

// failingReader yields some bytes, then fails.
type failingReader struct {
	sent bool
	err  error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if !r.sent {
		r.sent = true
		return copy(p, "some bytes"), nil
	}
	return 0, r.err
}

// TestPutOutputSaysWhyItFailed: a put that fails says why, wrapped: the reader's error while ctx lives,
// ctx's own error (its deadline, not the cancellation of the put's inner context) once ctx ended.
func TestPutOutputSaysWhyItFailed(t *testing.T) {
	c := provisioned(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	broken := errors.New("the tool's pipe broke")
	if _, err := c.Outputs().PutOutput(ctx, "c_put-stdout", &failingReader{err: broken}); !errors.Is(err, broken) {
		t.Errorf("put from a failing reader = %v, want it to wrap %v", err, broken)
	}
	expired, stop := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer stop()
	_, err := c.Outputs().PutOutput(expired, "c_put-stdout", &failingReader{err: io.EOF})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("put under an expired ctx = %v, want it to wrap context.DeadlineExceeded", err)
	}
}

// TestReadOutputLimits: ReadOutput reads limit bytes from offset, none for a limit of 0, and to the end for
// a negative limit.
func TestReadOutputLimits(t *testing.T) {
	c := provisioned(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Outputs().PutOutput(ctx, "c_lim-stdout", strings.NewReader("0123456789")); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		offset, limit int64
		want          string
	}{
		{0, 0, ""}, {3, 0, ""}, {0, 1, "0"}, {3, 4, "3456"}, {8, 5, "89"}, {0, -1, "0123456789"}, {7, -1, "789"}, {10, -1, ""},
	} {
		got, err := c.Outputs().ReadOutput(ctx, "c_lim-stdout", tt.offset, tt.limit)
		if err != nil || string(got) != tt.want {
			t.Errorf("ReadOutput(offset %d, limit %d) = %q, %v; want %q", tt.offset, tt.limit, got, err, tt.want)
		}
	}
}

// countingGets is the real object store, counting its Gets.
type countingGets struct {
	jetstream.ObjectStore
	gets atomic.Int64
}

func (s *countingGets) Get(ctx context.Context, name string, opts ...jetstream.GetObjectOpt) (jetstream.ObjectResult, error) {
	s.gets.Add(1)
	return s.ObjectStore.Get(ctx, name, opts...)
}

// TestOpenOutputBacksOff: looking again for an object it did not find, openOutput waits longer each time
// (from 10 ms, doubling up to 250 ms) over outputLag, rather than asking the server in a loop.
func TestOpenOutputBacksOff(t *testing.T) {
	c := provisioned(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store := &countingGets{ObjectStore: c.outputs.store}
	outputs := &Outputs{session: c.session, store: store}
	start := time.Now()
	if _, err := outputs.OpenOutput(ctx, "c_never-stdout", 0); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("open a missing object = %v, want queue.ErrNotFound", err)
	}
	took := time.Since(start)
	// 10, 20, 40, 80, 160 ms, then 250 ms while the next wait ends before outputLag (2 s): at most 13
	// gets, the first included; fewer when the machine is slow.
	if n := store.gets.Load(); n > 13 || n < 2 {
		t.Errorf("%d gets of a missing object in %s, want 2 to 13", n, took)
	}
	if took < outputLag-300*time.Millisecond {
		t.Errorf("gave up after %s, want about outputLag (%s)", took, outputLag)
	}
}
