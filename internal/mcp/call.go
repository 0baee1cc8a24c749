package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/tracing"
)

// callTool runs a tools/call of one of the tenant's tools: it submits the call, settles its approval,
// and waits for its result with progress notifications.
func (h *Handler) callTool(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
	if tp, ok := req.Params.Meta["traceparent"].(string); ok {
		ctx = tracing.Extract(ctx, tp) // the client's trace: the call joins it
	}
	ctx, span := tracing.Start(ctx, "mcp.tools/call", tracing.AttrTool.String(req.Params.Name))
	res, err := h.runTool(ctx, req)
	tracing.End(span, err)
	return res, err
}

func (h *Handler) runTool(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
	args := normalArgs(req.Params.Arguments)
	if req.Params.RequestState != "" {
		return h.resume(ctx, req, args)
	}
	workspace := req.Extra.Header.Get(WorkspaceHeader)
	if ws, ok := req.Params.Meta[WorkspaceMeta]; ok {
		s, isString := ws.(string)
		if !isString {
			return failure(fmt.Sprintf("_meta %q must be a workspace name (a string), got %v", WorkspaceMeta, ws)), nil
		}
		workspace = s
	}
	var image string
	if v, ok := req.Params.Meta[ImageMeta]; ok {
		s, isString := v.(string)
		if !isString {
			return failure(fmt.Sprintf("_meta %q must be an image reference (a string), got %v", ImageMeta, v)), nil
		}
		image = s
	}
	r := requestFrom(ctx)
	res, err := h.calls.Submit(ctx, call.Request{Tool: req.Params.Name, Args: args, Workspace: workspace, Image: image, ID: r.session.callID(r.id)})
	if err != nil {
		return rejected(err)
	}
	prog := newProgress(req)
	prog.status(ctx, res)
	if res.Status == call.StatusPendingApproval {
		return h.approve(ctx, req, res, args, prog)
	}
	return h.await(ctx, req, res, prog, h.cfg.MaxWait)
}

// approve asks the person at the client to approve res, when the client can elicit and the token may
// approve (see the package comment for how each protocol version does it); otherwise, or when no answer
// comes within ApprovalWait, the result says that the call waits for approval.
func (h *Handler) approve(ctx context.Context, req *sdk.CallToolRequest, res *call.Result, args []byte, prog *progress) (*sdk.CallToolResult, error) {
	if !h.approvals.MayApprove(ctx) {
		return pendingResult(res), nil
	}
	if req.ProtocolVersion() >= modern {
		if caps := req.ClientCapabilities(); caps == nil || !formElicitation(caps) {
			return pendingResult(res), nil
		}
		return &sdk.CallToolResult{InputRequests: sdk.InputRequestMap{approvalKey: approvalPrompt(res, args)}, RequestState: approvalState + res.ID}, nil
	}
	r := requestFrom(ctx)
	if !r.session.elicits {
		return pendingResult(res), nil
	}
	if err := promptLegacy(r.side, res, args); err != nil {
		h.log.WarnContext(ctx, "prompt for mcp approval", "call_id", res.ID, "error", err)
		return pendingResult(res), nil
	}
	wctx, cancel := context.WithTimeout(ctx, h.cfg.ApprovalWait)
	defer cancel()
	next, err := h.calls.Wait(wctx, res.ID, func(r *call.Result) bool { return r.Status != call.StatusPendingApproval })
	if next != nil {
		res = next
	}
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err() // the client went away; the call keeps waiting for approval
	case err != nil && wctx.Err() == nil:
		return rejected(err)
	case res.Status == call.StatusPendingApproval:
		return pendingResult(res), nil
	}
	prog.status(ctx, res)
	return h.await(ctx, req, res, prog, h.cfg.MaxWait)
}

// The key of the approval prompt in a 2026-07-28 input request, and the prefix of the requestState that
// names the call: "approve:<call id>".
const (
	approvalKey   = "approval"
	approvalState = "approve:"
)

// resume handles a 2026-07-28 tools/call retried with the person's answer to an approval prompt. The
// request state names the call; it is client-controlled, so the call must be the tenant's (Wait), of
// the same tool and with the same arguments as this retry, and the decision needs a token that may
// approve, bound to those arguments' digest: a forged state can only name an identical call.
func (h *Handler) resume(ctx context.Context, req *sdk.CallToolRequest, args []byte) (*sdk.CallToolResult, error) {
	id, ok := strings.CutPrefix(req.Params.RequestState, approvalState)
	if !ok || !call.ValidID(id) {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "requestState is not one toolpool gave: retry the call without it"}
	}
	res, err := h.calls.Wait(ctx, id, func(*call.Result) bool { return true })
	if err != nil {
		return rejected(err)
	}
	if res.Tool != req.Params.Name || res.ArgsDigest != call.ArgsDigest(args) {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "requestState belongs to another call: retry with the arguments of the call that asked"}
	}
	prog := newProgress(req)
	if res.Status == call.StatusPendingApproval {
		answer, ok := req.Params.InputResponses[approvalKey].(*sdk.ElicitResult)
		if !ok {
			return h.approve(ctx, req, res, args, prog) // no answer: ask again, as the spec says
		}
		decided, err := h.approvals.Decide(ctx, id, res.ArgsDigest, answer.Action == "accept")
		if err != nil {
			// Decided or expired meanwhile (by another approver): report what happened to it.
			if res, err = h.calls.Wait(ctx, id, func(*call.Result) bool { return true }); err != nil {
				return rejected(err)
			}
		} else {
			res = decided
		}
	}
	prog.status(ctx, res)
	if res.Status == call.StatusPendingApproval {
		return pendingResult(res), nil
	}
	return h.await(ctx, req, res, prog, h.cfg.MaxWait)
}

