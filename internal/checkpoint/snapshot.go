// Snapshots, forks and restores on checkpoints: each names a checkpoint's root tree in a head, and moves
// no data (content-addressed chunks and trees are shared by every head that names them).

package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
)

// Refusals of the operations on heads; each error wraps one, with what to do.
var (
	// ErrNoWorkspace: the workspace has no checkpoint (it does not exist, or was deleted).
	ErrNoWorkspace = errors.New("no such workspace")
	// ErrNoSnapshot: the workspace has no snapshot of that name.
	ErrNoSnapshot = errors.New("no such snapshot")
	// ErrExists: the name is taken (a snapshot of the workspace, or the workspace a fork would make).
	ErrExists = errors.New("the name is taken")
)

// Snapshot records workspace name's latest checkpoint as its snapshot snap, copying nothing; it returns
// the snapshot's head (At: when it was taken). A workspace whose last Save on this worker failed is
// checkpointed first, so the snapshot holds what its calls wrote. The caller holds the workspace's home.
func (c *Checkpointer) Snapshot(ctx context.Context, tenant, name, snap string) (Head, error) {
	h, _, err := c.current(ctx, tenant, name)
	if err != nil {
		return Head{}, fmt.Errorf("snapshot workspace %s/%s: %w", tenant, name, err)
	}
	h.At, h.Worker = c.cfg.Now().UTC(), c.cfg.Worker
	b, _ := json.Marshal(h)
	created, err := c.heads.CreateSnapshot(ctx, tenant, name, snap, b)
	if err != nil {
		return Head{}, fmt.Errorf("snapshot workspace %s/%s: %w", tenant, name, err)
	}
	if !created {
		return Head{}, fmt.Errorf("snapshot workspace %s/%s: %w: it has a snapshot %q already", tenant, name, ErrExists, snap)
	}
	return h, nil
}

// Fork makes the new workspace to a copy of workspace name's latest checkpoint (of its snapshot snap, when
// not empty) by writing to's head, copying nothing; it returns that head. The fork is checked against
// the checkpoint budgets (ErrOverBudget) and by admit, when not nil, which may refuse the source's head
// (its error is returned as it is). The caller holds both workspaces' homes.
func (c *Checkpointer) Fork(ctx context.Context, tenant, name, snap, to string, admit func(Head) error) (Head, error) {
	src, err := c.source(ctx, tenant, name, snap, admit)
	if err != nil {
		return Head{}, wrapUnlessAdmit(err, "fork workspace %s/%s: %w", tenant, name)
	}
	st := c.state(tenant, to)
	defer st.mu.Unlock()
	old, rev, ok, err := c.readHead(ctx, tenant, to)
	if err != nil {
		return Head{}, fmt.Errorf("fork workspace %s/%s: %w", tenant, name, err)
	}
	if ok && !old.Deleted {
		return Head{}, fmt.Errorf("fork workspace %s/%s: %w: workspace %q exists already", tenant, name, ErrExists, to)
	}
	undo, err := c.reserve(ctx, tenant, to, src.Bytes)
	if err != nil {
		return Head{}, fmt.Errorf("fork workspace %s/%s: %w", tenant, name, err)
	}
	written := false
	defer func() {
		if !written && undo != nil {
			undo()
		}
	}()
	if ok {
		// A deleted workspace's snapshots went with it; these stayed if that failed.
		if err := c.heads.DeleteSnapshots(ctx, tenant, to); err != nil {
			return Head{}, fmt.Errorf("fork workspace %s/%s: %w", tenant, name, err)
		}
	}
	now := c.cfg.Now().UTC()
	h := Head{Tree: src.Tree, Seq: old.Seq + 1, Worker: c.cfg.Worker, At: now, Files: src.Files, Bytes: src.Bytes, Created: now,
		Image: src.Image, ImageKept: src.ImageKept}
	if err := c.swap(ctx, tenant, to, h, rev); err != nil {
		return Head{}, fmt.Errorf("fork workspace %s/%s: %w", tenant, name, err)
	}
	written = true
	return h, nil
}

