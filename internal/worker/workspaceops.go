package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/workspace"
)

// Workspace operations travel as calls whose tool is one of WorkspaceOps: the dispatcher decides, records,
// audits and queues them like any call, and the worker that takes one runs it on the host with package
// workspace (every path opened beneath the workspace without following links) instead of in a container.
// Archives travel through the output store: an upload names the object the dispatcher stored, a download
// answers with the object this worker stored.

// Transfers opens objects of the output store, the archives that dispatchers stored for uploads: the
// OpenOutput of queue.Outputs.
type Transfers interface {
	OpenOutput(ctx context.Context, name string, offset int64) (io.ReadCloser, error)
}

// WithTransfers lets the worker read uploaded archives; without it, uploads fail.
func WithTransfers(t Transfers) Option { return func(w *Worker) { w.transfers = t } }

// SweepWorkspaces removes the workspaces unused for longer than the configured idle TTL; cmd/worker runs
// it periodically. Several workers sweeping one shared directory is safe.
func (w *Worker) SweepWorkspaces(ctx context.Context) ([]string, error) { return w.wsm.Sweep(ctx) }

// runWorkspaceOp runs workspace operation c and returns its JSON output, or the error to report, and the
// connections its egress proxy made (a clone's).
func (w *Worker) runWorkspaceOp(ctx context.Context, c *call.Call) (string, []call.EgressConn, *call.ErrorInfo) {
	var a workspace.Args
	if err := json.Unmarshal(c.Args, &a); err != nil {
		return "", nil, &call.ErrorInfo{Type: call.ErrInvalidParams, Message: "workspace operation arguments: " + err.Error()}
	}
	if t := time.Duration(c.Limits.TimeoutMS) * time.Millisecond; t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	var conns []call.EgressConn
	out, err := w.workspaceOp(ctx, c, a, &conns)
	if a.Archive != "" && w.outputs != nil {
		// The upload is consumed whatever the outcome; a failed delete leaves it to the store's TTL.
		_ = w.outputs.DeleteOutput(context.WithoutCancel(ctx), a.Archive)
	}
	if err != nil {
		var we *workspace.Error
		if errors.As(err, &we) {
			return "", conns, &call.ErrorInfo{Type: we.Type, Message: we.Msg}
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return "", conns, &call.ErrorInfo{Type: call.ErrTimeout, Message: "the workspace operation did not finish within its timeout (it waits for calls running in the workspace to end): " + err.Error()}
		}
		return "", conns, &call.ErrorInfo{Type: call.ErrInternal, Message: fmt.Sprintf("toolpool failed the workspace operation: %v", err)}
	}
	b, _ := json.Marshal(out)
	return string(b), conns, nil
}

