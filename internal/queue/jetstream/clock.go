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
// half a round trip.
type clock struct {
	local  func() time.Time
	offset atomic.Int64 // server minus local, in nanoseconds
}

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
	mid := before.Add(after.Sub(before) / 2)
	s.clock.offset.Store(int64(info.TimeStamp.Sub(mid)))
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
