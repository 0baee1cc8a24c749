package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox/containerd"
)

// supervisedDaemon is the worker's private containerd, restarted when it dies.
type supervisedDaemon struct {
	cfg     containerd.DaemonConfig
	log     *slog.Logger
	mu      sync.Mutex
	current *containerd.Daemon
	stopped bool
}

func startSupervised(ctx context.Context, cfg containerd.DaemonConfig, log *slog.Logger) (*supervisedDaemon, error) {
	d, err := containerd.StartDaemon(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &supervisedDaemon{cfg: cfg, log: log, current: d}, nil
}

// Address is the daemon's socket; it stays the same across restarts.
func (s *supervisedDaemon) Address() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current.Address()
}

// Supervise restarts the daemon whenever it exits, until ctx ends or Stop is called, and runs afterRestart
// once it is back. It blocks.
func (s *supervisedDaemon) Supervise(ctx context.Context, afterRestart func()) {
	for {
		s.mu.Lock()
		d := s.current
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-d.Done():
		}
		backoff := 100 * time.Millisecond
		for {
			s.mu.Lock()
			if s.stopped || ctx.Err() != nil {
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
			s.log.Error("containerd exited; restarting it")
			nd, err := containerd.StartDaemon(ctx, s.cfg)
			if err == nil {
				s.mu.Lock()
				s.current = nd
				s.mu.Unlock()
				s.log.Info("restarted private containerd")
				afterRestart()
				break
			}
			s.log.Error("restart containerd", "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}
}

// Stop stops the daemon and the supervision. It is idempotent.
func (s *supervisedDaemon) Stop() error {
	s.mu.Lock()
	s.stopped = true
	d := s.current
	s.mu.Unlock()
	return d.Stop(context.Background())
}
