package jetstream

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Consume pulls calls and runs handle for each in its own goroutine, never more than slots at once. It
// fetches one call per free slot, so that no buffered message ages toward its ack wait, and it takes turns
// among the lanes, so that one tenant's flood delays only the tenants of its own lane. An empty message
// on a lane's bell subject, published with each call, wakes an idle loop at once, which then fetches from
// the lanes that rang before the others (a fetch is a round trip, and there are 16 lanes by default);
// redeliveries ring no bell and are found by polling, every 250ms after a call was found and backing off to every 4s when the
// queue stays empty. Consume returns when ctx ends, after every handle it started has returned; handle gets
// ctx too and settles its Delivery (or leaves it to the call's runner elsewhere).
func (c *Calls) Consume(ctx context.Context, slots int, handle func(context.Context, queue.Delivery)) error {
	return c.ConsumeWith(ctx, ctx, slots, handle)
}

// Idle polling bounds of ConsumeWith.
const (
	pollMin = 250 * time.Millisecond
	pollMax = 4 * time.Second
)

// ConsumeWith is Consume with separate contexts: fetching stops when fetchCtx ends, while the handlers run
// on runCtx, so that a draining worker finishes its calls (cancel runCtx after a grace period to stop
// them). It returns once fetching stopped and every handler returned.
func (c *Calls) ConsumeWith(fetchCtx, runCtx context.Context, slots int, handle func(context.Context, queue.Delivery)) error {
	return c.consume(fetchCtx, runCtx, slots, handle, nil)
}

// consume is ConsumeWith; a worker's routed calls (routed.go), when routed is not nil, are fetched before
// the lanes, and their bell wakes the loop too.
func (c *Calls) consume(fetchCtx, runCtx context.Context, slots int, handle func(context.Context, queue.Delivery), routed *routedFetcher) error {
	bell := make(chan struct{}, 1)
	f := &laneFetcher{calls: c, consumers: make([]jetstream.Consumer, c.cfg.Lanes), rung: make([]bool, c.cfg.Lanes), routed: routed}
	if routed != nil {
		hsub, err := c.nc.Subscribe(c.cfg.homeBell(routed.worker), func(*nats.Msg) {
			select {
			case bell <- struct{}{}:
			default:
			}
		})
		if err != nil {
			return fmt.Errorf("subscribe to worker %s's bell: %w", routed.worker, err)
		}
		defer hsub.Unsubscribe()
	}
	prefix := c.cfg.SubjectPrefix + "_ready."
	sub, err := c.nc.Subscribe(prefix+"*", func(m *nats.Msg) {
		if l, err := strconv.Atoi(strings.TrimPrefix(m.Subject, prefix)); err == nil {
			f.ring(l)
		}
		select {
		case bell <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe to the lanes' bells: %w", err)
	}
	defer sub.Unsubscribe()

	free := make(chan struct{}, slots)
	for range slots {
		free <- struct{}{}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	poll := pollMin
	for {
		select {
		case <-fetchCtx.Done():
			return nil
		case <-free:
		}
		msg, err := f.next(fetchCtx)
		if msg == nil {
			free <- struct{}{}
			wait := poll
			if err != nil {
				wait = pollMin // the server is unreachable or restarting: back off briefly
			} else {
				poll = min(2*poll, pollMax)
			}
			if routed != nil {
				// The calls routed to a worker that died ring no bell here: look for them as often as
				// the scan for gone workers' queues runs.
				wait = min(wait, routed.scanEvery)
			}
			select {
			case <-fetchCtx.Done():
			case <-bell:
			case <-time.After(wait):
			}
			continue
		}
		poll = pollMin
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { free <- struct{}{} }()
			handle(runCtx, delivery{msg})
		}()
	}
}

// laneFetcher takes one message at a time, round-robin over the lanes. Used by one goroutine, but for
// ring, which the bell subscription calls.
type laneFetcher struct {
	calls     *Calls
	consumers []jetstream.Consumer // by lane, looked up on first use
	turn      int
	mu        sync.Mutex
	rung      []bool         // by lane: a bell rang since the lane was last fetched from
	routed    *routedFetcher // a worker's own queue and those of stopped workers; nil: lanes only
}

// ring notes that lane l's bell rang: a call was queued on it.
func (f *laneFetcher) ring(l int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l >= 0 && l < len(f.rung) {
		f.rung[l] = true
	}
}

// order returns the lanes in rotation order from turn, those whose bell rang first.
func (f *laneFetcher) order() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	lanes := len(f.consumers)
	order := make([]int, 0, lanes)
	for pass := range 2 {
		for i := range lanes {
			if l := (f.turn + i) % lanes; f.rung[l] == (pass == 0) {
				order = append(order, l)
			}
		}
	}
	return order
}

// tried forgets lane l's bell, before a fetch from it: a bell that rings after this rings again.
func (f *laneFetcher) tried(l int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rung[l] = false
}

// next returns the next message in lane rotation, the lanes whose bell rang first, or nil when no lane
// has one ready: at most one fetch request per lane. A worker's routed calls come first.
func (f *laneFetcher) next(ctx context.Context) (jetstream.Msg, error) {
	if f.routed != nil {
		if msg, err := f.routed.next(ctx); msg != nil || err != nil {
			return msg, err
		}
	}
	for _, l := range f.order() {
		f.tried(l)
		cons, err := f.consumer(ctx, l)
		if err != nil {
			return nil, err
		}
		batch, err := cons.FetchNoWait(1)
		if err != nil {
			f.consumers[l] = nil // look it up again next time
			return nil, fmt.Errorf("fetch a call of lane %d: %w", l, err)
		}
		for msg := range batch.Messages() {
			f.turn = l + 1
			return msg, nil
		}
	}
	return nil, nil
}

// consumer returns lane l's durable consumer, which the dispatcher provisioned.
func (f *laneFetcher) consumer(ctx context.Context, l int) (jetstream.Consumer, error) {
	if cons := f.consumers[l]; cons != nil {
		return cons, nil
	}
	cfg := f.calls.cfg
	cons, err := f.calls.js.Consumer(ctx, cfg.Stream, cfg.laneConsumer(l))
	if err != nil {
		return nil, fmt.Errorf("find consumer %s (a dispatcher provisions it at start): %w", cfg.laneConsumer(l), err)
	}
	f.consumers[l] = cons
	return cons, nil
}

type delivery struct{ msg jetstream.Msg }

func (d delivery) Call() (*call.Call, error) {
	var c call.Call
	if err := json.Unmarshal(d.msg.Data(), &c); err != nil {
		return nil, fmt.Errorf("decode call: %w", err)
	}
	if tp := d.msg.Headers().Get("traceparent"); tp != "" && c.TraceParent == "" {
		c.TraceParent = tp
	}
	return &c, nil
}

func (d delivery) Attempt() uint64 {
	md, err := d.msg.Metadata()
	if err != nil {
		return 1
	}
	return md.NumDelivered
}

func (d delivery) InProgress(ctx context.Context) error { return d.msg.InProgress() }
func (d delivery) Ack(ctx context.Context) error        { return d.msg.DoubleAck(ctx) }
func (d delivery) Nak(ctx context.Context, delay time.Duration) error {
	return d.msg.NakWithDelay(delay)
}
func (d delivery) Term(ctx context.Context, reason string) error { return d.msg.TermWithReason(reason) }
