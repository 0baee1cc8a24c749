package jetstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
)

// TestWaitSeesAnUpdateRacingItsStart: a call that ends while Wait is starting (the worker's update reaches
// the server around the moment Wait subscribes) is seen at once, not at the next backstop poll: the server
// routes a published update to core subscribers before its stream stores it, so an update routed before
// the subscription and stored after the first read rings no bell.
func TestWaitSeesAnUpdateRacingItsStart(t *testing.T) {
	waiter, url := jstest.Provisioned(t, nil)
	writer := jstest.Connect(t, url, "writer", false)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const rounds = 300
	var slowest time.Duration
	for i := range rounds {
		r := &call.Result{ID: call.NewID(), Tenant: "t", Status: call.StatusRunning}
		rev, err := writer.Records().Create(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			if i%3 != 0 {
				time.Sleep(time.Duration(i%7) * 100 * time.Microsecond)
			}
			r2 := *r
			r2.Status = call.StatusOK
			_, err := writer.Records().Update(ctx, &r2, rev)
			done <- err
		}()
		start := time.Now()
		got, err := waiter.Records().Wait(ctx, r.ID, func(r *call.Result) bool { return r.Status.Terminal() })
		took := time.Since(start)
		if err != nil || got.Status != call.StatusOK {
			t.Fatalf("round %d: Wait: %+v %v", i, got, err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		slowest = max(slowest, took)
	}
	t.Logf("slowest of %d Waits: %s", rounds, slowest)
	if slowest > time.Second {
		t.Fatalf("a Wait took %s for an update made as it started: it missed the update and waited for the backstop poll", slowest)
	}
}
