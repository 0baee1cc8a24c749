package dispatcher

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
	"github.com/toolpool/toolpool/internal/tools"
)

// reconcilerOn starts an in-process JetStream (max deliver 3, ack wait 1s, one call per tenant) and a
// Reconciler on it with the real queue as store, backlog, leases, approvals and publisher.
func reconcilerOn(t *testing.T) (*Reconciler, *jetstream.Conn) {
	t.Helper()
	conn, _ := jstest.Provisioned(t, func(cfg *jetstream.Config) {
		cfg.MaxDeliver, cfg.AckWait, cfg.MaxPendingPerTenant = 3, time.Second, 1
	})
	reg, err := tools.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewReconciler(ReconcilerConfig{Interval: time.Second, InFlightAge: time.Hour, WaitingAge: time.Nanosecond, Grace: time.Nanosecond},
		ReconcilerDeps{Store: conn.Records(), Backlog: conn.Backlog(), LeaseHeld: conn.Leases().LeaseHeld, Approvals: conn.Approvals(),
			Publisher: conn.Calls(), Tools: reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: conn.Now})
	if err != nil {
		t.Fatal(err)
	}
	return r, conn
}

// exhaust publishes c and naks every delivery of it until the queue gives up on it (its advisory is in).
func exhaust(t *testing.T, conn *jetstream.Conn, c *call.Call) {
	t.Helper()
	if err := conn.Calls().Publish(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	delivered := make(chan uint64, 8)
	done := make(chan error)
	go func() {
		done <- conn.Calls().Consume(ctx, 1, func(ctx context.Context, d queue.Delivery) {
			delivered <- d.Attempt()
			d.Nak(ctx, 0)
		})
	}()
	for a := range delivered {
		if a == 3 {
			break
		}
	}
	// The server sends the advisory when it would deliver the call a fourth time, which it only does for
	// a pending fetch: keep fetching until the advisory can be read (offered, and put back at once).
	deadline := time.Now().Add(30 * time.Second)
	for in := false; !in; {
		if err := conn.Backlog().Exhausted(context.Background(), 10, 0, func(_ context.Context, q queue.Stuck) bool {
			in = in || (q.Call != nil && q.Call.ID == c.ID)
			return false
		}); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no max-deliveries advisory for call %s after 30s", c.ID)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	<-done
}

// TestReconcileExhaustedRunningCall: a running call whose deliveries ran out is left while its lease is
// held (its runner records it), and ends lost once the lease is gone; its message is removed, which
// frees its tenant's one quota slot.
func TestReconcileExhaustedRunningCall(t *testing.T) {
	r, conn := reconcilerOn(t)
	ctx := context.Background()
	c := &call.Call{ID: call.NewID(), Tenant: "t", Tool: "run_shell", CreatedAt: conn.Now(), Deadline: conn.Now().Add(time.Hour)}
	res := call.NewResult(c, call.StatusRunning)
	res.Worker = "w0"
	if _, err := conn.Records().Create(ctx, res); err != nil {
		t.Fatal(err)
	}
	lease, err := conn.Leases().AcquireLease(ctx, c.ID, "w0", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	exhaust(t, conn, c)
	settledWhile := func() call.Status {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if err := r.Pass(ctx); err != nil {
				t.Fatal(err)
			}
			rec, _ := conn.Records().Get(ctx, c.ID)
			if rec.Result.Status != call.StatusRunning || time.Now().After(deadline) {
				return rec.Result.Status
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// While the lease is held, passes leave the call alone (the advisory comes back).
	for range 3 {
		if err := r.Pass(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if rec, _ := conn.Records().Get(ctx, c.ID); rec.Result.Status != call.StatusRunning {
		t.Fatalf("a call whose runner holds its lease was settled: %s", rec.Result.Status)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st := settledWhile(); st != call.StatusLost {
		t.Fatalf("after the lease lapsed: %s, want lost", st)
	}
	rec, _ := conn.Records().Get(ctx, c.ID)
	if rec.Result.Error == nil || rec.Result.Error.Type != call.ErrLost {
		t.Fatalf("error %+v", rec.Result.Error)
	}
	if err := conn.Calls().Publish(ctx, &call.Call{ID: call.NewID(), Tenant: "t"}); err != nil {
		t.Fatalf("the tenant's quota slot was not freed: %v", err)
	}
}

// TestReconcileWaitingPastDeadline: a queued call no worker took before its deadline ends expired, and a
// queued call that was never recorded (its dispatcher stopped) is recorded expired.
func TestReconcileWaitingPastDeadline(t *testing.T) {
	r, conn := reconcilerOn(t)
	ctx := context.Background()
	past := conn.Now().Add(-time.Minute)
	recorded := &call.Call{ID: call.NewID(), Tenant: "a", Tool: "run_shell", CreatedAt: past, Deadline: past}
	unrecorded := &call.Call{ID: call.NewID(), Tenant: "b", Tool: "run_shell", CreatedAt: past, Deadline: past}
	if _, err := conn.Records().Create(ctx, call.NewResult(recorded, call.StatusQueued)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*call.Call{recorded, unrecorded} {
		if err := conn.Calls().Publish(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*call.Call{recorded, unrecorded} {
		rec, err := conn.Records().Get(ctx, c.ID)
		if err != nil || rec.Result.Status != call.StatusExpired {
			t.Fatalf("call of tenant %s: %+v %v, want expired", c.Tenant, rec.Result, err)
		}
		if err := conn.Calls().Publish(ctx, &call.Call{ID: call.NewID(), Tenant: c.Tenant}); err != nil {
			t.Fatalf("tenant %s's quota slot was not freed: %v", c.Tenant, err)
		}
	}
}

// TestReconcileApprovals: an approved call whose dispatcher stopped before queueing it is queued, and a
// parked approval that was never recorded (never accepted) is dropped.
func TestReconcileApprovals(t *testing.T) {
	r, conn := reconcilerOn(t)
	ctx := context.Background()
	approved := &call.Call{ID: call.NewID(), Tenant: "t", Tool: "run_shell", CreatedAt: conn.Now(), Deadline: conn.Now().Add(time.Hour)}
	orphan := &call.Call{ID: call.NewID(), Tenant: "t", Tool: "run_shell", CreatedAt: conn.Now().Add(-time.Minute)}
	for _, c := range []*call.Call{approved, orphan} {
		if err := conn.Approvals().PutPending(ctx, &call.Pending{Call: c, ExpiresAt: c.CreatedAt.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Records().Create(ctx, call.NewResult(approved, call.StatusQueued)); err != nil { // approved, never published
		t.Fatal(err)
	}
	if err := r.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*call.Call{approved, orphan} {
		if _, err := conn.Approvals().GetPending(ctx, c.Tenant, c.ID); !errors.Is(err, queue.ErrNotFound) {
			t.Errorf("parked call %s still parked: %v", c.ID, err)
		}
	}
	got := make(chan string, 1)
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	go conn.Calls().Consume(cctx, 1, func(ctx context.Context, d queue.Delivery) {
		c, _ := d.Call()
		d.Ack(ctx)
		got <- c.ID
	})
	select {
	case id := <-got:
		if id != approved.ID {
			t.Fatalf("queued %s, want the approved call", id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the approved call was not queued")
	}
}
