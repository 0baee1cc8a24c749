// Residents: a worker that keeps workspaces in object storage records itself as the resident of each
// workspace whose copy it just brought to the latest checkpoint, so that the dispatchers route the
// workspace's next calls to it (dispatcher.HomeRouter) instead of restoring the workspace elsewhere.

package worker

import (
	"context"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// Residents records where workspaces live: the writing half of queue.Residents.
type Residents interface {
	SetResident(ctx context.Context, tenant, workspace, worker string) error
}

// WithResidents makes the worker record itself as the resident of the workspaces it runs calls in, with
// WithCheckpoints (a shared workspaces directory has no resident: any worker has every workspace).
func WithResidents(r Residents) Option { return func(w *Worker) { w.residents = r } }

// residentTimeout bounds the write of a resident: routing is placement only, not worth holding a call.
const residentTimeout = 2 * time.Second

// noteResident records this worker as the resident of call c's workspaces, whose copies here are at
// their latest checkpoint: before c runs, so that a call queued once c's result is out is routed here.
// A write that fails is logged: the next call goes to the shared lanes, and runs correctly anywhere.
func (w *Worker) noteResident(ctx context.Context, c *call.Call) {
	if w.residents == nil || w.checkpoints == nil || w.onHeads(c) {
		return
	}
	names, _ := w.workspacesOf(c)
	ctx, cancel := context.WithTimeout(ctx, residentTimeout)
	defer cancel()
	for _, name := range names {
		if err := w.residents.SetResident(ctx, c.Tenant, name, w.cfg.ID); err != nil {
			w.log.WarnContext(ctx, "record this worker as the workspace's resident", "call_id", c.ID, "workspace", name, "error", err)
		}
	}
}
