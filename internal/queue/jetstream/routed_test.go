package jetstream_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
)

// takenBy records which worker took each call, acking it, or (hold) leaving it unsettled as a worker that
// dies while the call runs.
type takenBy struct {
	mu sync.Mutex
	by map[string][]string // call id -> workers that took it, in order
}

func (tb *takenBy) handler(worker string, hold bool) func(context.Context, queue.Delivery) {
	return func(ctx context.Context, d queue.Delivery) {
		c, err := d.Call()
		if err != nil {
			panic(err)
		}
		tb.mu.Lock()
		if tb.by == nil {
			tb.by = map[string][]string{}
		}
		tb.by[c.ID] = append(tb.by[c.ID], worker)
		tb.mu.Unlock()
		if hold {
			return
		}
		_ = d.Ack(context.WithoutCancel(ctx))
	}
}

func (tb *takenBy) get(id string) []string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return append([]string(nil), tb.by[id]...)
}

// waitTaken polls until call id was taken n times, and returns by whom.
func (tb *takenBy) waitTaken(t *testing.T, id string, n int, within time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if by := tb.get(id); len(by) >= n {
			return by
		}
		if time.Now().After(deadline) {
			t.Fatalf("call %s taken %v after %s; want %d takings", id, tb.get(id), within, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// consumeAs runs worker's WorkerCalls on conn until the returned stop is called, which waits for it.
func consumeAs(t *testing.T, conn *jetstream.Conn, worker string, presence time.Duration, handle func(context.Context, queue.Delivery)) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- conn.WorkerCalls(worker, presence).Consume(ctx, 4, handle) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("consume as %s: %v", worker, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitAlive polls until worker's presence is want.
func waitAlive(t *testing.T, r queue.Residents, worker string, want bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		alive, err := r.Alive(ctx, worker)
		if err == nil && alive == want {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("worker %s alive = %v, %v; want %v", worker, alive, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestResidents: a workspace's resident is recorded and read back per tenant and workspace (names that
// are not valid key tokens included); a worker is alive while it consumes its calls, and not once it
// stopped (withdrawn at once) or was never seen.
func TestResidents(t *testing.T) {
	disp, url := jstest.Provisioned(t, nil)
	w := jstest.Connect(t, url, "worker-a", false)
	r := disp.Residents()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if got, err := r.ResidentOf(ctx, "t.1", "ws..x"); err != nil || got != "" {
		t.Fatalf("ResidentOf before any = %q, %v; want none", got, err)
	}
	if err := w.Residents().SetResident(ctx, "t.1", "ws..x", "worker-a"); err != nil {
		t.Fatal(err)
	}
	if err := w.Residents().SetResident(ctx, "t", "1.ws..x", "worker-b"); err != nil {
		t.Fatal(err)
	}
	if got, err := r.ResidentOf(ctx, "t.1", "ws..x"); err != nil || got != "worker-a" {
		t.Fatalf("ResidentOf = %q, %v; want worker-a", got, err)
	}
	if got, err := r.ResidentOf(ctx, "t", "1.ws..x"); err != nil || got != "worker-b" {
		t.Fatalf("ResidentOf of another workspace = %q, %v; want worker-b", got, err)
	}
	if err := w.Residents().SetResident(ctx, "t", "w", ""); err == nil {
		t.Fatal("SetResident with no worker: no error")
	}

	if alive, err := r.Alive(ctx, "worker-a"); err != nil || alive {
		t.Fatalf("Alive before consuming = %v, %v; want false", alive, err)
	}
	stop := consumeAs(t, w, "worker-a", 2*time.Second, (&takenBy{}).handler("worker-a", false))
	waitAlive(t, r, "worker-a", true)
	stop()
	if alive, err := r.Alive(ctx, "worker-a"); err != nil || alive {
		t.Fatalf("Alive once stopped = %v, %v; want false at once (withdrawn)", alive, err)
	}
}

// TestRoutedCalls: calls published to a worker are all taken by that worker, though another fetches the
// shared lanes; calls published to the lanes go to either. A worker that dies (its connection closed, its
// presence not withdrawn) with a routed call unsettled, and with routed calls still queued for it, has
// each of them taken by the other worker once its presence lapsed: none lost.
func TestRoutedCalls(t *testing.T) {
	disp, url := jstest.Provisioned(t, func(c *jetstream.Config) { c.AckWait = 2 * time.Second })
	connA := jstest.Connect(t, url, "worker-a", false)
	connB := jstest.Connect(t, url, "worker-b", false)
	calls := disp.Calls()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	tb := &takenBy{}
	var holdA sync.Mutex
	hold := false // worker-a leaves its calls unsettled from now on
	handleA := func(ctx context.Context, d queue.Delivery) {
		holdA.Lock()
		h := hold
		holdA.Unlock()
		tb.handler("worker-a", h)(ctx, d)
	}
	consumeAs(t, connA, "worker-a", 2*time.Second, handleA)
	consumeAs(t, connB, "worker-b", 2*time.Second, tb.handler("worker-b", false))
	waitAlive(t, disp.Residents(), "worker-a", true)
	waitAlive(t, disp.Residents(), "worker-b", true)

	publish := func(id, to string) {
		t.Helper()
		c := &call.Call{ID: id, Tenant: "acme", Tool: "echo", CreatedAt: time.Now()}
		if err := calls.PublishTo(ctx, c, to); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		publish(fmt.Sprintf("routed-%d", i), "worker-a")
	}
	for i := range 10 {
		if by := tb.waitTaken(t, fmt.Sprintf("routed-%d", i), 1, 10*time.Second); len(by) != 1 || by[0] != "worker-a" {
			t.Fatalf("routed call %d taken by %v; want worker-a alone", i, by)
		}
	}
	publish("shared", "")
	if by := tb.waitTaken(t, "shared", 1, 10*time.Second); len(by) != 1 {
		t.Fatalf("shared call taken by %v; want one worker", by)
	}

	// worker-a dies while running a routed call.
	holdA.Lock()
	hold = true
	holdA.Unlock()
	publish("running-when-killed", "worker-a")
	if by := tb.waitTaken(t, "running-when-killed", 1, 10*time.Second); by[0] != "worker-a" {
		t.Fatalf("call taken by %v; want worker-a first", by)
	}
	connA.Close() // no withdrawal: its presence lapses on the server's clock
	publish("queued-for-dead", "worker-a")
	killed := time.Now()
	for id, n := range map[string]int{"running-when-killed": 2, "queued-for-dead": 1} {
		by := tb.waitTaken(t, id, n, 30*time.Second)
		if last := by[len(by)-1]; last != "worker-b" {
			t.Fatalf("call %s taken by %v; want worker-b after worker-a died", id, by)
		}
	}
	t.Logf("the dead worker's calls were taken by another %s after it died", time.Since(killed).Round(10*time.Millisecond))
	// Each was acked by worker-b: the queue holds none of them any more.
	st, err := calls.State(ctx)
	if err != nil || st.Pending != 0 {
		t.Fatalf("queue state %+v, %v; want nothing waiting", st, err)
	}
}

// BenchmarkResidentOf is what routing adds to a publish: one read of a workspace's resident (the
// presence read is cached for a second per worker). BenchmarkPublish is the publish it adds to.
func BenchmarkResidentOf(b *testing.B) {
	disp, _ := jstest.Provisioned(b, nil)
	ctx := context.Background()
	r := disp.Residents()
	if err := r.SetResident(ctx, "acme", "repo", "worker-a"); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if w, err := r.ResidentOf(ctx, "acme", "repo"); err != nil || w != "worker-a" {
			b.Fatalf("ResidentOf = %q, %v", w, err)
		}
	}
}

func BenchmarkPublish(b *testing.B) {
	disp, _ := jstest.Provisioned(b, func(c *jetstream.Config) { c.MaxPendingPerTenant = 1 << 30 })
	ctx := context.Background()
	i := 0
	for b.Loop() {
		i++
		if err := disp.Calls().Publish(ctx, &call.Call{ID: fmt.Sprintf("c%d", i), Tenant: "acme", Tool: "echo"}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRoutedCallsAfterDrain: a worker that stops fetching (a drain) withdraws its presence at once, and
// a call routed to it afterwards (a dispatcher that read its presence a moment before) is taken by
// another worker without waiting for a presence TTL.
func TestRoutedCallsAfterDrain(t *testing.T) {
	disp, url := jstest.Provisioned(t, nil)
	connA := jstest.Connect(t, url, "worker-a", false)
	connB := jstest.Connect(t, url, "worker-b", false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tb := &takenBy{}
	stopA := consumeAs(t, connA, "worker-a", time.Minute, tb.handler("worker-a", false))
	consumeAs(t, connB, "worker-b", time.Minute, tb.handler("worker-b", false))
	waitAlive(t, disp.Residents(), "worker-a", true)
	stopA()
	if err := disp.Calls().PublishTo(ctx, &call.Call{ID: "after-drain", Tenant: "acme", Tool: "echo"}, "worker-a"); err != nil {
		t.Fatal(err)
	}
	// Well within the minute a lapse of its presence would take: a scan and a poll.
	if by := tb.waitTaken(t, "after-drain", 1, 8*time.Second); by[0] != "worker-b" {
		t.Fatalf("call routed to a drained worker taken by %v; want worker-b", by)
	}
}

// TestWorkerCallsStart: a presence TTL under the server's second is refused with what to change; a worker
// stopped before it started (fetch context ended) returns nil at once, like Calls, and announces nothing.
func TestWorkerCallsStart(t *testing.T) {
	disp, url := jstest.Provisioned(t, nil)
	w := jstest.Connect(t, url, "worker-a", false)
	noop := func(context.Context, queue.Delivery) {}
	err := w.WorkerCalls("worker-a", 500*time.Millisecond).Consume(context.Background(), 1, noop)
	if err == nil || !strings.Contains(err.Error(), "presence 500ms is below the server's 1s") {
		t.Fatalf("presence of 500ms: %v; want it refused", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.WorkerCalls("worker-a", time.Second).Consume(ctx, 1, noop); err != nil {
		t.Fatalf("consume on an ended context: %v; want nil", err)
	}
	if alive, err := disp.Residents().Alive(context.Background(), "worker-a"); err != nil || alive {
		t.Fatalf("Alive = %v, %v; want false", alive, err)
	}
}
