package jetstream

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/queue"
)

// A worker's own queue: the calls a dispatcher routed to it (Calls.PublishTo, a workspace's resident), on
// the subjects PREFIX_home.<worker>.<tenant> of the calls stream, with a durable consumer per worker,
// CONSUMER_home_<worker> (the worker's id base64url-encoded). The worker makes its consumer and fetches
// from it before the shared lanes. While it fetches it announces its presence (Residents), and withdraws
// it when it stops fetching (a drain); every worker also fetches from the queues of workers whose
// presence is gone, so that a call routed to a worker that died or stopped still runs, once: the queue
// is a work queue, and the call's record and lease fence it as any call. The queue of a worker gone for
// orphanForget and empty is deleted.

// WorkerCalls is the calls queue as one worker consumes it: its own queue first, then the queues of
// workers that are gone, then the shared lanes. It implements queue.Calls. Safe for concurrent use; it
// lives as long as its Conn.
type WorkerCalls struct {
	*Calls
	residents *Residents
	worker    string
	presence  time.Duration
}

var _ queue.Calls = (*WorkerCalls)(nil)

// WorkerCalls is the calls queue as worker consumes it, announcing its presence for presence (at least a
// second; the worker's lease TTL) and renewing it three times as often.
func (c *Conn) WorkerCalls(worker string, presence time.Duration) *WorkerCalls {
	return &WorkerCalls{Calls: c.Calls(), residents: c.Residents(), worker: worker, presence: presence}
}

// How workers watch each other's queues.
const (
	// orphanScanEvery is how often, at most, a worker lists the other workers' queues and reads their
	// presence; a worker whose presence TTL is shorter scans twice per TTL (scanEvery), so that a call
	// routed to a worker that died waits about the TTL and half another, not the TTL and several seconds.
	orphanScanEvery = 2 * time.Second
	// orphanForget is how long a worker's presence must have been gone before its empty queue is deleted:
	// far longer than a dispatcher trusts a presence it read (dispatcher.presenceCacheFor).
	orphanForget = time.Minute
	// withdrawTimeout bounds the withdrawal of a worker's presence, on a fresh context.
	withdrawTimeout = 5 * time.Second
)

// Consume is ConsumeWith with one context.
func (w *WorkerCalls) Consume(ctx context.Context, slots int, handle func(context.Context, queue.Delivery)) error {
	return w.ConsumeWith(ctx, ctx, slots, handle)
}

// ConsumeWith is Calls.ConsumeWith over the worker's own queue, the queues of workers that are gone and
// the lanes. It makes the worker's consumer, announces the worker's presence until fetching stops, and
// then withdraws it, so that the calls routed to it meanwhile go to other workers.
func (w *WorkerCalls) ConsumeWith(fetchCtx, runCtx context.Context, slots int, handle func(context.Context, queue.Delivery)) error {
	if fetchCtx.Err() != nil {
		return nil // stopped before it started: nothing fetched, nothing to wait for
	}
	if w.presence < time.Second {
		return fmt.Errorf("consume calls as worker %s: presence %s is below the server's 1s", w.worker, w.presence)
	}
	// The queue first, then the presence: a dispatcher routes only to a worker whose queue exists, so a
	// call routed to a worker that dies is always in a queue that other workers drain.
	r := &routedFetcher{calls: w.Calls, residents: w.residents, worker: w.worker, deadSince: map[string]time.Time{}, forget: orphanForget,
		scanEvery: scanEvery(w.presence)}
	if err := r.ensureOwn(fetchCtx); err != nil {
		return w.notStarted(fetchCtx, err)
	}
	if err := w.residents.announce(fetchCtx, w.worker, w.presence); err != nil {
		return w.notStarted(fetchCtx, err)
	}
	announceCtx, stop := context.WithCancel(fetchCtx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(w.presence / 3)
		defer t.Stop()
		for {
			select {
			case <-announceCtx.Done():
				w.withdraw(announceCtx)
				return
			case <-t.C:
			}
			// One that fails is tried again next tick; a presence that lapses only sends this worker's
			// workspaces' calls to other workers meanwhile.
			_ = w.residents.announce(announceCtx, w.worker, w.presence)
		}
	}()
	// Fetching stopped (or failed): the presence goes before the running calls end.
	context.AfterFunc(fetchCtx, stop)
	defer func() { stop(); <-done }()
	return w.consume(fetchCtx, runCtx, slots, handle, r)
}

// withdraw removes the worker's presence, on a fresh bounded context; one that fails lapses on its own.
func (w *WorkerCalls) withdraw(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
	defer cancel()
	_ = w.residents.withdraw(ctx, w.worker)
}

// notStarted ends a ConsumeWith that failed to start with err: it withdraws the presence it may have
// announced, and returns nil when fetchCtx ended meanwhile (a worker stopped as it started), err otherwise.
func (w *WorkerCalls) notStarted(fetchCtx context.Context, err error) error {
	w.withdraw(fetchCtx)
	if fetchCtx.Err() != nil {
		return nil
	}
	return err
}

