// Homes: a call that may change a workspace kept in object storage runs only while its worker holds the
// workspace's home, so that such calls run one at a time across every worker, and each restores what the
// one before it checkpointed.

package worker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Homes is the workspaces' homes, on the queue server's clock: the whole of queue.Homes.
type Homes = queue.Homes

// WithHomes gives the worker the workspaces' homes; required with WithCheckpoints.
func WithHomes(h Homes) Option { return func(w *Worker) { w.homes = h } }

// How a call waits for a workspace another call holds: it tries again after homePoll, doubling up to
// homePollMax, and reads its own record every homeRecordEvery (a call cancelled or expired while it
// waits stops waiting, and is settled without running).
const (
	homePoll        = 10 * time.Millisecond
	homePollMax     = 250 * time.Millisecond
	homeRecordEvery = time.Second
	// homeReleaseTimeout bounds the release of homes, on a fresh context.
	homeReleaseTimeout = 5 * time.Second
)

// writers counts, by tenant/workspace, the calls of this worker that may change a workspace and hold its
// home: a call that does not change the workspace never restores this worker's copy under one of them
// (should that call's home have lapsed and another worker checkpointed meanwhile, a restore would replace
// the files it is changing, and its checkpoint would then pass the compare-and-set on the new revision).
type writers struct {
	mu sync.Mutex
	n  map[string]int
}

func (w *writers) add(tenant string, names []string, d int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == nil {
		w.n = map[string]int{}
	}
	for _, name := range names {
		if w.n[tenant+"/"+name] += d; w.n[tenant+"/"+name] == 0 {
			delete(w.n, tenant+"/"+name)
		}
	}
}

func (w *writers) busy(tenant, name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n[tenant+"/"+name] > 0
}

// heldHomes are the homes a call holds, renewed every heartbeat until released.
type heldHomes struct {
	leases []queue.Lease
	stop   context.CancelFunc
	wg     sync.WaitGroup
	done   func() // run once the homes are released
}

// release stops renewing the homes and gives them up. Safe on nil; idempotent.
func (h *heldHomes) release() {
	if h == nil || h.stop == nil {
		return
	}
	if h.done != nil {
		defer h.done()
	}
	h.stop()
	h.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), homeReleaseTimeout)
	defer cancel()
	for _, l := range h.leases {
		_ = l.Release(ctx) // one that fails lapses on its own
	}
	h.leases, h.stop = nil, nil
}

// homesOf returns the workspaces whose homes call c must hold to run: those it may change, or whose heads
// it writes (a snapshot), when workspaces are kept in object storage (a shared workspaces directory orders calls with its own locks),
// sorted, so that two calls that need the same two homes take them in one order.
func (w *Worker) homesOf(c *call.Call) []string {
	names, changes := w.workspacesOf(c)
	if w.checkpoints == nil || !changes && !w.onHeads(c) {
		return nil
	}
	names = slices.Clone(names)
	slices.Sort(names)
	return slices.Compact(names)
}

// takeHomes takes the homes of the workspaces call c may change, waiting while another call holds one (on
// this worker or another) and trying again with a growing pause. It returns the homes, renewed every
// heartbeat until released (nil when c needs none), and false when ctx ended first. A call cancelled or
// past its deadline while it waits stops waiting and gets no home: it is settled without running.
func (w *Worker) takeHomes(ctx context.Context, c *call.Call) (*heldHomes, bool) {
	names := w.homesOf(c)
	if len(names) == 0 {
		return nil, true
	}
	pause, lastRecord, waiting := homePoll, time.Now(), false
	for {
		leases, busy, err := w.tryHomes(ctx, c.Tenant, names)
		if err == nil {
			if waiting {
				w.log.InfoContext(ctx, "workspace free: the call runs", "call_id", c.ID, "workspace", c.Workspace)
			}
			h := w.keepHomes(ctx, leases)
			w.writing.add(c.Tenant, names, 1)
			h.done = func() { w.writing.add(c.Tenant, names, -1) }
			return h, true
		}
		if !waiting {
			waiting = true
			holder, _ := w.homes.HomeOf(ctx, c.Tenant, busy)
			w.log.InfoContext(ctx, "workspace busy with another call: waiting for it", "call_id", c.ID, "workspace", busy,
				"held_by", holder, "error", err)
		}
		if time.Since(lastRecord) >= homeRecordEvery {
			lastRecord = time.Now()
			if w.settledWhileWaiting(ctx, c) {
				return nil, true
			}
		}
		select {
		case <-ctx.Done():
			return nil, false
		case <-time.After(pause):
		}
		pause = min(2*pause, homePollMax)
	}
}

// tryHomes takes every home of names or none: it returns the leases, or the name it could not take and
// why (queue.ErrExists: another call holds it).
func (w *Worker) tryHomes(ctx context.Context, tenant string, names []string) ([]queue.Lease, string, error) {
	var leases []queue.Lease
	for _, name := range names {
		l, err := w.homes.AcquireHome(ctx, tenant, name, w.cfg.ID, w.cfg.Lease)
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), homeReleaseTimeout)
			for _, l := range leases {
				_ = l.Release(rctx)
			}
			cancel()
			return nil, name, err
		}
		leases = append(leases, l)
	}
	return leases, "", nil
}

// settledWhileWaiting reports whether call c needs to wait no longer: cancelled, past its deadline or
// final already (process settles it without running).
func (w *Worker) settledWhileWaiting(ctx context.Context, c *call.Call) bool {
	if !c.Deadline.IsZero() && w.now().After(c.Deadline) {
		return true
	}
	rec, err := w.store.Get(ctx, c.ID)
	return err == nil && (rec.Result.Status.Terminal() || rec.Result.CancelRequested)
}

// keepHomes renews leases every heartbeat until released. A home that cannot be renewed (it lapsed: this
// worker stalled, and another may have taken it) is logged; the checkpoint's compare-and-set then keeps
// this call's changes from replacing a newer checkpoint.
func (w *Worker) keepHomes(ctx context.Context, leases []queue.Lease) *heldHomes {
	ctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	h := &heldHomes{leases: leases, stop: stop}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(w.cfg.Heartbeat)
		defer t.Stop()
		attempt, _ := renewTimeouts(w.cfg.Heartbeat)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for _, l := range leases {
				rctx, cancel := context.WithTimeout(ctx, attempt)
				err := l.Renew(rctx)
				cancel()
				if errors.Is(err, queue.ErrConflict) {
					w.log.WarnContext(ctx, "a workspace's home lapsed while its call ran: its changes are kept only if no other worker checkpointed it meanwhile", "error", err)
				}
			}
		}
	}()
	return h
}

// SaveUnsaved checkpoints again the workspaces whose checkpoint failed, each under its home: one whose
// home another call holds is left to that call's checkpoint (on this worker, it saves the same copy) or
// to the next round. A worker calls it from time to time, and once more when it stops. It returns the
// errors of the checkpoints that failed again.
func (w *Worker) SaveUnsaved(ctx context.Context) error {
	if w.checkpoints == nil {
		return nil
	}
	var errs []error
	for _, ws := range w.checkpoints.Unsaved() {
		leases, _, err := w.tryHomes(ctx, ws.Tenant, []string{ws.Name})
		if errors.Is(err, queue.ErrExists) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		h := w.keepHomes(ctx, leases)
		if _, err := w.checkpoints.Save(ctx, ws.Tenant, ws.Name); err != nil {
			errs = append(errs, err)
		}
		h.release()
	}
	return errors.Join(errs...)
}
