package dispatcher

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// The handlers of the approvals API (GET /v1/approvals, POST /v1/approvals/{id}) and of GET /v1/audit;
// decide (approvals.go) applies a decision.

// approver lets only tokens with the approver role through.
func (s *api) approver(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if principalFrom(r.Context()).role != RoleApprover {
			writeErr(w, mayNotApprove())
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

func (s *api) listApprovals(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	pending, err := s.approvals.ListPending(r.Context(), p.tenant)
	if err != nil {
		s.log.Error("list approvals", "error", err)
		writeErr(w, call.Reject(call.KindUnavailable, call.ErrInternal, "toolpool could not list the approvals; retry"))
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
	// Reason, with a deny, is the approver's word to the caller, kept in the denied call's error message.
	Reason string `json:"reason"`
}

func (s *api) decideApproval(w http.ResponseWriter, r *http.Request) {
	var req approvalRequest
	if rerr := s.decodeBody(w, r, &req); rerr != nil {
		writeErr(w, rerr)
		return
	}
	if req.Decision != "approve" && req.Decision != "deny" {
		writeErr(w, invalid(`decision %q must be "approve" or "deny"`, req.Decision))
		return
	}
	if rerr := checkDenyReason(req.Decision, req.Reason); rerr != nil {
		writeErr(w, rerr)
		return
	}
	d := decision{approve: req.Decision == "approve", argsDigest: req.ArgsDigest, always: req.Always, argvPrefix: req.ArgvPrefix, reason: req.Reason}
	res, rerr := s.decide(r.Context(), principalFrom(r.Context()), r.PathValue("id"), d, "")
	if rerr != nil {
		writeErr(w, rerr)
		return
	}
	s.writeCall(r.Context(), w, res)
}

func (s *api) readAudit(w http.ResponseWriter, r *http.Request) {
	p := principalFrom(r.Context())
	if s.auditLog == nil {
		writeErr(w, call.Reject(call.KindNotFound, call.ErrNotFound, "this dispatcher keeps no audit log"))
		return
	}
	since := s.now().Add(-time.Hour)
	if v := r.URL.Query().Get("since"); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			since = s.now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, v); err == nil {
			since = t
		} else {
			writeErr(w, invalid("since=%q is neither a duration (1h) nor an RFC 3339 time", v))
			return
		}
	}
	limit := 1000
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			writeErr(w, invalid("limit=%q must be a number from 1 to 10000", v))
			return
		}
		limit = n
	}
	events, err := s.auditLog.ReadAudit(r.Context(), p.tenant, since, limit)
	if err != nil {
		s.log.Error("read audit log", "error", err)
		writeErr(w, call.Reject(call.KindUnavailable, call.ErrInternal, "toolpool could not read the audit log; retry"))
		return
	}
	if events == nil {
		events = []call.AuditEvent{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": events})
}
