package main

import (
	"context"
	"errors"
	"sync"
)

// teardown stops what run started, in order: it cancels run's context (the loops end, the warm pool
// drains), stops the servers, joins every goroutine started with Go, and only then runs the closes, the
// last added first (the queue connection, the runtime, the containerd daemon, tracing), so that no
// goroutine uses what they close. Go, OnStop, OnClose and shutdown are called from run's goroutine only;
// shutdown runs once, when run returns.
type teardown struct {
	cancel context.CancelFunc
	quit   chan struct{} // closed when shutdown begins
	wg     sync.WaitGroup
	stops  []func()
	closes []func() error
}

// newTeardown returns a teardown whose shutdown begins with cancel (run's context's).
func newTeardown(cancel context.CancelFunc) *teardown {
	return &teardown{cancel: cancel, quit: make(chan struct{})}
}

// Go runs f in a goroutine that shutdown joins: f must return once run's context ends, a server it runs
// is stopped (OnStop), or Quit is closed.
func (t *teardown) Go(f func()) { t.wg.Go(f) }

// Quit is closed when shutdown begins: it ends the goroutines that outlive run's context (the signal
// handler waits for a second signal after the first cancelled it).
func (t *teardown) Quit() <-chan struct{} { return t.quit }

// OnStop adds a server's stop (http.Server.Close), run after the context is cancelled and before the
// goroutines are joined: the goroutine serving returns once it has run.
func (t *teardown) OnStop(stop func()) { t.stops = append(t.stops, stop) }

// OnClose adds a close, run after every goroutine has returned; the last added runs first.
func (t *teardown) OnClose(close func() error) { t.closes = append(t.closes, close) }

// shutdown cancels the context, stops the servers, joins the goroutines and runs the closes. It
// returns the closes' errors.
func (t *teardown) shutdown() error {
	t.cancel()
	close(t.quit)
	for i := len(t.stops) - 1; i >= 0; i-- {
		t.stops[i]()
	}
	t.wg.Wait()
	var errs []error
	for i := len(t.closes) - 1; i >= 0; i-- {
		errs = append(errs, t.closes[i]())
	}
	return errors.Join(errs...)
}
