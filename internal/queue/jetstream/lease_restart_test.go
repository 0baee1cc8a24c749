package jetstream_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
)

// TestLeaseSurvivesServerRestart: a lease renewed up to a server's restart (shorter than its TTL) is
// renewed again once the server is back, by its holder alone: the restart neither fences the holder nor
// frees the lease for another.
func TestLeaseSurvivesServerRestart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	store := t.TempDir()
	start := func() *jetstream.Embedded {
		srv, err := jetstream.StartEmbedded(jetstream.EmbeddedConfig{Listen: addr, StoreDir: store})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		return srv
	}
	srv := start()
	c := jstest.Connect(t, srv.URL(), "worker", true)
	ctx := context.Background()
	l, err := c.Leases().AcquireLease(ctx, "c_restart", "w1", 4*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	renew := func() error {
		rctx, cancel := context.WithTimeout(ctx, 600*time.Millisecond)
		defer cancel()
		return l.Renew(rctx)
	}
	// Renewals race the shutdown, as a running call's guard does: one may be applied with its reply lost.
	stopped := make(chan struct{})
	go func() {
		time.Sleep(450 * time.Millisecond)
		srv.Shutdown()
		close(stopped)
	}()
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		_ = renew()
	}
	<-stopped
	start()
	var last error
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if last = renew(); last == nil {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if last != nil {
		t.Fatalf("renewal after the restart: %v", last)
	}
	if held, err := c.Leases().LeaseHeld(ctx, "c_restart"); err != nil || !held {
		t.Fatalf("lease after the restart: held %v, %v", held, err)
	}
	if _, err := c.Leases().AcquireLease(ctx, "c_restart", "w2", 4*time.Second); err == nil {
		t.Fatal("another holder took a lease that lives")
	}
}