// RestoreSnapshot moves workspace name's head to its snapshot snap's tree, copying nothing, and returns
// the new head; the snapshot stays. The head is written by compare-and-set: the restore replaces the
// latest checkpoint, changes a failed Save left on this worker included. Each worker's copy is brought to
// it by its next Restore, which fetches only what differs. It is checked against the checkpoint budgets
// (ErrOverBudget) and by admit, as Fork's. The caller holds the workspace's home.
func (c *Checkpointer) RestoreSnapshot(ctx context.Context, tenant, name, snap string, admit func(Head) error) (Head, error) {
	if snap == "" {
		return Head{}, fmt.Errorf("restore workspace %s/%s: %w \"\"", tenant, name, ErrNoSnapshot)
	}
	src, err := c.source(ctx, tenant, name, snap, admit)
	if err != nil {
		return Head{}, wrapUnlessAdmit(err, "restore workspace %s/%s: %w", tenant, name)
	}
	st := c.state(tenant, name)
	defer st.mu.Unlock()
	cur, rev, ok, err := c.readHead(ctx, tenant, name)
	if err != nil {
		return Head{}, fmt.Errorf("restore workspace %s/%s: %w", tenant, name, err)
	}
	if !ok || cur.Deleted {
		return Head{}, fmt.Errorf("restore workspace %s/%s: %w", tenant, name, ErrNoWorkspace)
	}
	undo, err := c.reserve(ctx, tenant, name, src.Bytes)
	if err != nil {
		return Head{}, fmt.Errorf("restore workspace %s/%s: %w", tenant, name, err)
	}
	h := Head{Tree: src.Tree, Seq: cur.Seq + 1, Worker: c.cfg.Worker, At: c.cfg.Now().UTC(), Files: src.Files, Bytes: src.Bytes, Created: cur.Created,
		Image: cur.Image, ImageKept: cur.ImageKept} // the image is the workspace's, not the snapshot's
	if err := c.swap(ctx, tenant, name, h, rev); err != nil {
		if undo != nil {
			undo()
		}
		return Head{}, fmt.Errorf("restore workspace %s/%s: %w", tenant, name, err)
	}
	// This copy's changes that no Save stored are replaced by the snapshot: no retry saves them.
	st.unsavedSince.Store(0)
	return h, nil
}

// SetImage records image ("" for none) as workspace name's default image in its latest checkpoint, by
// compare-and-set, so that every worker that brings a copy to it (Restore's Result.Head) runs its calls on
// it; a checkpoint that has it already is left as it is. ErrNoWorkspace when the workspace has no
// checkpoint or was deleted. The caller holds the workspace's home.
func (c *Checkpointer) SetImage(ctx context.Context, tenant, name, image string) (Head, error) {
	st := c.state(tenant, name)
	defer st.mu.Unlock()
	h, rev, ok, err := c.readHead(ctx, tenant, name)
	if err != nil {
		return Head{}, fmt.Errorf("set image of workspace %s/%s: %w", tenant, name, err)
	}
	if !ok || h.Deleted {
		return Head{}, fmt.Errorf("set image of workspace %s/%s: %w", tenant, name, ErrNoWorkspace)
	}
	if h.ImageKept && h.Image == image {
		return h, nil
	}
	was := h
	h.Image, h.ImageKept, h.Seq, h.Worker, h.At = image, true, h.Seq+1, c.cfg.Worker, c.cfg.Now().UTC()
	b, _ := json.Marshal(h)
	newRev, swapped, err := c.heads.SwapHead(ctx, tenant, name, b, rev)
	if err != nil {
		return Head{}, fmt.Errorf("set image of workspace %s/%s: store head: %w", tenant, name, err)
	}
	if !swapped {
		return Head{}, fmt.Errorf("set image of workspace %s/%s: %w (workspace %s): try again", tenant, name, ErrStale, name)
	}
	if st.head == was && st.headRev == rev {
		st.head, st.headRev = h, newRev // this copy is at the new head: its tree did not change
	}
	return h, nil
}

// swap writes h as the head of tenant's workspace name at revision rev; ErrStale when it moved on.
func (c *Checkpointer) swap(ctx context.Context, tenant, name string, h Head, rev uint64) error {
	b, _ := json.Marshal(h)
	_, swapped, err := c.heads.SwapHead(ctx, tenant, name, b, rev)
	if err != nil {
		return fmt.Errorf("store head: %w", err)
	}
	if !swapped {
		return fmt.Errorf("%w (workspace %s): try again", ErrStale, name)
	}
	return nil
}