// await waits up to maxWait for res's call to end, sending a progress notification at each change of
// status (and each chunk of output, WithOutput). When the client cancels a 2026-07-28 request (ctx
// ends), it cancels the call; a 2025-11-25 client cancels with notifications/cancelled instead.
func (h *Handler) await(ctx context.Context, req *sdk.CallToolRequest, res *call.Result, prog *progress, maxWait time.Duration) (*sdk.CallToolResult, error) {
	wctx, stop := context.WithTimeout(ctx, maxWait)
	defer stop()
	stopOutput := func() {}
	defer func() { stopOutput() }()
	for !res.Status.Terminal() && res.Status != call.StatusPendingApproval {
		if res.Status == call.StatusRunning {
			stopOutput = h.followOutput(wctx, res.ID, prog, stopOutput)
		}
		last := res.Status
		next, err := h.calls.Wait(wctx, res.ID, func(r *call.Result) bool { return r.Status != last })
		if next != nil {
			res = next
			if res.Status != call.StatusRunning {
				stopOutput() // no chunk after the notification that the call ended
				stopOutput = func() {}
			}
			prog.status(ctx, res)
		}
		switch {
		case ctx.Err() != nil:
			if req.ProtocolVersion() >= modern && !h.draining.Load() {
				if _, cerr := h.calls.Cancel(context.WithoutCancel(ctx), res.ID); cerr != nil {
					h.log.WarnContext(ctx, "cancel call of a cancelled mcp request", "call_id", res.ID, "error", cerr)
				}
			}
			return nil, ctx.Err()
		case wctx.Err() != nil:
			return waitingResult(res, fmt.Sprintf("is still %s after %s", res.Status, maxWait.Round(time.Second))), nil
		case err != nil:
			return rejected(err)
		}
	}
	if res.Status == call.StatusPendingApproval {
		return pendingResult(res), nil
	}
	return toolResult(res), nil
}

// followOutput starts following a running call's output once (when there is an Output and a progress
// token), and returns the function that stops it and waits for it to end.
func (h *Handler) followOutput(ctx context.Context, id string, prog *progress, running func()) func() {
	if h.output == nil || prog == nil || prog.following {
		return running
	}
	prog.following = true
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := h.output.Follow(fctx, id, func(chunk string) { prog.send(fctx, chunk) }); err != nil && fctx.Err() == nil {
			h.log.WarnContext(ctx, "follow call output", "call_id", id, "error", err)
		}
	}()
	return func() { cancel(); <-done }
}

// rejected turns an error of Calls or Approvals into the tool's answer, by its class (call.Kind): the one
// place where this endpoint maps an error. A refusal the model can act on (a problem with the request, a
// call that is not there or moved on, a full tenant, an operation that ran out of time) is a tool error
// with the message, and when to retry; toolpool's own failure (internal, unavailable, or an error of no
// class) is a JSON-RPC internal error.
func rejected(err error) (*sdk.CallToolResult, error) {
	var rej *call.Rejection
	if errors.As(err, &rej) {
		switch rej.Kind {
		case call.KindInvalid, call.KindInvalidParams, call.KindUnauthenticated, call.KindForbidden, call.KindDenied,
			call.KindNotFound, call.KindConflict, call.KindTooLarge, call.KindLengthRequired, call.KindUnsupportedMedia,
			call.KindRangeNotSatisfiable, call.KindTenantFull, call.KindTimeout:
			msg := rej.Message
			if rej.RetryAfter > 0 {
				msg += fmt.Sprintf(" (retry after %s)", rej.RetryAfter)
			}
			return failure(msg), nil
		}
	}
	return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "toolpool failed: " + err.Error()}
}

// normalArgs is a call's arguments as the dispatcher records them: absent or null is {}.
func normalArgs(args json.RawMessage) json.RawMessage {
	if len(args) == 0 || string(args) == "null" {
		return json.RawMessage("{}")
	}
	return args
}

// progress sends a request's progress notifications, when its client sent a progress token: one per
// change of the call's status, and one per chunk of output. A nil *progress sends nothing.
type progress struct {
	session   *sdk.ServerSession
	token     any
	mu        sync.Mutex
	n         float64
	last      string
	following bool // output is followed; only await's goroutine reads and writes it
}

func newProgress(req *sdk.CallToolRequest) *progress {
	token := req.Params.GetProgressToken()
	if token == nil {
		return nil
	}
	return &progress{session: req.Session, token: token}
}

// status sends a notification that describes res, unless it says what the previous one said.
func (p *progress) status(ctx context.Context, res *call.Result) {
	if p == nil {
		return
	}
	msg := "call " + res.ID + " " + string(res.Status)
	switch res.Status {
	case call.StatusQueued:
		msg += ": waiting for a worker"
	case call.StatusRunning:
		msg += " on " + res.Worker
	case call.StatusPendingApproval:
		msg += ": waiting for a person's approval"
	}
	p.mu.Lock()
	same := msg == p.last
	p.last = msg
	p.mu.Unlock()
	if !same {
		p.send(ctx, msg)
	}
}

// send sends one notification; progress grows by one with each. A failed send (the client went away)
// only loses that notification.
func (p *progress) send(ctx context.Context, msg string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	_ = p.session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{ProgressToken: p.token, Progress: p.n, Message: msg})
}
