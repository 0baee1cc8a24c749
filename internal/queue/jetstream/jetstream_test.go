package jetstream_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
)

func connect(t *testing.T) *jetstream.Conn {
	t.Helper()
	return connectWith(t, func(*jetstream.Config) {})
}

func connectWith(t *testing.T, edit func(*jetstream.Config)) *jetstream.Conn {
	t.Helper()
	c, _ := jstest.Provisioned(t, edit)
	return c
}

func TestRecordCompareAndSet(t *testing.T) {
	c := connect(t)
	ctx := context.Background()
	r := &call.Result{ID: call.NewID(), Tenant: "t", Status: call.StatusQueued}
	rev, err := c.Records().Create(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Records().Create(ctx, r); !errors.Is(err, queue.ErrExists) {
		t.Fatalf("second Create: %v, want ErrExists", err)
	}
	r.Status = call.StatusRunning
	if _, err := c.Records().Update(ctx, r, rev); err != nil {
		t.Fatalf("Update at current revision: %v", err)
	}
	if _, err := c.Records().Update(ctx, r, rev); !errors.Is(err, queue.ErrConflict) {
		t.Fatalf("Update at stale revision: %v, want ErrConflict", err)
	}
	if _, err := c.Records().Get(ctx, "c_missing"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("Get missing: %v, want ErrNotFound", err)
	}
	got, err := c.Records().Get(ctx, r.ID)
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
		if _, err := c.Records().Create(ctx, call.NewResult(cl, call.StatusQueued)); err != nil {
			t.Fatal(err)
		}
		if err := c.Calls().Publish(ctx, cl); err != nil {
			t.Fatal(err)
		}
		if err := c.Calls().Publish(ctx, cl); err != nil { // a retried publish is deduplicated
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	seen := map[string]int{}
	running, maxRunning := 0, 0
	consumeCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- c.Calls().Consume(consumeCtx, 3, func(ctx context.Context, d queue.Delivery) {
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
			rec, err := c.Records().Get(ctx, cl.ID)
			if err != nil {
				t.Error(err)
				return
			}
			rec.Result.Status = call.StatusOK
			// The test stops consuming once every Wait saw its call final, which can be before this
			// Update's reply arrives: the write must not end with the consumer's context.
			if _, err := c.Records().Update(context.WithoutCancel(ctx), rec.Result, rec.Revision); err != nil {
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
		r, err := c.Records().Wait(ctx, id, func(r *call.Result) bool { return r.Status.Terminal() })
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
	st, err := c.Calls().State(ctx)
	if err != nil || st.Pending != 0 {
		t.Errorf("queue state after draining: %+v %v", st, err)
	}
}

// TestFairAcrossTenants: a tenant that floods the queue does not starve one of another lane that sends a
// little later.
func TestFairAcrossTenants(t *testing.T) {
	c := connect(t)
	if jetstream.LaneOf("flood", 16) == jetstream.LaneOf("small", 16) {
		t.Fatal("the test's tenants share a lane: pick names in different lanes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	publish := func(tenant string) string {
		cl := &call.Call{ID: call.NewID(), Tenant: tenant, Tool: "run_shell"}
		if err := c.Calls().Publish(ctx, cl); err != nil {
			t.Fatal(err)
		}
		return cl.ID
	}
	for range 40 {
		publish("flood")
	}
	small := map[string]bool{publish("small"): true, publish("small"): true}
	var mu sync.Mutex
	var order []string
	consumeCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- c.Calls().Consume(consumeCtx, 1, func(ctx context.Context, d queue.Delivery) {
			cl, _ := d.Call()
			mu.Lock()
			order = append(order, cl.Tenant+":"+cl.ID)
			n := len(order)
			mu.Unlock()
			d.Ack(context.WithoutCancel(ctx))
			if n == 42 {
				stop()
			}
		})
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	seenSmall := 0
	for i, o := range order {
		if tenant, id, _ := strings.Cut(o, ":"); tenant == "small" && small[id] {
			seenSmall++
			if i > 5 {
				t.Errorf("small tenant's call served at position %d of %d: starved by the flood", i, len(order))
			}
		}
	}
	if seenSmall != 2 || len(order) != 42 {
		t.Fatalf("served %d calls, %d of the small tenant's", len(order), seenSmall)
	}
}

// TestTenantQuota: the server refuses a tenant's call past its cap, and only that tenant's.
func TestTenantQuota(t *testing.T) {
	c := connectWith(t, func(cfg *jetstream.Config) { cfg.MaxPendingPerTenant = 3 })
	ctx := context.Background()
	for i := range 3 {
		if err := c.Calls().Publish(ctx, &call.Call{ID: call.NewID(), Tenant: "busy"}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if err := c.Calls().Publish(ctx, &call.Call{ID: call.NewID(), Tenant: "busy"}); !errors.Is(err, queue.ErrTenantFull) {
		t.Fatalf("fourth publish: %v, want ErrTenantFull", err)
	}
	if err := c.Calls().Publish(ctx, &call.Call{ID: call.NewID(), Tenant: "other"}); err != nil {
		t.Fatalf("another tenant's publish: %v", err)
	}
}

// TestStateCountsOnlyWaitingCalls: a delivered (running) call is not queue depth; waiting ones are, with
// the oldest one's age.
func TestStateCountsOnlyWaitingCalls(t *testing.T) {
	c := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 3 {
		if err := c.Calls().Publish(ctx, &call.Call{ID: call.NewID(), Tenant: "t1"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Calls().Publish(ctx, &call.Call{ID: call.NewID(), Tenant: "t2"}); err != nil {
		t.Fatal(err)
	}
	// A consumer's pending count follows the stream's new messages asynchronously, a moment after the
	// publish is acknowledged: State is a gauge, eventually exact.
	stateReaches := func(what string, pending uint64) jetstream.QueueState {
		t.Helper()
		var st jetstream.QueueState
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if st, err = c.Calls().State(ctx); err == nil && st.Pending == pending {
				return st
			}
		}
		t.Fatalf("%s: %+v %v, want %d pending", what, st, err, pending)
		return st
	}
	st := stateReaches("before consuming", 4)
	if st.OldestAge <= 0 {
		t.Fatalf("before consuming: %+v, want the oldest call's age", st)
	}
	// Per lane: t1's three in its lane, t2's one in its own (or with t1's when they share one).
	lanes := jetstream.DefaultConfig().Lanes
	want := make([]uint64, lanes)
	want[jetstream.LaneOf("t1", lanes)] += 3
	want[jetstream.LaneOf("t2", lanes)]++
	if !slices.Equal(st.Lanes, want) {
		t.Fatalf("before consuming: lanes %v, want %v", st.Lanes, want)
	}
	// Take one call and hold it unacked: it is running, no longer waiting.
	got := make(chan struct{})
	release := make(chan struct{})
	consumeCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- c.Calls().Consume(consumeCtx, 1, func(ctx context.Context, d queue.Delivery) {
			close(got)
			<-release
			d.Ack(context.WithoutCancel(ctx))
		})
	}()
	<-got
	stateReaches("with one running", 3)
	stop()
	close(release)
	<-done
}