// routedFetcher fetches a worker's own queue and the queues of workers that are gone. Used by the one
// goroutine of consume's loop.
type routedFetcher struct {
	calls     *Calls
	residents *Residents
	worker    string
	own       jetstream.Consumer   // nil: make it again (it was deleted, or a fetch failed)
	scanned   time.Time            // the last scan of the other workers' queues
	scanEvery time.Duration        // how often to scan them (scanEvery); the idle loop wakes as often
	orphans   []jetstream.Consumer // the queues of workers that are gone, as of the last scan
	deadSince map[string]time.Time // by consumer name: when its worker was first seen gone
	forget    time.Duration        // orphanForget (tests shorten it)
}

// ensureOwn makes the worker's consumer, unless it has it.
func (r *routedFetcher) ensureOwn(ctx context.Context) error {
	if r.own != nil {
		return nil
	}
	cfg := r.calls.cfg
	cons, err := r.calls.js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{
		Durable:       cfg.homeConsumer(r.worker),
		Description:   "toolpool calls routed to worker " + r.worker,
		FilterSubject: cfg.homeFilter(r.worker),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    cfg.MaxDeliver,
		MaxAckPending: -1,
		Replicas:      cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("create consumer %s of worker %s (stream %s must take %s: start a dispatcher of this version first): %w",
			cfg.homeConsumer(r.worker), r.worker, cfg.Stream, cfg.homeSubjects(), err)
	}
	r.own = cons
	return nil
}

// next returns a call of the worker's own queue, else of a gone worker's queue, else nil. Its error is
// the own queue's: the others' are skipped.
func (r *routedFetcher) next(ctx context.Context) (jetstream.Msg, error) {
	if err := r.ensureOwn(ctx); err != nil {
		return nil, err
	}
	msg, err := fetchOne(r.own)
	if err != nil {
		r.own = nil
		return nil, fmt.Errorf("fetch a call of worker %s's own queue: %w", r.worker, err)
	}
	if msg != nil {
		return msg, nil
	}
	if time.Since(r.scanned) >= r.scanEvery {
		r.scanned = time.Now()
		r.scan(ctx)
	}
	for i := 0; i < len(r.orphans); i++ {
		msg, err := fetchOne(r.orphans[i])
		if err != nil { // deleted meanwhile: the next scan tells
			r.orphans = append(r.orphans[:i], r.orphans[i+1:]...)
			i--
			continue
		}
		if msg != nil {
			return msg, nil
		}
	}
	return nil, nil
}

// scanEvery is how often a worker whose presence lives for presence scans the other workers' queues:
// twice per presence TTL, at most every orphanScanEvery.
func scanEvery(presence time.Duration) time.Duration { return min(orphanScanEvery, presence/2) }

// fetchOne takes one message from cons without waiting; nil when it has none ready.
func fetchOne(cons jetstream.Consumer) (jetstream.Msg, error) {
	batch, err := cons.FetchNoWait(1)
	if err != nil {
		return nil, err
	}
	for msg := range batch.Messages() {
		return msg, nil
	}
	return nil, nil
}

// scan lists the other workers' queues and keeps those whose worker is gone in orphans (not a queue
// made within orphanScanEvery, by the server's clock: its worker may be starting); it deletes one whose
// worker has been gone for orphanForget once it is empty (nothing waiting, nothing being run). A
// failure leaves the queues it could not read for the next scan.
func (r *routedFetcher) scan(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, orphanScanEvery)
	defer cancel()
	cfg := r.calls.cfg
	stream, err := r.calls.js.Stream(ctx, cfg.Stream)
	if err != nil {
		return
	}
	names := stream.ConsumerNames(ctx)
	own := cfg.homeConsumer(r.worker)
	r.orphans = r.orphans[:0]
	seen := map[string]bool{}
	for name := range names.Name() {
		tok, ok := strings.CutPrefix(name, cfg.homeConsumerPrefix())
		if !ok || name == own {
			continue
		}
		worker, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil {
			continue
		}
		seen[name] = true
		if alive, err := r.residents.Alive(ctx, string(worker)); err != nil || alive {
			delete(r.deadSince, name)
			continue
		}
		cons, err := stream.Consumer(ctx, name)
		if err != nil {
			continue
		}
		since, known := r.deadSince[name]
		if !known {
			since = time.Now()
			r.deadSince[name] = since
		}
		info := cons.CachedInfo()
		if r.calls.now().Sub(info.Created) < orphanScanEvery {
			continue // a worker that is starting makes its queue a moment before it announces itself
		}
		if time.Since(since) >= r.forget && info.NumPending == 0 && info.NumAckPending == 0 {
			if r.calls.js.DeleteConsumer(ctx, cfg.Stream, name) == nil {
				delete(r.deadSince, name)
				continue
			}
		}
		r.orphans = append(r.orphans, cons)
	}
	for name := range r.deadSince {
		if names.Err() == nil && !seen[name] {
			delete(r.deadSince, name)
		}
	}
}