// workspaceOp runs operation c.Tool; a clone's egress connections go to conns.
func (w *Worker) workspaceOp(ctx context.Context, c *call.Call, a workspace.Args, conns *[]call.EgressConn) (workspace.Output, error) {
	var out workspace.Output
	one := func(inf workspace.Info, err error) (workspace.Output, error) {
		out.Workspace = &inf
		return out, err
	}
	if out, ok, err := w.headsOp(ctx, c, a); ok {
		return out, err
	}
	if (c.Tool == workspace.OpReadFile || c.Tool == workspace.OpArchive) && w.outputs == nil {
		return out, errors.New("this worker has no output store to send files through")
	}
	switch c.Tool {
	case workspace.OpCreate:
		if a.Archive == "" {
			return one(w.withImage(ctx, c, a.Image)(w.wsm.Create(ctx, c.Tenant, c.Workspace, nil)))
		}
		f, err := w.fetchArchive(ctx, a.Archive)
		if err != nil {
			return out, err
		}
		defer cleanupTemp(f)
		return one(w.withImage(ctx, c, a.Image)(w.wsm.Create(ctx, c.Tenant, c.Workspace, f)))
	case workspace.OpClone:
		if a.Git == nil {
			return out, &workspace.Error{Type: call.ErrInvalidParams, Msg: `no git source: send {"git": {"url": "https://...", "ref": "..."}}`}
		}
		return one(w.withImage(ctx, c, a.Image)(w.wsm.CreateFrom(ctx, c.Tenant, c.Workspace, func(ctx context.Context, dir string, lim workspace.Limits) error {
			var err error
			*conns, err = w.exec.Clone(ctx, c, *a.Git, dir, lim)
			return err
		})))
	case workspace.OpUpload:
		f, err := w.fetchArchive(ctx, a.Archive)
		if err != nil {
			return out, err
		}
		defer cleanupTemp(f)
		return one(w.wsm.Upload(ctx, c.Tenant, c.Workspace, a.Path, f))
	case workspace.OpList:
		list, err := w.wsm.List(ctx, c.Tenant)
		out.Workspaces = list
		return out, err
	case workspace.OpInfo:
		return one(w.wsm.Info(ctx, c.Tenant, c.Workspace))
	case workspace.OpSnapshot:
		return one(w.wsm.Snapshot(ctx, c.Tenant, c.Workspace, a.Snapshot))
	case workspace.OpFork:
		return one(w.wsm.Fork(ctx, c.Tenant, c.Workspace, a.Snapshot, a.To))
	case workspace.OpRestore:
		return one(w.wsm.Restore(ctx, c.Tenant, c.Workspace, a.Snapshot))
	case workspace.OpDelete:
		return out, w.wsm.Delete(ctx, c.Tenant, c.Workspace)
	case workspace.OpSetImage:
		return one(w.wsm.SetImage(ctx, c.Tenant, c.Workspace, a.Image))
	case workspace.OpReadFile:
		out.Object = c.ID + "/file"
		err := w.wsm.ReadFile(ctx, c.Tenant, c.Workspace, a.Path, func(f *os.File, size int64) error {
			out.FileBytes = size
			off := a.Offset
			if off < 0 { // the last -Offset bytes
				off = max(size+off, 0)
			}
			off = min(off, size)
			n := a.Length
			if n < 0 || off+n > size {
				n = size - off
			}
			out.Offset = off
			stored, err := w.outputs.PutOutput(ctx, out.Object, io.NewSectionReader(f, off, n))
			out.ObjectBytes = stored
			return err
		})
		return out, err
	case workspace.OpArchive:
		out.Object = c.ID + "/archive"
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(w.wsm.Archive(ctx, c.Tenant, c.Workspace, a.Path, pw)) }()
		n, err := w.outputs.PutOutput(ctx, out.Object, pr)
		pr.CloseWithError(err) // stops the archiver if the store failed first
		out.ObjectBytes = n
		return out, err
	}
	return out, &workspace.Error{Type: call.ErrNotFound, Msg: fmt.Sprintf("unknown workspace operation %q", c.Tool)}
}

// withImage gives the workspace that create call c made the default image (none: it is done). When that
// fails, it deletes the workspace again: a create either makes the workspace as asked or nothing.
func (w *Worker) withImage(ctx context.Context, c *call.Call, image string) func(workspace.Info, error) (workspace.Info, error) {
	return func(inf workspace.Info, err error) (workspace.Info, error) {
		if err != nil || image == "" {
			return inf, err
		}
		if inf, err = w.wsm.SetImage(ctx, c.Tenant, c.Workspace, image); err != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if derr := w.wsm.Delete(dctx, c.Tenant, c.Workspace); derr != nil {
				err = errors.Join(err, fmt.Errorf("delete the workspace again: %w", derr))
			}
			return inf, fmt.Errorf("set workspace image: %w", err)
		}
		return inf, nil
	}
}

// fetchArchive copies the uploaded object name to a temporary file, which the caller removes.
func (w *Worker) fetchArchive(ctx context.Context, name string) (*os.File, error) {
	if name == "" {
		return nil, &workspace.Error{Type: call.ErrInvalidParams, Msg: "no archive was uploaded: send a tar, tar.gz or zip as the request body"}
	}
	if w.transfers == nil {
		return nil, errors.New("this worker has no transfer store to read uploads from")
	}
	rc, err := w.transfers.OpenOutput(ctx, name, 0)
	if err != nil {
		return nil, fmt.Errorf("open uploaded archive: %w", err)
	}
	defer rc.Close()
	f, err := os.CreateTemp("", "toolpool-upload-")
	if err != nil {
		return nil, fmt.Errorf("create temporary file: %w", err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		cleanupTemp(f)
		return nil, fmt.Errorf("read uploaded archive: %w", err)
	}
	return f, nil
}

func cleanupTemp(f *os.File) {
	f.Close()
	os.Remove(f.Name())
}
