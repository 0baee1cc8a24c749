package dispatcher

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// Routing: a call that names a workspace is queued for the workspace's resident worker (the one that
// holds its latest copy, docs/workspaces.md#homes-and-routing) while that worker is alive, so that a
// workspace's calls run where its files are instead of restoring them elsewhere. Every other call goes to
// the shared lanes, which any worker with a free slot takes. Routing is placement only: the workspace's
// home lease and the record's compare-and-set keep a call correct on any worker.

// Residence is where workspaces live and which workers are alive: the reads of queue.Residents that
// routing needs.
type Residence interface {
	ResidentOf(ctx context.Context, tenant, workspace string) (string, error)
	Alive(ctx context.Context, worker string) (bool, error)
}

// RoutedQueue takes a call for the shared lanes (Publish) or for one worker (PublishTo): the publishing
// half of queue.Calls.
type RoutedQueue interface {
	Publish(ctx context.Context, c *call.Call) error
	PublishTo(ctx context.Context, c *call.Call, worker string) error
}

// presenceCacheFor is how long the router trusts a worker's presence it read: a call routed meanwhile to
// a worker that just died is taken by another worker from the dead one's queue.
const presenceCacheFor = time.Second

// routeReadTimeout bounds the reads of one routing decision (a few milliseconds when NATS is well): one
// that takes longer (a leader election) sends the call to the shared lanes rather than hold it.
const routeReadTimeout = time.Second

// HomeRouter is a Publisher that routes each call naming a workspace to the workspace's live resident,
// and every other call to the shared lanes. Its decision costs one read of the workspace's resident, and
// of the resident's presence at most once a second per worker; a read that fails sends the call to the
// shared lanes (placement is never worth refusing a call). Safe for concurrent use.
type HomeRouter struct {
	q   RoutedQueue
	res Residence
	now func() time.Time

	mu     sync.Mutex
	alive  map[string]presence // by worker, read within presenceCacheFor
	routed atomic.Uint64
	shared atomic.Uint64
}

type presence struct {
	alive bool
	read  time.Time
}

// NewHomeRouter routes calls over q by res.
func NewHomeRouter(q RoutedQueue, res Residence) *HomeRouter {
	return &HomeRouter{q: q, res: res, now: time.Now, alive: map[string]presence{}}
}

// Publish queues c for its workspace's live resident, else on the shared lanes. Its errors are the
// queue's (Publisher).
func (r *HomeRouter) Publish(ctx context.Context, c *call.Call) error {
	if worker := r.home(ctx, c); worker != "" {
		r.routed.Add(1)
		return r.q.PublishTo(ctx, c, worker)
	}
	r.shared.Add(1)
	return r.q.Publish(ctx, c)
}

// Counts returns how many calls were routed to a workspace's resident and how many to the shared lanes.
func (r *HomeRouter) Counts() (routed, shared uint64) { return r.routed.Load(), r.shared.Load() }

// home returns the live resident of c's workspace; "" (the shared lanes) for a call that names no
// workspace, a workspace with no resident or whose resident is gone, and a read that failed or took
// longer than routeReadTimeout.
func (r *HomeRouter) home(ctx context.Context, c *call.Call) string {
	if c.Workspace == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, routeReadTimeout)
	defer cancel()
	worker, err := r.res.ResidentOf(ctx, c.Tenant, c.Workspace)
	if err != nil || worker == "" {
		return ""
	}
	if r.isAlive(ctx, worker) {
		return worker
	}
	return ""
}

// isAlive reads worker's presence, or takes it from the cache while it is younger than presenceCacheFor.
func (r *HomeRouter) isAlive(ctx context.Context, worker string) bool {
	now := r.now()
	r.mu.Lock()
	p, ok := r.alive[worker]
	r.mu.Unlock()
	if ok && now.Sub(p.read) < presenceCacheFor {
		return p.alive
	}
	alive, err := r.res.Alive(ctx, worker)
	if err != nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.alive) > 4096 { // workers come and go: forget them all rather than grow
		clear(r.alive)
	}
	r.alive[worker] = presence{alive: alive, read: now}
	return alive
}
