package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Records is the call records: one key per call id in the records bucket, each revision a JSON
// call.Result, moved by compare-and-set on the key's revision. It implements queue.Records. Safe for
// concurrent use; it lives as long as its Conn.
type Records struct {
	*session
	kv jetstream.KeyValue
}

var _ queue.Records = (*Records)(nil)

// Create stores the first record of a call; queue.ErrExists if the id is taken.
func (s *Records) Create(ctx context.Context, r *call.Result) (uint64, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("encode call %s: %w", r.ID, err)
	}
	rev, err := s.kv.Create(ctx, r.ID, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("create call %s: %w", r.ID, queue.ErrExists)
	}
	if err != nil {
		return 0, fmt.Errorf("create call %s: %w", r.ID, err)
	}
	return rev, nil
}

// Get reads a call's record; queue.ErrNotFound if there is none.
func (s *Records) Get(ctx context.Context, id string) (queue.Record, error) {
	e, err := s.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return queue.Record{}, fmt.Errorf("get call %s: %w", id, queue.ErrNotFound)
	}
	if err != nil {
		return queue.Record{}, fmt.Errorf("get call %s: %w", id, err)
	}
	var r call.Result
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return queue.Record{}, fmt.Errorf("decode call %s: %w", id, err)
	}
	return queue.Record{Result: &r, Revision: e.Revision()}, nil
}

// Update replaces a call's record if it is still at revision rev; queue.ErrConflict otherwise.
func (s *Records) Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("encode call %s: %w", r.ID, err)
	}
	next, err := s.kv.Update(ctx, r.ID, data, rev)
	if isWrongSequence(err) {
		return 0, fmt.Errorf("update call %s at revision %d: %w", r.ID, rev, queue.ErrConflict)
	}
	if err != nil {
		return 0, fmt.Errorf("update call %s: %w", r.ID, err)
	}
	return next, nil
}

// waitRereads are the delays of Wait's first reads after its first; waitPoll spaces those that follow.
var waitRereads, waitPoll = []time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond}, 2 * time.Second

// Wait returns the call's record once done(record) is true, or the latest record when ctx ends (with ctx's
// error). It listens to the one key's updates with a core subscription (no server state beyond the
// interest) and reads the record again on each, so it costs nothing for other calls' updates.
//
// The server routes a published update to core subscribers before its stream stores it: the bell may
// ring before the stream's leader has applied the write (on a cluster it needs a quorum first, slower
// with a server down), and a read then still finds the record before it; and an update routed just
// before the subscription and stored just after the first read rings no bell at all. So Wait reads
// again soon after it starts and after each bell (waitRereads) to see such an update within
// milliseconds; later, a poll every waitPoll backs up notifications lost to a reconnect. (The bell's
// message is not read as the record: a compare-and-set write the stream refused rings it too.)
func (s *Records) Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error) {
	bell := make(chan struct{}, 1)
	sub, err := s.nc.Subscribe("$KV."+s.cfg.Bucket+"."+id, func(*nats.Msg) {
		select {
		case bell <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, fmt.Errorf("watch call %s: %w", id, err)
	}
	defer sub.Unsubscribe()
	// Read after subscribing, so that an update between the two is not missed.
	rec, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	latest := rec.Result
	reread := time.NewTimer(waitRereads[0])
	defer reread.Stop()
	for n := 1; !done(latest); {
		select {
		case <-bell:
			n = 1
			reread.Reset(waitRereads[0])
		case <-reread.C:
			next := waitPoll
			if n < len(waitRereads) {
				next = waitRereads[n]
				n++
			}
			reread.Reset(next)
		case <-ctx.Done():
			return latest, ctx.Err()
		}
		if rec, err := s.Get(ctx, id); err == nil {
			latest = rec.Result
		}
	}
	return latest, nil
}
