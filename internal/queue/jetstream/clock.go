package jetstream

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// clock estimates the NATS server's time from the local clock: the server that leads the records
// bucket stamps every record revision, so its time is the one against which deadlines are judged. The
// offset is measured at connect and every clockSyncInterval, from the time a stream info reports, within
// half a round trip; a slow answer does not replace a tighter estimate (observe).
type clock struct {
	local  func() time.Time
	offset atomic.Int64 // server minus local, in nanoseconds
	rtt    atomic.Int64 // the round trip of the sample offset came from, in nanoseconds; 0 before the first
}

// clockMaxRTT is the round trip within which a sample always replaces the kept one. A slower sample (a
// loaded server, a stalled connection: seconds, at times) is only as good as half its round trip, so it
// is kept only when it is still tighter than the one it would replace.
const clockMaxRTT = 500 * time.Millisecond

// observe takes a sample of the server's time, stamped by the server between the local times before and
// after, and reports whether it now sets the offset: the first sample does, then one whose round trip is
// within clockMaxRTT or shorter than the kept one's.
func (c *clock) observe(before, after, server time.Time) bool {
	rtt := max(after.Sub(before), 1) // 1ns: a sample was taken
	if kept := time.Duration(c.rtt.Load()); kept != 0 && rtt > clockMaxRTT && rtt >= kept {
		return false
	}
	c.offset.Store(int64(server.Sub(before.Add(after.Sub(before) / 2))))
	c.rtt.Store(int64(rtt))
	return true
}

// uncertainty is how far the server's time may be from Now: half the round trip of the kept sample.
func (c *clock) uncertainty() time.Duration { return time.Duration(c.rtt.Load()) / 2 }

const clockSyncInterval = 30 * time.Second

// Now is the server's current time, as this client estimates it. Safe for concurrent use. Differences
// between two Now values use the local monotonic clock.
func (c *Conn) Now() time.Time { return c.now() }

func (s *session) now() time.Time {
	return s.clock.local().Add(time.Duration(s.clock.offset.Load()))
}

// syncClock measures the offset of the local clock from the records bucket's stream leader.
func (s *session) syncClock(ctx context.Context) error {
	stream, err := s.js.Stream(ctx, "KV_"+s.cfg.Bucket)
	if err != nil {
		return fmt.Errorf("sync clock with nats: %w", err)
	}
	before := s.clock.local()
	info, err := stream.Info(ctx)
	after := s.clock.local()
	if err != nil {
		return fmt.Errorf("sync clock with nats: %w", err)
	}
	if info.TimeStamp.IsZero() {
		return nil // a server too old to say; keep the local clock
	}
	s.clock.observe(before, after, info.TimeStamp)
	return nil
}

// keepClock syncs the clock every clockSyncInterval until ctx ends. It blocks.
func (s *session) keepClock(ctx context.Context) {
	t := time.NewTicker(clockSyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = s.syncClock(sctx) // a failed sync keeps the last offset
			cancel()
		}
	}
}
