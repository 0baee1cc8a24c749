package jetstream

import (
	"context"
	"testing"
	"time"
)

// TestClockKeepsTheTighterSample: the offset comes from a sample's midpoint; a sample slower than
// clockMaxRTT does not replace a tighter one (its error could reach half its round trip, enough to judge a
// live lease gone), but replaces a looser one, and the first sample is always taken.
func TestClockKeepsTheTighterSample(t *testing.T) {
	c := &clock{local: time.Now}
	t0 := time.Now()
	server := func(off time.Duration) time.Time { return t0.Add(off) }

	// First sample, slow: taken, whatever its round trip.
	if !c.observe(t0, t0.Add(4*time.Second), server(2*time.Second+time.Hour)) {
		t.Fatal("the first sample was not taken")
	}
	if got := time.Duration(c.offset.Load()); got != time.Hour {
		t.Fatalf("offset %s, want 1h (the server's stamp against the round trip's midpoint)", got)
	}
	if got := c.uncertainty(); got != 2*time.Second {
		t.Fatalf("uncertainty %s, want half the round trip", got)
	}
	// A tight sample replaces it.
	if !c.observe(t0, t0.Add(10*time.Millisecond), server(5*time.Millisecond+time.Hour+time.Second)) {
		t.Fatal("a tight sample was not taken")
	}
	if got := time.Duration(c.offset.Load()); got != time.Hour+time.Second {
		t.Fatalf("offset %s after the tight sample, want 1h1s", got)
	}
	// A slow one, answered 10s late (its stamp taken at the end): refused, the offset stays.
	if c.observe(t0, t0.Add(10*time.Second), server(10*time.Second+time.Hour+time.Second)) {
		t.Fatal("a sample of a 10s round trip replaced one of 10ms")
	}
	if got := time.Duration(c.offset.Load()); got != time.Hour+time.Second {
		t.Fatalf("offset %s after a refused sample, want 1h1s", got)
	}
	// Within clockMaxRTT, a sample is taken even when looser than the kept one: the clock follows drift.
	if !c.observe(t0, t0.Add(clockMaxRTT), server(clockMaxRTT/2+time.Hour+2*time.Second)) {
		t.Fatal("a sample within clockMaxRTT was not taken")
	}
	if got := c.uncertainty(); got != clockMaxRTT/2 {
		t.Fatalf("uncertainty %s, want %s", got, clockMaxRTT/2)
	}
}

// TestLeaseNotJudgedGoneWithinTheClocksUncertainty: a lease is judged lapsed only when it is past its TTL
// however far the server's time may be from this client's estimate of it.
func TestLeaseNotJudgedGoneWithinTheClocksUncertainty(t *testing.T) {
	c := provisioned(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.leases.AcquireLease(ctx, "c_unsure", "w1", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// The estimate says 35s passed, give or take 10s: the lease may have 5s left.
	c.clock.offset.Add(int64(35 * time.Second))
	c.clock.rtt.Store(int64(20 * time.Second))
	if held, err := c.leases.LeaseHeld(ctx, "c_unsure"); err != nil || !held {
		t.Fatalf("LeaseHeld = %v, %v; want true while the lease may live", held, err)
	}
	// 45s, give or take 10s: gone for sure.
	c.clock.offset.Add(int64(10 * time.Second))
	if held, err := c.leases.LeaseHeld(ctx, "c_unsure"); err != nil || held {
		t.Fatalf("LeaseHeld = %v, %v; want false once past the TTL beyond doubt", held, err)
	}
}
