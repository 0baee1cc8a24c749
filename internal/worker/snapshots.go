// Snapshots, forks and restores on checkpoints: with workspaces kept in object storage, these operations
// write heads (a snapshot's, a fork's, a restored workspace's) that name a checkpoint's tree, and copy no
// file; listings read the shared heads, so any worker answers for every workspace.

package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/checkpoint"
	"github.com/toolpool/toolpool/internal/workspace"
)

// onHeads reports whether call c is a workspace operation that runs on checkpoint heads (snapshot, fork,
// restore, with checkpoints): it runs under the homes of its workspaces, on no local copy (nothing is
// restored before it), and writes its own heads (nothing is checkpointed after it).
func (w *Worker) onHeads(c *call.Call) bool {
	if w.checkpoints == nil {
		return false
	}
	switch c.Tool {
	case workspace.OpSnapshot, workspace.OpFork, workspace.OpRestore:
		return true
	}
	return false
}

// headsOp runs workspace operation c on checkpoint heads, when workspaces are kept in object storage and
// c is one that does (snapshot, fork, restore, list, info); ok is false otherwise.
func (w *Worker) headsOp(ctx context.Context, c *call.Call, a workspace.Args) (out workspace.Output, ok bool, err error) {
	if w.checkpoints == nil {
		return out, false, nil
	}
	one := func(h checkpoint.Head, err error) (workspace.Output, bool, error) {
		if err != nil {
			return out, true, w.headsError(c, a, err)
		}
		inf, err := w.headInfo(ctx, c.Tenant, checkpoint.Named{Name: c.Workspace, Head: h}, nil)
		if c.Tool == workspace.OpFork {
			inf, err = w.headInfo(ctx, c.Tenant, checkpoint.Named{Name: a.To, Head: h}, []checkpoint.Named{})
		}
		out.Workspace = &inf
		return out, true, err
	}
	switch c.Tool {
	case workspace.OpSnapshot:
		if err := checkNames(c.Tenant, c.Workspace, a.Snapshot); err != nil {
			return out, true, err
		}
		return one(w.checkpoints.Snapshot(ctx, c.Tenant, c.Workspace, a.Snapshot))
	case workspace.OpFork:
		if err := checkNames(c.Tenant, c.Workspace, a.To); err != nil {
			return out, true, err
		}
		return one(w.checkpoints.Fork(ctx, c.Tenant, c.Workspace, a.Snapshot, a.To, w.admitFork(ctx, c, a)))
	case workspace.OpRestore:
		if err := checkNames(c.Tenant, c.Workspace, a.Snapshot); err != nil {
			return out, true, err
		}
		admit := func(h checkpoint.Head) error { return w.wsm.CheckCopy(c.Workspace, h.Bytes, c.Workspace, a.Snapshot) }
		return one(w.checkpoints.RestoreSnapshot(ctx, c.Tenant, c.Workspace, a.Snapshot, admit))
	case workspace.OpList:
		list, err := w.checkpoints.List(ctx, c.Tenant)
		if err != nil {
			return out, true, w.headsError(c, a, err)
		}
		out.Workspaces = make([]workspace.Info, 0, len(list))
		for _, l := range list {
			inf, _ := w.headInfo(ctx, c.Tenant, l.Named, l.Snapshots)
			out.Workspaces = append(out.Workspaces, inf)
		}
		return out, true, nil
	case workspace.OpInfo:
		// The copy restored before the operation ran says what is in it; the snapshots are the shared ones.
		inf, err := w.wsm.Info(ctx, c.Tenant, c.Workspace)
		if err != nil {
			return out, true, err
		}
		snaps, err := w.checkpoints.SnapshotsOf(ctx, c.Tenant, c.Workspace)
		if err != nil {
			return out, true, w.headsError(c, a, err)
		}
		inf.Snapshots = snapshotsOf(snaps)
		out.Workspace = &inf
		return out, true, nil
	}
	return out, false, nil
}

