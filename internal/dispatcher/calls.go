package dispatcher

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/tools"
)

// This file is the call service as Go methods, for protocol front ends mounted behind Authenticate
// (internal/mcp): the call path of POST /v1/calls, DELETE /v1/calls/{id} and POST /v1/approvals/{id}.
// They take the same steps as the HTTP handlers (admit, accept, awaitResult, cancel, decide): policy,
// approvals, the queue, the audit log, metrics and the trace are the same. Each acts for the caller that
// Authenticate put in ctx, and treats another tenant's call as one that does not exist. Their refusals
// are *call.Rejection, classed by Kind; other errors are ctx's.

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
		return nil, call.Reject(call.KindInvalidParams, call.ErrInvalidParams, fmt.Sprintf("call id %q is not an id toolpool gives", r.ID))
	}
	_, res, err := s.submit(ctx, p, &r)
	if errors.Is(err, errNotRecorded) {
		return res, nil // queued; its record follows
	}
	if err != nil {
		return nil, err
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
	rec, err := s.lookup(ctx, p.tenant, id)
	if err != nil {
		return nil, err
	}
	if res := s.expireIfDue(ctx, rec); res.Status.Terminal() || until(res) {
		return s.whole(ctx, res)
	}
	res, err := s.awaitResult(ctx, id, until)
	if res == nil {
		return nil, call.StateUnknown(id, "toolpool could not read the call's state; retry")
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
		return nil, call.StateUnknown(res.ID, "toolpool could not read the call's stored output; retry")
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
	return s.cancel(ctx, p, id)
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
		return nil, mayNotApprove()
	}
	return s.decide(ctx, p, id, decision{approve: approve, argsDigest: argsDigest}, "mcp")
}

// caller is the principal the API's authentication put in ctx.
func caller(ctx context.Context) (principal, error) {
	p, ok := ctx.Value(ctxKey{}).(principal)
	if !ok {
		return p, call.Reject(call.KindUnauthenticated, call.ErrPermissionDenied, "the request carries no authenticated caller")
	}
	return p, nil
}
