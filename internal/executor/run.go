package executor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tools/incontainer"
	"github.com/toolpool/toolpool/internal/workspace"
)

// Run plans call c's process and runs it in a fresh container, holding the call's workspace shared
// (workspace.Manager.Hold) meanwhile. It blocks until the container is gone; cancelling ctx kills it (see
// ErrCancelRequested for the cause). newCapture, called once for a tool that streams its output (a
// command), gathers that output; the capture is finished before Run returns. onPull, when not nil, is told
// how the pull of the call's image goes while the call waits for it (sandbox.Spec's OnPull), from one
// goroutine; it must return at once.
//
// A call the executor refuses (an unknown tool, arguments that do not plan, a workspace over its quota, a
// program or a runtime this worker does not have) comes back as an Execution that Finish turns into the
// call's error, with a nil error. An error wrapping sandbox.ErrNotStarted means nothing ran and the call
// may be offered again; any other error is the runtime's, for Finish.
func (e *Executor) Run(ctx context.Context, c *call.Call, newCapture func() (Capture, error), onPull func(call.PullProgress)) (Execution, error) {
	tool, ok := e.tools.Lookup(c.Tool)
	if !ok {
		return Execution{failed: &call.ErrorInfo{Type: call.ErrNotFound, Message: fmt.Sprintf("unknown tool %q", c.Tool)}}, nil
	}
	var inv tools.Invocation
	args, err := tool.WithPolicy(c.Args, c.Limits.DeniedGlobs)
	if err == nil {
		inv, err = tool.Plan(args)
	}
	if err != nil {
		return Execution{tool: tool, failed: &call.ErrorInfo{Type: call.ErrInvalidParams, Message: err.Error()}}, nil
	}
	ws, err := e.workspaces.Prepare(c.Tenant, c.Workspace)
	var over *workspace.Error
	if !errors.As(err, &over) || over.Type != call.ErrQuota {
		over = nil
	}
	switch {
	case over != nil && !mayRunOverQuota(tool):
		return Execution{tool: tool, failed: &call.ErrorInfo{Type: call.ErrQuota, Message: over.Error() +
			". Reading, searching, deleting and run_shell (for rm) still work."}}, nil
	case err != nil && over == nil:
		return Execution{}, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	spec, timeout := e.plan(c, tool, inv, ws, over != nil)
	// Calls hold the workspace shared: they run alongside each other, never alongside a workspace
	// operation (an upload, snapshot or delete), on this worker or any other sharing the directory.
	release, err := e.workspaces.Hold(ctx, c.Tenant, c.Workspace)
	if err != nil {
		return Execution{}, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	defer release()
	// Found while the workspace is held, so that no workspace operation changes it in between.
	hidden, refused, err := e.hiddenPaths(c, tool, ws.Dir)
	switch {
	case refused != nil:
		return Execution{tool: tool, failed: refused}, nil
	case err != nil:
		return Execution{}, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	spec.Hidden = hidden
	if spec.ReadOnlyPaths, err = e.readOnlyPaths(c, ws.Dir); err != nil {
		return Execution{}, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	finishEgress, err := e.withEgress(ctx, c, inv, &spec)
	if err != nil {
		return Execution{}, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	if onPull != nil && spec.Image != "" {
		spec.OnPull = func(p sandbox.PullProgress) {
			onPull(call.PullProgress{Image: p.Image, BytesDone: p.Done, BytesTotal: p.Total, Phase: p.Phase})
		}
	}
	var capt Capture
	if tool.Streams() && newCapture != nil {
		if capt, err = newCapture(); err != nil {
			finishEgress()
			return Execution{}, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
		}
		spec.Stdout, spec.Stderr = capt.Stdout(), capt.Stderr()
	}
	out, err := e.runtime.Run(ctx, spec)
	e.logSteps(ctx, c.ID, out)
	var streams map[string]*call.Stream
	if capt != nil {
		streams = capt.Finish(context.WithoutCancel(ctx), !errors.Is(err, sandbox.ErrNotStarted))
	}
	egressConns := finishEgress()
	if errors.Is(err, sandbox.ErrNoProgram) {
		// Nothing ran, and nothing would elsewhere: the call's own mistake, like arguments that do not plan.
		root := "the host's /usr"
		if spec.Image != "" {
			root = "image " + spec.Image
		}
		return Execution{tool: tool, failed: &call.ErrorInfo{Type: call.ErrNotFound, Message: fmt.Sprintf(
			"the program %q does not exist in this sandbox's root filesystem (%s); use a program it has", spec.Argv[0], root)}}, nil
	}
	if failed := imageFailure(err, spec.Image); failed != nil {
		return Execution{tool: tool, failed: failed}, nil
	}
	if errors.Is(err, sandbox.ErrNoRuntime) {
		// Final: running it under another runtime would silently weaken the boundary its tenant was given.
		return Execution{tool: tool, failed: &call.ErrorInfo{Type: call.ErrRuntimeUnavailable, Message: fmt.Sprintf(
			"toolpool did not run this call: its tenant's calls must run under the sandbox runtime %q, which worker %s does not have (%v). "+
				"Nothing ran, and such calls never run under another runtime. An operator must install the runtime on every worker "+
				"(gVisor: make gvisor, or scripts/gvisor.sh) or change the tenant's runtime in the dispatcher's configuration.",
			spec.Runtime, e.cfg.Worker, err)}}, nil
	}
	return Execution{tool: tool, out: out, timeout: timeout, streams: streams, egress: egressConns}, err
}

// imageFailure is the call's final error when err says its image could not be pulled or may not run:
// nothing ran, and another worker would fail the same way, so the call ends with the runtime's message,
// which says what to fix. It is nil for any other error.
func imageFailure(err error, image string) *call.ErrorInfo {
	switch {
	case errors.Is(err, sandbox.ErrImageRefused):
		return &call.ErrorInfo{Type: call.ErrImageRefused, Message: fmt.Sprintf("toolpool did not run this call: its image %s was refused: %v", image, err)}
	case errors.Is(err, sandbox.ErrImagePull):
		return &call.ErrorInfo{Type: call.ErrImagePullFailed, Message: fmt.Sprintf("toolpool did not run this call: its image %s could not be pulled: %v", image, err)}
	}
	return nil
}

// plan is the container spec of call c, planned as inv, in workspace ws (over its quota when over), and
// the call's timeout. Egress and the output watchers are added by Run.
func (e *Executor) plan(c *call.Call, tool *tools.Tool, inv tools.Invocation, ws workspace.Prepared, over bool) (sandbox.Spec, time.Duration) {
	quota := e.workspaces.Quota()
	switch {
	case quota == 0:
		quota = -1 // no quota: the sandbox neither measures nor caps
	case over:
		quota = max(ws.Bytes, 1) // over quota: the call may shrink the workspace, never grow it
	}
	timeout := time.Duration(c.Limits.TimeoutMS) * time.Millisecond
	if inv.Timeout > 0 && (timeout == 0 || inv.Timeout < timeout) {
		timeout = inv.Timeout
	}
	if timeout == 0 {
		timeout = tool.DefaultTimeout
	}
	spec := sandbox.Spec{
		ID: c.ID, Argv: inv.Argv, Env: inv.Env, Cwd: inv.Cwd, Stdin: inv.Stdin, WorkspaceDir: ws.Dir, Image: cmp.Or(inv.Image, c.Image, ws.Image, c.TenantImage, e.cfg.Image),
		Tenant: c.Tenant, Runtime: c.Limits.Runtime, WorkspaceReadOnly: c.Limits.ReadOnlyWorkspace,
		Limits: sandbox.Limits{
			Timeout: timeout, OutputBytes: max(c.Limits.OutputBytes, e.cfg.CaptureBytes), MemoryBytes: c.Limits.MemoryBytes,
			PIDs: c.Limits.PIDs, CPUMillis: c.Limits.CPUMillis, Network: c.Limits.Network, WorkspaceBytes: quota,
		},
	}
	if inv.Runner {
		spec.Mounts = append(spec.Mounts, sandbox.Mount{Source: e.cfg.RunnerBinary, Destination: incontainer.RunnerPath})
	}
	return spec, timeout
}

// mayRunOverQuota reports whether a tool may run in a workspace over its quota: those that read, search or
// delete, and run_shell (so that files can be removed); never one that can only add data.
func mayRunOverQuota(t *tools.Tool) bool {
	switch t.Kind {
	case tools.KindRead, tools.KindSearch, tools.KindDelete, tools.KindExecute, tools.KindFetch:
		return !t.Custom
	}
	return false
}

// logSteps logs, at debug level, how long each step of the call's sandbox took (sandbox.Outcome.Steps).
func (e *Executor) logSteps(ctx context.Context, id string, out sandbox.Outcome) {
	if len(out.Steps) == 0 || !e.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := make([]any, 0, len(out.Steps))
	for _, s := range out.Steps {
		attrs = append(attrs, slog.Float64(s.Name+"_ms", float64(s.Took.Microseconds())/1000))
	}
	e.log.DebugContext(ctx, "sandbox steps", "call_id", id, "warm", out.Warm, slog.Group("steps", attrs...))
}
