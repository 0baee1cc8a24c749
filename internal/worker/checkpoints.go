// Checkpoints: a worker that keeps workspaces in object storage brings a call's workspace to its latest
// checkpoint before the call runs, and checkpoints what the call changed before its result is recorded,
// so that workers with workspaces directories of their own see one workspace.

package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/checkpoint"
	"github.com/toolpool/toolpool/internal/workspace"
)

// Checkpoints keeps workspaces in object storage: internal/checkpoint's Checkpointer.
type Checkpoints interface {
	// Restore brings this worker's copy of a workspace to its latest checkpoint.
	Restore(ctx context.Context, tenant, name string) (checkpoint.Result, error)
	// Save checkpoints what changed in this worker's copy of a workspace; checkpoint.ErrStale when another
	// worker checkpointed it since this copy was restored.
	Save(ctx context.Context, tenant, name string) (checkpoint.Result, error)
	// Unsaved returns the workspaces whose last Save failed.
	Unsaved() []checkpoint.Workspace
	// Snapshot, Fork and RestoreSnapshot run those operations on heads, copying nothing (snapshots.go).
	Snapshot(ctx context.Context, tenant, name, snap string) (checkpoint.Head, error)
	Fork(ctx context.Context, tenant, name, snap, to string, admit func(checkpoint.Head) error) (checkpoint.Head, error)
	RestoreSnapshot(ctx context.Context, tenant, name, snap string, admit func(checkpoint.Head) error) (checkpoint.Head, error)
	// SetImage records a workspace's default image in its latest checkpoint.
	SetImage(ctx context.Context, tenant, name, image string) (checkpoint.Head, error)
	// SnapshotsOf and List read the shared heads: a workspace's snapshots, a tenant's workspaces.
	SnapshotsOf(ctx context.Context, tenant, name string) ([]checkpoint.Named, error)
	List(ctx context.Context, tenant string) ([]checkpoint.Listed, error)
}

// WithCheckpoints makes the worker keep workspaces in object storage (with WithHomes: calls that may
// change a workspace run one at a time across workers); without it a workspace lives only in the
// workspaces directory (which workers may share).
func WithCheckpoints(cp Checkpoints) Option { return func(w *Worker) { w.checkpoints = cp } }

// workspacesOf returns the workspaces call c runs in or operates on, and whether it may change them.
func (w *Worker) workspacesOf(c *call.Call) (names []string, changes bool) {
	if c.Workspace == "" {
		return nil, false
	}
	if !workspace.IsOp(c.Tool) {
		tool, ok := w.tools.Lookup(c.Tool)
		return []string{c.Workspace}, !ok || !tool.ReadOnly()
	}
	switch c.Tool {
	case workspace.OpList:
		return nil, false
	case workspace.OpInfo, workspace.OpReadFile, workspace.OpArchive, workspace.OpSnapshot:
		return []string{c.Workspace}, false
	case workspace.OpFork:
		var a workspace.Args
		if json.Unmarshal(c.Args, &a) == nil && a.To != "" {
			return []string{c.Workspace, a.To}, true
		}
	}
	return []string{c.Workspace}, true
}

// restoreFor brings call c's workspaces to their latest checkpoints, and notes the time it took in r. It
// returns the call's error when one could not be: the call must not run on a copy that may be old, and
// nothing ran.
func (w *Worker) restoreFor(ctx context.Context, c *call.Call, r *call.Result) *call.ErrorInfo {
	if w.checkpoints == nil || w.onHeads(c) {
		return nil
	}
	start := time.Now()
	defer func() { r.Timing.RestoreMS = time.Since(start).Milliseconds() }()
	names, changes := w.workspacesOf(c)
	for _, name := range names {
		if !changes && w.writing.busy(c.Tenant, name) {
			// A call of this worker is changing the workspace: this one reads that call's copy, as a
			// process on one machine would, and never restores it under that call (homes.go, writers).
			continue
		}
		res, err := w.checkpoints.Restore(ctx, c.Tenant, name)
		if err != nil {
			w.log.ErrorContext(ctx, "restore workspace", "call_id", c.ID, "workspace", name, "error", err)
			return &call.ErrorInfo{Type: call.ErrCheckpoint, Message: fmt.Sprintf(
				"toolpool did not run this call: workspace %q could not be brought to its latest checkpoint from object storage (%v). Nothing ran and the checkpoint is unchanged; call again, later if the object storage is down.",
				name, err)}
		}
		if h := res.Head; h.ImageKept && !h.Deleted {
			// The workspace's default image travels with its checkpoints: set on another worker, it is
			// this copy's too before the call reads it.
			if err := w.keepImage(c.Tenant, name, h.Image); err != nil {
				w.log.ErrorContext(ctx, "restore workspace image", "call_id", c.ID, "workspace", name, "error", err)
				return &call.ErrorInfo{Type: call.ErrCheckpoint, Message: fmt.Sprintf(
					"toolpool did not run this call: the default image of workspace %q in its latest checkpoint could not be recorded on worker %s (%v). Nothing ran; call again.",
					name, w.cfg.ID, err)}
			}
		}
		if res.Changed {
			w.wsm.ForgetSize(c.Tenant, name) // its quota is measured again, on the tree as restored
			w.log.InfoContext(ctx, "workspace restored from its checkpoint", "call_id", c.ID, "workspace", name, "seq", res.Head.Seq,
				"written_by", res.Head.Worker, "files", res.Files, "bytes", res.Bytes, "took", res.Took)
		}
	}
	return nil
}