// current returns workspace name's latest checkpoint and its revision, after checkpointing what a failed
// Save left on this worker.
func (c *Checkpointer) current(ctx context.Context, tenant, name string) (Head, uint64, error) {
	st := c.state(tenant, name)
	defer st.mu.Unlock()
	if st.unsavedSince.Load() != 0 {
		if _, err := c.save(ctx, tenant, name, st); err != nil {
			return Head{}, 0, err
		}
	}
	h, rev, ok, err := c.readHead(ctx, tenant, name)
	if err != nil {
		return Head{}, 0, err
	}
	if !ok || h.Deleted {
		return Head{}, 0, ErrNoWorkspace
	}
	return h, rev, nil
}

// admitError is an admit function's refusal, returned as it is.
type admitError struct{ error }

func (e admitError) Unwrap() error { return e.error }

// wrapUnlessAdmit wraps err with format (the tenant and workspace, then err), unless admit refused.
func wrapUnlessAdmit(err error, format, tenant, name string) error {
	var a admitError
	if errors.As(err, &a) {
		return a.error
	}
	return fmt.Errorf(format, tenant, name, err)
}

// source returns the head a fork or restore copies: snapshot snap of workspace name, or (snap empty) its
// latest checkpoint, once admit (when not nil) let it through.
func (c *Checkpointer) source(ctx context.Context, tenant, name, snap string, admit func(Head) error) (h Head, err error) {
	if snap == "" {
		h, _, err = c.current(ctx, tenant, name)
	} else {
		h, err = c.snapshot(ctx, tenant, name, snap)
	}
	if err == nil && admit != nil {
		if aerr := admit(h); aerr != nil {
			return Head{}, admitError{aerr}
		}
	}
	return h, err
}

// snapshot returns snapshot snap of workspace name.
func (c *Checkpointer) snapshot(ctx context.Context, tenant, name, snap string) (Head, error) {
	snaps, err := c.SnapshotsOf(ctx, tenant, name)
	if err != nil {
		return Head{}, err
	}
	for _, s := range snaps {
		if s.Name == snap {
			return s.Head, nil
		}
	}
	return Head{}, fmt.Errorf("%w %q of workspace %q", ErrNoSnapshot, snap, name)
}

// Named is a workspace's snapshot, or a workspace, as its head describes it.
type Named struct {
	Name string
	Head Head
}

// SnapshotsOf returns workspace name's snapshots, by name.
func (c *Checkpointer) SnapshotsOf(ctx context.Context, tenant, name string) ([]Named, error) {
	all, err := c.heads.Snapshots(ctx, tenant)
	if err != nil {
		return nil, err
	}
	return named(all[name])
}

// Listed is a workspace as its latest checkpoint describes it, with its snapshots.
type Listed struct {
	Named
	Snapshots []Named
}

// List returns every workspace of tenant that has a checkpoint and is not deleted, by name, whichever
// worker wrote it: two reads of the heads, none of the trees.
func (c *Checkpointer) List(ctx context.Context, tenant string) ([]Listed, error) {
	heads, err := c.tenantHeads(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("list workspaces of %s: %w", tenant, err)
	}
	snaps, err := c.heads.Snapshots(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("list workspaces of %s: %w", tenant, err)
	}
	ws, err := named(heads)
	if err != nil {
		return nil, fmt.Errorf("list workspaces of %s: %w", tenant, err)
	}
	out := []Listed{}
	for _, w := range ws {
		if w.Head.Deleted {
			continue
		}
		s, err := named(snaps[w.Name])
		if err != nil {
			return nil, fmt.Errorf("list workspaces of %s: %w", tenant, err)
		}
		out = append(out, Listed{Named: w, Snapshots: s})
	}
	return out, nil
}

// named decodes heads by name, sorted by name.
func named(heads map[string][]byte) ([]Named, error) {
	out := make([]Named, 0, len(heads))
	for n, b := range heads {
		var h Head
		if err := json.Unmarshal(b, &h); err != nil || !isDigest(h.Tree) {
			return nil, fmt.Errorf("read head %q: not a checkpoint head", n)
		}
		out = append(out, Named{Name: n, Head: h})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
