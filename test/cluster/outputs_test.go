package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/queue/jetstream"
)

// TestOutputPutAcrossALeaderKill: a put of an output in flight when the object store's stream leader is
// killed -9 ends within seconds, as an error its caller retries, instead of holding out until its
// context's deadline; and puts go through again once a new leader is elected. nats.go bounds a chunk's
// acknowledgement only under a context without a deadline; under one, the chaos soak saw every put in
// flight at a leader kill hang for its whole bound, and the worker's results wait behind it.
func TestOutputPutAcrossALeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-server NATS cluster")
	}
	c := startNATSCluster(t, t.TempDir())
	cfg := jetstream.DefaultConfig()
	cfg.URL, cfg.Name, cfg.Replicas, cfg.Provision = c.urls(), "outputs", 3, true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	conn, err := jetstream.Connect(ctx, cfg)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	type put struct {
		start time.Time
		took  time.Duration
		err   error
	}
	done := make(chan put, 1000)
	stop := make(chan struct{})
	payload := strings.Repeat("x", 2<<20)
	for g := range 2 { // two writers, so that a put is in flight whenever the leader dies
		go func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				start := time.Now()
				_, err := conn.Outputs().PutOutput(ctx, fmt.Sprintf("c_out%d_%d", g, i), strings.NewReader(payload))
				cancel()
				done <- put{start, time.Since(start), err}
			}
		}()
	}
	defer close(stop)
	for range 4 {
		if p := <-done; p.err != nil {
			t.Fatal(p.err)
		}
	}
	c.leaderOf(t, "OBJ_"+cfg.Bucket+"_outputs").proc.Kill9(t)
	killed := time.Now()
	failed := 0
	for p := range done {
		if p.took > 20*time.Second {
			t.Fatalf("a put in flight when its stream's leader was killed took %s (%v): held until its deadline", p.took.Round(time.Second), p.err)
		}
		if p.err != nil {
			failed++
		} else if p.start.After(killed) {
			break
		}
		if time.Since(killed) > time.Minute {
			t.Fatalf("no put went through in a minute after the leader was killed (%d failed)", failed)
		}
	}
	t.Logf("puts went through again %s after the leader was killed; %d failed meanwhile, each within 20 s",
		time.Since(killed).Round(100*time.Millisecond), failed)
}