// saveTimeout bounds the checkpoint of a call's changes: a store that stops answering fails the
// checkpoint (checkpoint_failed, retried later) rather than hold the call's result forever.
const saveTimeout = 10 * time.Minute

// checkpointAfter checkpoints what call c may have changed in its workspaces, before its result r is
// recorded. A checkpoint that fails turns r into an error that says so: the call ran, and its changes
// are only on this worker until a later Save stores them.
func (w *Worker) checkpointAfter(ctx context.Context, c *call.Call, r *call.Result) {
	names, changes := w.workspacesOf(c)
	if w.checkpoints == nil || !changes || w.onHeads(c) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, saveTimeout)
	defer cancel()
	start := time.Now()
	defer func() {
		r.Timing.CheckpointMS = time.Since(start).Milliseconds()
		r.FinishedAt = w.now()
		r.Timing.TotalMS = r.FinishedAt.Sub(c.CreatedAt).Milliseconds()
	}()
	for _, name := range names {
		res, err := w.checkpoints.Save(ctx, c.Tenant, name)
		if err != nil {
			w.log.ErrorContext(ctx, "checkpoint workspace", "call_id", c.ID, "workspace", name, "error", err)
			msg := fmt.Sprintf("the call ran, but the changes it made to workspace %q could not be checkpointed to object storage (%v): "+
				"they are kept on worker %s, which checkpoints them again within a minute, with its next call into the workspace, or as it stops; until then other workers do not see them. "+
				"Call again (a read-only call does not retry the checkpoint), later if the object storage is down.", name, err, w.cfg.ID)
			if errors.Is(err, checkpoint.ErrOverBudget) {
				msg = fmt.Sprintf("the call ran, but the changes it made to workspace %q were not checkpointed, and nothing of them was stored, because they go over a checkpoint budget (%v): "+
					"they are kept on worker %s only, and other workers do not see them. Remove files (or ask the operator to raise the budget); "+
					"the next call that may write checkpoints the workspace once it is under the budget.", name, err, w.cfg.ID)
			}
			if errors.Is(err, checkpoint.ErrStale) {
				msg = fmt.Sprintf("the call ran, but the changes it made to workspace %q are not kept: while it ran, another worker checkpointed the workspace "+
					"(worker %s's hold on it lapsed: it stalled or lost NATS), and changes made on an older copy never replace a newer checkpoint (%v). "+
					"Look at the workspace as it is now and call again.", name, w.cfg.ID, err)
			}
			note := r.Output != ""
			r.Fail(call.StatusError, call.ErrCheckpoint, msg)
			if note {
				r.Output += "\n[toolpool: " + msg + "]"
			}
			return
		}
		if err := w.saveImage(ctx, c.Tenant, name, res.Head); err != nil {
			w.log.ErrorContext(ctx, "checkpoint workspace image", "call_id", c.ID, "workspace", name, "error", err)
			msg := fmt.Sprintf("the call ran and its changes to workspace %q were checkpointed, but the workspace's default image could not be recorded in its checkpoint (%v): "+
				"other workers run its calls on the image they knew. Set the image again (PATCH /v1/workspaces/%s).", name, err, name)
			note := r.Output != ""
			r.Fail(call.StatusError, call.ErrCheckpoint, msg)
			if note {
				r.Output += "\n[toolpool: " + msg + "]"
			}
			return
		}
		if res.Changed {
			w.log.DebugContext(ctx, "workspace checkpointed", "call_id", c.ID, "workspace", name, "seq", res.Head.Seq,
				"files", res.Files, "chunks", res.Chunks, "bytes", res.Bytes, "took", res.Took)
		}
	}
}

// keepImage records image as workspace name's default image on this worker, when it differs.
func (w *Worker) keepImage(tenant, name, image string) error {
	local, err := w.wsm.ImageOf(tenant, name)
	if err != nil || local == image {
		return err
	}
	return w.wsm.KeepImage(tenant, name, image)
}

// saveImage records this worker's default image of workspace name in its latest checkpoint h, when it
// differs (a call or operation here set it, or the checkpoint is of an earlier version that kept none).
func (w *Worker) saveImage(ctx context.Context, tenant, name string, h checkpoint.Head) error {
	if h.Tree == "" || h.Deleted {
		return nil
	}
	local, err := w.wsm.ImageOf(tenant, name)
	if err != nil || h.ImageKept && h.Image == local || !h.ImageKept && local == "" {
		return err
	}
	_, err = w.checkpoints.SetImage(ctx, tenant, name, local)
	return err
}
