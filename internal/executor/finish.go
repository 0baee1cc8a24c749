package executor

import (
	"errors"
	"fmt"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/workspace"
)

// Finish fills r, call c's result, with the final state of execution x: its status, error, output and
// usage, in words a model can act on. runErr is Run's error; cancelErr is the cause of Run's context
// when it was cancelled while the call ran (ErrCancelRequested, or any other for a shutdown), else nil.
// It records the workspace's size as the call left it (workspace.Manager.RecordSize).
func (e *Executor) Finish(r *call.Result, c *call.Call, x Execution, runErr, cancelErr error) {
	r.FinishedAt = e.cfg.Now()
	r.Timing.TotalMS = r.FinishedAt.Sub(c.CreatedAt).Milliseconds()
	r.Egress = x.egress // a workspace clone's, whether or not it succeeded
	if x.failed != nil {
		r.Fail(call.StatusError, x.failed.Type, x.failed.Message)
		return
	}
	if x.output != "" {
		r.Status, r.Output = call.StatusOK, x.output
		return
	}
	o := x.out
	r.Image = o.Image
	r.Timing.SandboxMS = o.SandboxTime.Milliseconds()
	r.Timing.RunMS = o.RunTime.Milliseconds()
	r.Timing.Warm = o.Warm
	r.Usage = call.Usage{MaxRSSBytes: o.MaxRSSBytes, CPUMS: o.CPUTime.Milliseconds(), WallMS: o.RunTime.Milliseconds(), Signal: o.Signal}
	if o.WorkspaceBytes >= 0 {
		r.Usage.WorkspaceBytes = o.WorkspaceBytes
		e.workspaces.RecordSize(c.Tenant, c.Workspace, o.WorkspaceBytes) // the next call need not measure again
	}
	if x.tool != nil {
		run := tools.Run{
			Stdout: o.Stdout.Head, StdoutTail: o.Stdout.Tail, Stderr: o.Stderr.Head, StderrTail: o.Stderr.Tail,
			StdoutBytes: o.Stdout.Total, StderrBytes: o.Stderr.Total,
			ExitCode: o.ExitCode, OutputBytes: c.Limits.OutputBytes, CallID: c.ID,
		}
		if st := x.streams[call.StreamStdout]; st != nil {
			run.StdoutKept = st.Kept
		}
		if st := x.streams[call.StreamStderr]; st != nil {
			run.StderrKept = st.Kept
		}
		x.tool.Finish(run).Apply(r)
		r.Streams = x.streams
		if o.Stdout.Truncated() || o.Stderr.Truncated() {
			r.Truncated = true
		}
	}
	r.Egress = x.egress
	r.Output += egressNote(x.egress)
	switch {
	case errors.Is(cancelErr, ErrCancelRequested):
		r.Status = call.StatusCancelled
		r.Error = &call.ErrorInfo{Type: call.ErrCancelled, Message: "the call was cancelled while it ran; its container was killed"}
		r.Output += "\n[cancelled: " + r.Error.Message + "]"
	case cancelErr != nil:
		r.Status = call.StatusCancelled
		r.Error = &call.ErrorInfo{Type: call.ErrCancelled, Message: "the worker shut down while the call ran; its container was killed. Call again."}
		r.Output += "\n[cancelled: " + r.Error.Message + "]"
	case runErr != nil:
		r.Status = call.StatusError
		r.Error = &call.ErrorInfo{Type: call.ErrInternal, Message: "toolpool failed to run the call: " + runErr.Error()}
	case o.TimedOut:
		r.Status = call.StatusTimeout
		r.Error = &call.ErrorInfo{Type: call.ErrTimeout, Message: fmt.Sprintf("the call ran past its timeout of %s and every process of it was killed; what it printed before is above. Use a longer timeout_ms or a faster command.", x.timeout)}
		r.Output += "\n[timed out: " + r.Error.Message + "]"
	case o.QuotaExceeded:
		r.Status = call.StatusError
		r.Error = &call.ErrorInfo{Type: call.ErrQuota, Message: fmt.Sprintf("the workspace grew past its quota of %s (it uses %s) and the call was stopped; later calls that add files are refused until files are deleted to bring it under the quota",
			workspace.FormatBytes(e.workspaces.Quota()), workspace.FormatBytes(o.WorkspaceBytes))}
		r.Output += "\n[" + r.Error.Message + "]"
	case o.OOMKilled:
		r.Status = call.StatusError
		r.Error = &call.ErrorInfo{Type: call.ErrOOM, Message: fmt.Sprintf("the call ran out of memory (peak %d MiB) and was killed; use less memory, or process the data in smaller pieces", o.MaxRSSBytes>>20)}
		r.Output += "\n[" + r.Error.Message + "]"
	}
}
