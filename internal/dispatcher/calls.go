package dispatcher

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/tools"
)

// This file is the call path of POST /v1/calls, DELETE /v1/calls/{id} and POST /v1/approvals/{id} as Go
// methods, for protocol front ends mounted behind Authenticate (internal/mcp). They take the same steps
// as the HTTP handlers (admit, accept, awaitResult, cancel, decide): policy, approvals, the queue, the
// audit log, metrics and the trace are the same. Each acts for the caller that Authenticate put in ctx,
// and treats another tenant's call as one that does not exist. Their errors are *call.Rejection.

// Authenticate returns next behind the API's bearer-token authentication: a request without a known token
// gets 401; next's requests carry the caller in their context, for the methods of this file.
func (s *Server) Authenticate(next http.Handler) http.Handler { return s.auth(next.ServeHTTP) }

// Submit admits r and accepts it, as POST /v1/calls does, and returns at once with the call's first
// record: queued, pending_approval, or denied by policy; a read_output call is answered at once, final
// and unrecorded. A request that names a call that exists already
// (r.ID) returns that call's record.
func (s *Server) Submit(ctx context.Context, r call.Request) (*call.Result, error) {
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if r.ID != "" && !call.ValidID(r.ID) {
		return nil, &call.Rejection{Type: call.ErrInvalidParams, Message: fmt.Sprintf("call id %q is not an id toolpool gives", r.ID)}
	}
	_, res, rerr := s.submit(ctx, p, &callRequest{Tool: r.Tool, Args: r.Args, Workspace: r.Workspace, id: r.ID})
	if rerr == errNotRecorded {
		return res, nil // queued; its record follows
	}
	if rerr != nil {
		return nil, rerr.rejection()
	}
	return res, nil
}

// Wait returns the call's record once until(r) (until must not be nil) holds, r is final, or r has waited in the queue past its
// deadline (it then ends expired); until is never called with a final record. When ctx ends first it
// returns the latest record with ctx's error.
func (s *Server) Wait(ctx context.Context, id string, until func(*call.Result) bool) (*call.Result, error) {
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	rec, rerr := s.lookup(ctx, p.tenant, id)
	if rerr != nil {
		return nil, rerr.rejection()
	}
	if res := s.expireIfDue(ctx, rec); res.Status.Terminal() || until(res) {
		return s.whole(ctx, res)
	}
	res, err := s.awaitResult(ctx, id, until)
	if res == nil {
		return nil, &call.Rejection{Type: call.ErrInternal, Message: "toolpool could not read the call's state; retry", RetryAfter: time.Second}
	}
	if err != nil {
		return res, err
	}
	return s.whole(ctx, res)
}

// whole returns res as the HTTP API answers with it (present).
func (s *Server) whole(ctx context.Context, res *call.Result) (*call.Result, error) {
	full, err := s.present(ctx, res)
	if err != nil {
		s.log.ErrorContext(ctx, "read stored output", "call_id", res.ID, "error", err)
		return nil, &call.Rejection{Type: call.ErrInternal, Message: "toolpool could not read the call's stored output; retry", RetryAfter: time.Second}
	}
	return full, nil
}

// Cancel cancels the call as DELETE /v1/calls/{id} does: a queued or pending call ends cancelled at once;
// a running call's worker kills its container and records the end. It returns the record as it stands
// after the request, without waiting for the worker.
func (s *Server) Cancel(ctx context.Context, id string) (*call.Result, error) {
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	res, rerr := s.cancel(ctx, p, id)
	if rerr != nil {
		return nil, rerr.rejection()
	}
	return res, nil
}

// Tools lists the tools the caller's tenant may use, in MCP's shape, with the hints its policy implies.
func (s *Server) Tools(ctx context.Context) ([]tools.MCPTool, error) {
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	return tools.MCP(s.enabledTools(p.tenant, nil), tools.WithNetwork(s.networkGranted(ctx, p.tenant))), nil
}

// MayApprove reports whether the caller's token has the approver role.
func (s *Server) MayApprove(ctx context.Context) bool {
	p, err := caller(ctx)
	return err == nil && p.role == RoleApprover
}

// Decide approves or denies the call waiting for approval, as POST /v1/approvals/{id} does, for a token
// with the approver role; argsDigest must be the digest of the arguments the person saw. The audit log
// records the actor "via mcp".
func (s *Server) Decide(ctx context.Context, id, argsDigest string, approve bool) (*call.Result, error) {
	p, err := caller(ctx)
	if err != nil {
		return nil, err
	}
	if p.role != RoleApprover {
		return nil, &call.Rejection{Type: call.ErrPermissionDenied, Message: "this token may not approve calls: approvals need a token with role approver"}
	}
	req := approvalRequest{Decision: "deny", ArgsDigest: argsDigest}
	if approve {
		req.Decision = "approve"
	}
	res, rerr := s.decide(ctx, p, id, req, "mcp")
	if rerr != nil {
		return nil, rerr.rejection()
	}
	return res, nil
}

// caller is the principal the API's authentication put in ctx.
func caller(ctx context.Context) (principal, error) {
	p, ok := ctx.Value(ctxKey{}).(principal)
	if !ok {
		return p, &call.Rejection{Type: call.ErrPermissionDenied, Message: "the request carries no authenticated caller"}
	}
	return p, nil
}

// networkGranted reports, for a tool of tenant, whether its policy gives the tool's containers network
// (the limits of a call that names nothing more than the tool).
func (s *Server) networkGranted(ctx context.Context, tenant string) func(tool string) bool {
	return func(name string) bool {
		t, ok := s.tools.Lookup(name)
		return ok && s.policy.Decide(ctx, policy.Request{Tenant: tenant, Tool: name, Kind: string(t.Kind)}).Limits.Network
	}
}

// rejection is e for callers that are not HTTP handlers.
func (e *requestError) rejection() *call.Rejection {
	return &call.Rejection{Type: e.typ, Message: e.msg, RetryAfter: time.Duration(e.retryAfter) * time.Second}
}
