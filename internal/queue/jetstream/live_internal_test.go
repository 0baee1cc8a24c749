package jetstream

import (
	"context"
	"testing"
	"time"
)

// TestLiveFollowerLeavesNoConsumer: a follower's consumer is removed from the live stream once the
// follower's context ends, not left to expire (each one holds server memory).
func TestLiveFollowerLeavesNoConsumer(t *testing.T) {
	c := provisioned(t)
	cfg := c.cfg
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	consumers := func() int {
		t.Helper()
		s, err := c.js.Stream(ctx, cfg.liveStream())
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	fctx, stop := context.WithCancel(ctx)
	chunks, err := c.Live().FollowOutput(fctx, "c_x", 1)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); consumers() != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d consumers while following, want 1", consumers())
		}
	}
	stop()
	for range chunks {
	}
	for deadline := time.Now().Add(10 * time.Second); consumers() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d consumers 10 s after the follower left, want 0", consumers())
		}
	}
}
