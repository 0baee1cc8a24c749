package worker

import (
	"os"
	"time"
)

// Defaults of Config: New fills each zero field named here with its default, and cmd/worker takes its
// own defaults from here, so that each is stated once.
const (
	// DefaultHeartbeat is cmd/worker's heartbeat. New does not fill it: a zero Heartbeat is refused.
	DefaultHeartbeat = 5 * time.Second
	// MinLease is the shortest lease the queue server keeps: its per-message TTLs count whole seconds.
	MinLease = time.Second
	// DefaultRetryDelay is RetryDelay's default.
	DefaultRetryDelay = time.Second
	// DefaultCaptureBytes is CaptureBytes' default.
	DefaultCaptureBytes = 1 << 20
	// DefaultFullOutputBytes is FullOutputBytes' default.
	DefaultFullOutputBytes = 64 << 20
	// DefaultInlineBytes is InlineBytes' default.
	DefaultInlineBytes = 64 << 10
)

// DefaultLease is the lease of a worker whose Config names none: three heartbeats, and at least MinLease.
func DefaultLease(heartbeat time.Duration) time.Duration {
	return max(3*heartbeat, MinLease)
}

// withDefaults returns c with each zero field that has a default filled in.
func (c Config) withDefaults() Config {
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease(c.Heartbeat)
	}
	if c.InlineBytes == 0 {
		c.InlineBytes = DefaultInlineBytes
	}
	if c.CaptureBytes == 0 {
		c.CaptureBytes = DefaultCaptureBytes
	}
	if c.FullOutputBytes == 0 {
		c.FullOutputBytes = DefaultFullOutputBytes
	}
	if c.SpoolDir == "" {
		c.SpoolDir = os.TempDir()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}
