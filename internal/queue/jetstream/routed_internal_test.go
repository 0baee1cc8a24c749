package jetstream

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
)

// TestGoneWorkersQueue: the queue of a worker that never announced itself (or stopped) is left alone
// while it is younger than a scan (its worker may be starting), then drained by another worker, and
// deleted only once it is empty: not while it holds a call waiting, nor one being run.
func TestGoneWorkersQueue(t *testing.T) {
	c := provisioned(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fetcher := func(worker string) *routedFetcher {
		return &routedFetcher{calls: c.Calls(), residents: c.Residents(), worker: worker, deadSince: map[string]time.Time{}}
	}
	a := fetcher("worker-a")
	if err := a.ensureOwn(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Calls().PublishTo(ctx, &call.Call{ID: "c1", Tenant: "acme", Tool: "echo"}, "worker-a"); err != nil {
		t.Fatal(err)
	}
	b := fetcher("worker-b") // forget 0: a gone worker's queue goes as soon as it is empty
	if b.scan(ctx); len(b.orphans) != 0 {
		t.Fatalf("a queue made a moment ago counted as a gone worker's: %d", len(b.orphans))
	}
	deadline := time.Now().Add(3 * orphanScanEvery)
	for b.scan(ctx); len(b.orphans) == 0; b.scan(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("worker-a's queue not taken as a gone worker's %s after it was made", 3*orphanScanEvery)
		}
		time.Sleep(50 * time.Millisecond)
	}
	msg, err := b.next(ctx)
	if err != nil || msg == nil {
		t.Fatalf("worker-b's next = %v, %v; want worker-a's call", msg, err)
	}
	if d := (delivery{msg}); d.Attempt() != 1 {
		t.Fatalf("attempt %d; want 1", d.Attempt())
	}
	b.scan(ctx) // the call is being run: the queue stays
	if _, err := c.js.Consumer(ctx, c.cfg.Stream, c.cfg.homeConsumer("worker-a")); err != nil {
		t.Fatalf("worker-a's queue with a call being run: %v; want it kept", err)
	}
	if err := msg.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	b.scan(ctx)
	if _, err := c.js.Consumer(ctx, c.cfg.Stream, c.cfg.homeConsumer("worker-a")); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("worker-a's empty queue: %v; want it deleted", err)
	}
	if len(b.orphans) != 0 {
		t.Fatalf("a deleted queue still fetched from: %d", len(b.orphans))
	}
}

// TestScanEveryFollowsThePresence: a worker looks for the calls of gone workers twice per presence TTL,
// and at most every orphanScanEvery, so that a short lease fails over in about the lease and half another.
func TestScanEveryFollowsThePresence(t *testing.T) {
	for _, tt := range []struct{ presence, want time.Duration }{
		{time.Second, 500 * time.Millisecond}, {2 * time.Second, time.Second}, {4 * time.Second, orphanScanEvery}, {15 * time.Second, orphanScanEvery},
	} {
		if got := scanEvery(tt.presence); got != tt.want {
			t.Errorf("scanEvery(%s) = %s, want %s", tt.presence, got, tt.want)
		}
	}
}
