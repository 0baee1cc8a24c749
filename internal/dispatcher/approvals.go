package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// approver lets only tokens with the approver role through.
func (s *Server) approver(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if principalFrom(r.Context()).role != RoleApprover {
			writeError(w, http.StatusForbidden, call.ErrPermissionDenied, "this token may not approve calls: approvals need a token with role approver")
			return
		}
		next(w, r)
	}
}

// approvalView is one call waiting for approval, as an approver sees it.
type approvalView struct {
	ID         string          `json:"id"`
	Tool       string          `json:"tool"`
	Workspace  string          `json:"workspace"`
	Args       json.RawMessage `json:"args"`
	ArgsDigest string          `json:"args_digest"`
	Rule       string          `json:"rule"`
	Reason     string          `json:"reason"`
	CreatedAt  time.Time       `json:"created_at"`
	ExpiresAt  time.Time       `json:"expires_at"`
}

func (s *Server) listApprovals(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	pending, err := s.approvals.ListPending(r.Context(), p.tenant)
	if err != nil {
		s.log.Error("list approvals", "error", err)
		writeError(w, http.StatusServiceUnavailable, call.ErrInternal, "toolpool could not list the approvals; retry")
		return
	}
	views := []approvalView{}
	for _, pc := range pending {
		rec, err := s.store.Get(r.Context(), pc.Call.ID)
		if err != nil || s.expireIfDue(r.Context(), rec).Status != call.StatusPendingApproval {
			continue // decided, expired or gone
		}
		c := pc.Call
		v := approvalView{ID: c.ID, Tool: c.Tool, Workspace: c.Workspace, Args: c.Args, ArgsDigest: c.ArgsDigest,
			CreatedAt: c.CreatedAt, ExpiresAt: pc.ExpiresAt}
		if c.Decision != nil {
			v.Rule, v.Reason = c.Decision.Rule, c.Decision.Reason
		}
		views = append(views, v)
	}
	writeJSON(w, http.StatusOK, map[string]any{"approvals": views})
}

// approvalRequest is the body of POST /v1/approvals/{id}.
type approvalRequest struct {
	Decision string `json:"decision"`
	// ArgsDigest, when given, must be the digest of the call's arguments: the approval binds to exactly
	// the arguments the approver saw.
	ArgsDigest string `json:"args_digest"`
	// Always adds a rule that allows this tool with ArgvPrefix for the tenant from now on.
	Always     bool     `json:"always"`
	ArgvPrefix []string `json:"argv_prefix"`
}

func (s *Server) decideApproval(w http.ResponseWriter, r *http.Request) {
	var req approvalRequest
	if rerr := s.decodeBody(w, r, &req); rerr != nil {
		writeRequestError(w, rerr)
		return
	}
	if req.Decision != "approve" && req.Decision != "deny" {
		writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf(`decision %q must be "approve" or "deny"`, req.Decision))
		return
	}
	res, rerr := s.decide(r.Context(), principalFrom(r.Context()), r.PathValue("id"), req, "")
	if rerr != nil {
		writeRequestError(w, rerr)
		return
	}
	s.writeCall(r.Context(), w, res)
}

