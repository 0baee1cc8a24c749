package jetstream

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
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

// timedGets is the real records bucket, noting when each Get starts.
type timedGets struct {
	jetstream.KeyValue
	mu     sync.Mutex
	starts []time.Time
}

func (kv *timedGets) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	kv.mu.Lock()
	kv.starts = append(kv.starts, time.Now())
	kv.mu.Unlock()
	return kv.KeyValue.Get(ctx, key)
}

// TestWaitRereadsOnItsSchedule: with no update, Wait reads the record once, again after each of
// waitRereads in turn, then every waitPoll, no sooner: the k-th read after the first comes at least the
// sum of the first k delays after it (a timer never fires early, so this holds on any machine).
func TestWaitRereadsOnItsSchedule(t *testing.T) {
	c := provisioned(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Records().Create(ctx, &call.Result{ID: "c_idle", Tenant: "t", Status: call.StatusQueued}); err != nil {
		t.Fatal(err)
	}
	kv := &timedGets{KeyValue: c.records.kv}
	records := &Records{session: c.session, kv: kv}
	// The schedule waitRereads and waitPoll document, written out: a test that read it from them would
	// follow them wherever they went.
	schedule := []time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second}
	var total time.Duration
	for _, d := range schedule {
		total += d
	}
	wctx, stop := context.WithTimeout(ctx, total+waitPoll/2)
	defer stop()
	if _, err := records.Wait(wctx, "c_idle", func(*call.Result) bool { return false }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want its ctx's deadline", err)
	}
	kv.mu.Lock()
	starts := slices.Clone(kv.starts)
	kv.mu.Unlock()
	if len(starts) > len(schedule)+1 {
		t.Errorf("%d reads in %s, want at most %d (one, then one per delay of %v)", len(starts), total+waitPoll/2, len(schedule)+1, schedule)
	}
	var due time.Duration
	for k := 1; k < len(starts) && k <= len(schedule); k++ {
		due += schedule[k-1]
		if at := starts[k].Sub(starts[0]); at < due {
			t.Errorf("read %d came %s after the first, want at least %s (the delays %v)", k, at, due, schedule[:k])
		}
	}
	if len(starts) < len(schedule) {
		t.Errorf("%d reads in %s, want the first and one after each delay but the last", len(starts), total+waitPoll/2)
	}
}
