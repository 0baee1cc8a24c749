package jetstream_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
)

// pollUntil polls cond every 50ms until it holds, failing the test after within.
func pollUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLeaseLapsesOnServerClock: a lease lives while it is renewed and the server removes it a TTL after
// the last renewal; its holder's renewal then fails, and another holder can take it.
func TestLeaseLapsesOnServerClock(t *testing.T) {
	c := connect(t)
	ctx := context.Background()
	l, err := c.Leases().AcquireLease(ctx, "c_lease", "w1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Leases().AcquireLease(ctx, "c_lease", "w2", time.Second); !errors.Is(err, queue.ErrExists) {
		t.Fatalf("second acquire: %v, want ErrExists", err)
	}
	// Renewed for three TTLs, it stays held.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		if err := l.Renew(ctx); err != nil {
			t.Fatalf("renew: %v", err)
		}
		if held, err := c.Leases().LeaseHeld(ctx, "c_lease"); err != nil || !held {
			t.Fatalf("renewed lease not held: %v %v", held, err)
		}
	}
	// Left alone, the server removes it.
	pollUntil(t, 10*time.Second, "the lease to lapse", func() bool {
		held, err := c.Leases().LeaseHeld(ctx, "c_lease")
		return err == nil && !held
	})
	if err := l.Renew(ctx); !errors.Is(err, queue.ErrConflict) {
		t.Fatalf("renew after lapse: %v, want ErrConflict", err)
	}
	l2, err := c.Leases().AcquireLease(ctx, "c_lease", "w2", time.Second)
	if err != nil {
		t.Fatalf("acquire after lapse: %v", err)
	}
	if err := l.Release(ctx); err != nil { // the old holder's release must not remove the new lease
		t.Fatal(err)
	}
	if held, _ := c.Leases().LeaseHeld(ctx, "c_lease"); !held {
		t.Fatal("the old holder's release removed the new holder's lease")
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if held, _ := c.Leases().LeaseHeld(ctx, "c_lease"); held {
		t.Fatal("released lease still held")
	}
}

// TestOutputStore: a large output with NUL bytes goes into the object store whole and comes back whole
// and by range.
func TestOutputStore(t *testing.T) {
	c := connect(t)
	ctx := context.Background()
	data := bytes.Repeat([]byte("ab\x00cd"), 1<<20) // 5 MiB
	name := queue.OutputName("c_out", 7, "stdout")
	n, err := c.Outputs().PutOutput(ctx, name, bytes.NewReader(data))
	if err != nil || n != int64(len(data)) {
		t.Fatalf("put: %d %v", n, err)
	}
	all, err := c.Outputs().ReadOutput(ctx, name, 0, -1)
	if err != nil || !bytes.Equal(all, data) {
		t.Fatalf("read all: %d bytes, %v", len(all), err)
	}
	part, err := c.Outputs().ReadOutput(ctx, name, 3_000_001, 10)
	if err != nil || !bytes.Equal(part, data[3_000_001:3_000_011]) {
		t.Fatalf("read range: %q %v", part, err)
	}
	if err := c.Outputs().DeleteOutput(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Outputs().ReadOutput(ctx, name, 0, -1); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("read deleted: %v, want ErrNotFound", err)
	}
}

// TestPublishTooLarge: a call that cannot fit one message is refused before it reaches the server.
func TestPublishTooLarge(t *testing.T) {
	c := connect(t)
	args, _ := json.Marshal(map[string]string{"content": strings.Repeat("x", 1<<20)})
	err := c.Calls().Publish(context.Background(), &call.Call{ID: call.NewID(), Tenant: "t", Args: args})
	if !errors.Is(err, queue.ErrTooLarge) {
		t.Fatalf("publish of 1 MiB of arguments: %v, want ErrTooLarge", err)
	}
}