// admitFork refuses a fork of call c whose tree is over the workspace quota (too_large), or that would
// take the tenant past its number of workspaces (workspaces.max_per_tenant, quota_exceeded), counted from
// the shared heads.
func (w *Worker) admitFork(ctx context.Context, c *call.Call, a workspace.Args) func(checkpoint.Head) error {
	return func(h checkpoint.Head) error {
		if err := w.wsm.CheckCopy(a.To, h.Bytes, c.Workspace, a.Snapshot); err != nil {
			return err
		}
		max := w.cfg.Workspaces.MaxWorkspaces
		if max <= 0 {
			return nil
		}
		list, err := w.checkpoints.List(ctx, c.Tenant)
		if err != nil || len(list) < max {
			return err
		}
		slices.SortFunc(list, func(x, y checkpoint.Listed) int { return cmp.Compare(y.Head.Bytes, x.Head.Bytes) })
		var largest []string
		for _, l := range list[:min(5, len(list))] {
			largest = append(largest, fmt.Sprintf("%s (%s)", l.Name, workspace.FormatBytes(l.Head.Bytes)))
		}
		return &workspace.Error{Type: call.ErrQuota, Msg: fmt.Sprintf("tenant %s has %d workspaces, its limit (workspaces.max_per_tenant): remove one you no longer need (DELETE /v1/workspaces/{name}, or toolpool ws rm NAME) before forking; the largest: %s",
			c.Tenant, len(list), strings.Join(largest, ", "))}
	}
}

// headInfo describes workspace n as its head does: its files' bytes (not disk usage), its latest
// checkpoint as its last use. snaps are its snapshots; nil: read them.
func (w *Worker) headInfo(ctx context.Context, tenant string, n checkpoint.Named, snaps []checkpoint.Named) (workspace.Info, error) {
	inf := workspace.Info{Name: n.Name, Bytes: n.Head.Bytes, Files: int64(n.Head.Files), CreatedAt: n.Head.Created, LastUsedAt: n.Head.At}
	if inf.CreatedAt.IsZero() {
		inf.CreatedAt = n.Head.At // a head of an earlier version
	}
	if snaps == nil {
		var err error
		if snaps, err = w.checkpoints.SnapshotsOf(ctx, tenant, n.Name); err != nil {
			return inf, fmt.Errorf("read snapshots of workspace %s: %w", n.Name, err)
		}
	}
	inf.Snapshots = snapshotsOf(snaps)
	return inf, nil
}

func snapshotsOf(snaps []checkpoint.Named) []workspace.Snapshot {
	var out []workspace.Snapshot
	for _, s := range snaps {
		out = append(out, workspace.Snapshot{Name: s.Name, CreatedAt: s.Head.At})
	}
	return out
}

// headsError turns a refusal of an operation on heads into the workspace error the client acts on.
func (w *Worker) headsError(c *call.Call, a workspace.Args, err error) error {
	var we *workspace.Error
	switch {
	case errors.As(err, &we):
		return err
	case errors.Is(err, checkpoint.ErrNoWorkspace):
		return &workspace.Error{Type: call.ErrNotFound, Msg: fmt.Sprintf("there is no workspace %q: create it (PUT /v1/workspaces/%s) or list yours (GET /v1/workspaces)", c.Workspace, c.Workspace)}
	case errors.Is(err, checkpoint.ErrNoSnapshot):
		return &workspace.Error{Type: call.ErrNotFound, Msg: fmt.Sprintf("workspace %q has no snapshot %q: GET /v1/workspaces/%s lists its snapshots", c.Workspace, a.Snapshot, c.Workspace)}
	case errors.Is(err, checkpoint.ErrExists) && c.Tool == workspace.OpFork:
		return &workspace.Error{Type: workspace.TypeExists, Msg: fmt.Sprintf("workspace %q exists already: fork to a new name", a.To)}
	case errors.Is(err, checkpoint.ErrExists):
		return &workspace.Error{Type: workspace.TypeExists, Msg: fmt.Sprintf("workspace %q has a snapshot %q already: choose another name", c.Workspace, a.Snapshot)}
	case errors.Is(err, checkpoint.ErrOverBudget):
		return &workspace.Error{Type: call.ErrQuota, Msg: fmt.Sprintf("%s refused, nothing changed: %v", c.Tool, err)}
	}
	return &workspace.Error{Type: call.ErrCheckpoint, Msg: fmt.Sprintf("%s failed on the checkpoints in object storage, and nothing changed (%v): call again, later if the object storage is down", c.Tool, err)}
}

// checkNames refuses (invalid_params) a tenant or name that is not one.
func checkNames(tenant string, names ...string) error {
	if err := call.ValidateTenant(tenant); err != nil {
		return &workspace.Error{Type: call.ErrInvalidParams, Msg: err.Error()}
	}
	for _, n := range names {
		if err := call.ValidateName("workspace", n); err != nil {
			return &workspace.Error{Type: call.ErrInvalidParams, Msg: err.Error()}
		}
	}
	return nil
}