// decide applies an approver's decision to a call waiting for approval: a denied call ends denied, an
// approved one is queued. The audit log records the decision with its actor, the token's holder and, when
// via is not empty, the channel it came through ("mcp"). The caller has checked that p may approve.
func (s *Server) decide(ctx context.Context, p principal, id string, req approvalRequest, via string) (*call.Result, *requestError) {
	pc, err := s.approvals.GetPending(ctx, p.tenant, id)
	if errors.Is(err, queue.ErrNotFound) {
		return nil, &requestError{code: http.StatusNotFound, typ: call.ErrNotFound, msg: fmt.Sprintf("no call %s waits for approval", id)}
	}
	if err != nil {
		return nil, &requestError{code: http.StatusServiceUnavailable, typ: call.ErrInternal, msg: "toolpool could not read the approval; retry"}
	}
	if req.ArgsDigest != "" && req.ArgsDigest != pc.Call.ArgsDigest {
		return nil, &requestError{code: http.StatusConflict, typ: "digest_mismatch", msg: fmt.Sprintf("the call's arguments have digest %s, not %s: list the approvals again and approve what you see", pc.Call.ArgsDigest, req.ArgsDigest)}
	}
	if req.Always && req.Decision == "approve" {
		if s.rules == nil {
			return nil, badRequest("approve always is not available on this dispatcher")
		}
		if err := s.rules.AddAllowRule(ctx, p.tenant, pc.Call.Tool, req.ArgvPrefix); err != nil {
			return nil, badRequest("add approve-always rule: %v", err)
		}
		if s.onRuleAdded != nil {
			s.onRuleAdded()
		}
	}
	rec, err := s.store.Get(ctx, id)
	if err != nil {
		return nil, &requestError{code: http.StatusServiceUnavailable, typ: call.ErrInternal, msg: "toolpool could not read the call; retry"}
	}
	res := s.expireIfDue(ctx, rec)
	if res.Status != call.StatusPendingApproval {
		_ = s.approvals.DeletePending(ctx, p.tenant, id)
		return nil, &requestError{code: http.StatusConflict, typ: "not_pending", msg: fmt.Sprintf("call %s is %s, no longer waiting for approval", id, res.Status)}
	}
	actor := p.tenant + "/" + p.role
	if p.name != "" {
		actor = p.tenant + "/" + p.name
	}
	if via != "" {
		actor += " via " + via
	}
	c := pc.Call
	if req.Decision == "deny" {
		res.Fail(call.StatusDenied, call.ErrPolicyDenied, "a person denied this call ("+actor+"); do not retry it as it is")
		res.FinishedAt = s.now().UTC()
	} else {
		res.Status, res.Output = call.StatusQueued, ""
		c.Deadline = s.now().UTC().Add(s.cfg.QueueTimeout)
		res.Deadline = c.Deadline
	}
	if _, err := s.store.Update(ctx, res, rec.Revision); err != nil {
		return nil, &requestError{code: http.StatusConflict, typ: "conflict", msg: "the call changed meanwhile; list the approvals again"}
	}
	if s.recorder != nil {
		event := map[string]string{"approve": "approved", "deny": "rejected"}[req.Decision]
		s.recorder.Record(ctx, event, res, actor)
	}
	if req.Decision == "approve" {
		if err := s.pub.Publish(ctx, c); err != nil {
			// The approval is recorded and the call parked still: the reconciler queues it.
			s.log.Error("publish approved call; the reconciler queues it later", "call_id", id, "error", err)
			return res, nil
		}
	}
	_ = s.approvals.DeletePending(ctx, p.tenant, id)
	return res, nil
}

func (s *Server) readAudit(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	if s.auditLog == nil {
		writeError(w, http.StatusNotFound, call.ErrNotFound, "this dispatcher keeps no audit log")
		return
	}
	since := s.now().Add(-time.Hour)
	if v := r.URL.Query().Get("since"); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			since = s.now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, v); err == nil {
			since = t
		} else {
			writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("since=%q is neither a duration (1h) nor an RFC 3339 time", v))
			return
		}
	}
	limit := 1000
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			writeError(w, http.StatusBadRequest, "invalid_request", fmt.Sprintf("limit=%q must be a number from 1 to 10000", v))
			return
		}
		limit = n
	}
	events, err := s.auditLog.ReadAudit(r.Context(), p.tenant, since, limit)
	if err != nil {
		s.log.Error("read audit log", "error", err)
		writeError(w, http.StatusServiceUnavailable, call.ErrInternal, "toolpool could not read the audit log; retry")
		return
	}
	if events == nil {
		events = []call.AuditEvent{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": events})
}