// TestUpdateStateConcurrently: writers that change the same blob at once never lose a change.
func TestUpdateStateConcurrently(t *testing.T) {
	c := connect(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.SharedState().UpdateState(ctx, "list", func(old []byte) ([]byte, error) {
				var items []string
				if old != nil {
					if err := json.Unmarshal(old, &items); err != nil {
						return nil, err
					}
				}
				return json.Marshal(append(items, fmt.Sprint(i)))
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	got := make(chan []byte, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := c.SharedState().WatchState(wctx, "list", func(b []byte) {
		select {
		case got <- b:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	var items []string
	json.Unmarshal(<-got, &items)
	if len(items) != 16 {
		t.Fatalf("%d of 16 changes kept: %v", len(items), items)
	}
}

// TestServerClock: a client whose own clock is off by an hour still reads the server's time.
func TestServerClock(t *testing.T) {
	skewed := func() time.Time { return time.Now().Add(time.Hour) }
	c, _ := jstest.Provisioned(t, nil, jetstream.WithLocalClock(skewed))
	if off := c.Now().Sub(time.Now()); off > 2*time.Second || off < -2*time.Second {
		t.Fatalf("the server's time is %s from the real one", off)
	}
}

// TestExhaustedAndStale: a call the queue stops delivering is reported once its advisory arrives, offered
// again while the reconciler says it is not settled, and removable; waiting and delivered calls are
// reported by age.
func TestExhaustedAndStale(t *testing.T) {
	c := connectWith(t, func(cfg *jetstream.Config) { cfg.MaxDeliver, cfg.AckWait = 3, time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	waiting := &call.Call{ID: call.NewID(), Tenant: "idle"}
	if err := c.Calls().Publish(ctx, waiting); err != nil {
		t.Fatal(err)
	}
	var seen []queue.Stuck
	collect := func(_ context.Context, s queue.Stuck) { seen = append(seen, s) }
	if err := c.Backlog().Stale(ctx, time.Hour, time.Hour, collect); err != nil || len(seen) != 0 {
		t.Fatalf("young calls reported stale: %+v %v", seen, err)
	}
	if err := c.Backlog().Stale(ctx, time.Hour, 0, collect); err != nil || len(seen) != 1 || seen[0].Call.ID != waiting.ID || seen[0].Delivered {
		t.Fatalf("waiting call: %+v %v", seen, err)
	}

	bounced := &call.Call{ID: call.NewID(), Tenant: "bounce"}
	if err := c.Calls().Publish(ctx, bounced); err != nil {
		t.Fatal(err)
	}
	consumeCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	var mu sync.Mutex
	deliveries := 0
	go func() {
		done <- c.Calls().Consume(consumeCtx, 2, func(ctx context.Context, d queue.Delivery) {
			cl, _ := d.Call()
			if cl.ID == waiting.ID {
				return // held unsettled: delivered, in flight
			}
			mu.Lock()
			deliveries++
			mu.Unlock()
			d.Nak(ctx, 0)
		})
	}()
	var offered []queue.Stuck
	pollUntil(t, 30*time.Second, "the max-deliveries advisory", func() bool {
		err := c.Backlog().Exhausted(ctx, 10, 100*time.Millisecond, func(_ context.Context, s queue.Stuck) bool {
			offered = append(offered, s)
			return len(offered) > 1 // settled the second time it is offered
		})
		if err != nil {
			t.Log(err)
		}
		return len(offered) >= 2
	})
	stop()
	<-done
	if offered[0].Call == nil || offered[0].Call.ID != bounced.ID || !offered[0].Exhausted || offered[0].Deliveries != 3 || offered[1].Seq != offered[0].Seq {
		t.Fatalf("offered %+v", offered)
	}
	mu.Lock()
	if deliveries != 3 {
		t.Errorf("delivered %d times with max_deliver 3", deliveries)
	}
	mu.Unlock()
	seen = nil
	if err := c.Backlog().Stale(ctx, 0, time.Hour, collect); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(seen, func(s queue.Stuck) bool { return s.Call.ID == waiting.ID && s.Delivered }) {
		t.Fatalf("the delivered call was not reported in flight: %+v", seen)
	}
	if err := c.Backlog().Remove(ctx, offered[0].Seq); err != nil {
		t.Fatal(err)
	}
	if err := c.Backlog().Remove(ctx, offered[0].Seq); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	// Removed, it frees the tenant's quota and no longer counts as queued.
	if err := c.Backlog().Exhausted(ctx, 10, time.Second, func(context.Context, queue.Stuck) bool {
		t.Error("an advisory was offered again after it was settled")
		return true
	}); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseLapsedButNotRemoved: a lease whose last write is older than its TTL, by the server's clock, is
// gone for readers even while the server still keeps it, and the next holder takes it over.
func TestLeaseLapsedButNotRemoved(t *testing.T) {
	c, url := jstest.Provisioned(t, nil)
	ctx := context.Background()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := natsjs.New(nc)
	kv, err := js.KeyValue(ctx, jetstream.DefaultConfig().Bucket+"_leases")
	if err != nil {
		t.Fatal(err)
	}
	// Says one second, kept an hour: as if the server had not acted on its TTL.
	if _, err := kv.Create(ctx, "c_stuck", []byte("w0 token 1000000000"), natsjs.KeyTTL(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if held, err := c.Leases().LeaseHeld(ctx, "c_stuck"); err != nil || !held {
		t.Fatalf("fresh lease: held %v, %v", held, err)
	}
	pollUntil(t, 10*time.Second, "the lease to count as lapsed", func() bool {
		held, err := c.Leases().LeaseHeld(ctx, "c_stuck")
		return err == nil && !held
	})
	l, err := c.Leases().AcquireLease(ctx, "c_stuck", "w1", time.Minute)
	if err != nil {
		t.Fatalf("take over a lapsed lease: %v", err)
	}
	if held, _ := c.Leases().LeaseHeld(ctx, "c_stuck"); !held {
		t.Fatal("the new holder's lease is not held")
	}
	if _, err := c.Leases().AcquireLease(ctx, "c_stuck", "w2", time.Minute); !errors.Is(err, queue.ErrExists) {
		t.Fatalf("a third holder: %v, want ErrExists", err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("the new holder renews: %v", err)
	}
}
