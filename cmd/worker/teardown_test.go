package main

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestTeardownOrder checks the worker's ordered shutdown: the context is cancelled, then the servers
// are stopped, then every goroutine is joined, and only then are the closes run, the last added first.
func TestTeardownOrder(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	td := newTeardown(cancel)
	var mu sync.Mutex
	var steps []string
	step := func(s string) {
		mu.Lock()
		steps = append(steps, s)
		mu.Unlock()
	}
	served := make(chan struct{})
	td.Go(func() { <-ctx.Done(); time.Sleep(10 * time.Millisecond); step("loop") })
	td.Go(func() { <-served; step("server") })
	td.Go(func() { <-td.Quit(); step("signals") })
	td.OnStop(func() { step("stop server"); close(served) })
	for _, name := range []string{"daemon", "runtime", "conn"} {
		td.OnClose(func() error { step("close " + name); return nil })
	}
	if err := td.shutdown(); err != nil {
		t.Fatal(err)
	}
	if i := slices.Index(steps, "stop server"); i < 0 || slices.Index(steps, "server") < i {
		t.Errorf("the server returned before it was stopped: %v", steps)
	}
	if got, want := steps[len(steps)-3:], []string{"close conn", "close runtime", "close daemon"}; !slices.Equal(got, want) || len(steps) != 7 {
		t.Errorf("steps %v: want the three goroutines joined, then %v", steps, want)
	}
}
