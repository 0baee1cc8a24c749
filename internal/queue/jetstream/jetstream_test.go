package jetstream_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
)

func connect(t *testing.T) *jetstream.Conn {
	t.Helper()
	srv, err := jetstream.StartEmbedded(jetstream.EmbeddedConfig{Listen: "127.0.0.1:-1", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	cfg := jetstream.DefaultConfig()
	cfg.URL = srv.URL()
	c, err := jetstream.Connect(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestRecordCompareAndSet(t *testing.T) {
	c := connect(t)
	ctx := context.Background()
	r := &call.Result{ID: call.NewID(), Tenant: "t", Status: call.StatusQueued}
	rev, err := c.Create(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, r); !errors.Is(err, queue.ErrExists) {
		t.Fatalf("second Create: %v, want ErrExists", err)
	}
	r.Status = call.StatusRunning
	if _, err := c.Update(ctx, r, rev); err != nil {
		t.Fatalf("Update at current revision: %v", err)
	}
	if _, err := c.Update(ctx, r, rev); !errors.Is(err, queue.ErrConflict) {
		t.Fatalf("Update at stale revision: %v, want ErrConflict", err)
	}
	if _, err := c.Get(ctx, "c_missing"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("Get missing: %v, want ErrNotFound", err)
	}
	got, err := c.Get(ctx, r.ID)
	if err != nil || got.Result.Status != call.StatusRunning {
		t.Fatalf("Get: %+v %v", got, err)
	}
}

func TestPublishConsumeWait(t *testing.T) {
	c := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 20
	ids := map[string]bool{}
	for range n {
		cl := &call.Call{ID: call.NewID(), Tenant: "t1", Tool: "run_shell"}
		ids[cl.ID] = true
		if _, err := c.Create(ctx, call.NewResult(cl, call.StatusQueued)); err != nil {
			t.Fatal(err)
		}
		if err := c.Publish(ctx, cl); err != nil {
			t.Fatal(err)
		}
		if err := c.Publish(ctx, cl); err != nil { // a retried publish is deduplicated
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	seen := map[string]int{}
	running, maxRunning := 0, 0
	consumeCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- c.Consume(consumeCtx, 3, func(ctx context.Context, d queue.Delivery) {
			cl, err := d.Call()
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			seen[cl.ID]++
			running++
			maxRunning = max(maxRunning, running)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			rec, err := c.Get(ctx, cl.ID)
			if err != nil {
				t.Error(err)
				return
			}
			rec.Result.Status = call.StatusOK
			if _, err := c.Update(ctx, rec.Result, rec.Revision); err != nil {
				t.Error(err)
			}
			mu.Lock()
			running--
			mu.Unlock()
			if err := d.Ack(context.WithoutCancel(ctx)); err != nil {
				t.Error(err)
			}
		})
	}()
	for id := range ids {
		r, err := c.Wait(ctx, id, func(r *call.Result) bool { return r.Status.Terminal() })
		if err != nil || r.Status != call.StatusOK {
			t.Fatalf("Wait %s: %+v %v", id, r, err)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for id := range ids {
		if seen[id] != 1 {
			t.Errorf("call %s handled %d times", id, seen[id])
		}
	}
	if maxRunning > 3 {
		t.Errorf("%d calls ran at once with 3 slots", maxRunning)
	}
	st, err := c.State(ctx)
	if err != nil || st.Pending != 0 {
		t.Errorf("queue state after draining: %+v %v", st, err)
	}
}
