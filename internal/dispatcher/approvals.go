package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// decision is an approver's decision on a call waiting for approval.
type decision struct {
	approve bool // else deny
	// argsDigest, when not empty, must be the digest of the call's arguments: the approval binds to
	// exactly the arguments the approver saw.
	argsDigest string
	// always (with approve) adds a rule that allows this tool with argvPrefix for the tenant from now on.
	always     bool
	argvPrefix []string
	// reason (with deny) is the approver's word to the caller, checked by checkDenyReason.
	reason string
}

// maxDenyReason bounds a deny's reason, in bytes.
const maxDenyReason = 500

// checkDenyReason refuses a reason that does not go with a deny, is longer than maxDenyReason bytes, is
// not UTF-8 or holds control characters: it is shown to the model and to people as one line of text.
func checkDenyReason(decision, reason string) *call.Rejection {
	switch {
	case reason == "":
		return nil
	case decision != "deny":
		return invalid("a reason goes with a deny: send it with \"decision\": \"deny\", or leave it out to approve")
	case len(reason) > maxDenyReason:
		return invalid("the reason is %d bytes, over the %d-byte limit: say it shorter", len(reason), maxDenyReason)
	case !utf8.ValidString(reason) || strings.ContainsFunc(reason, unicode.IsControl):
		return invalid("the reason holds control characters or is not UTF-8: send one line of text")
	}
	return nil
}

// mayNotApprove refuses a token without the approver role.
func mayNotApprove() *call.Rejection {
	return call.Reject(call.KindForbidden, call.ErrPermissionDenied, "this token may not approve calls: approvals need a token with role approver")
}

// decide applies an approver's decision to a call waiting for approval: a denied call ends denied, an
// approved one is queued. The audit log records the decision with its actor, the token's holder and, when
// via is not empty, the channel it came through ("mcp"). The caller has checked that p may approve.
func (s *Server) decide(ctx context.Context, p principal, id string, d decision, via string) (*call.Result, error) {
	pc, err := s.approvals.GetPending(ctx, p.tenant, id)
	if errors.Is(err, queue.ErrNotFound) {
		return nil, &call.Rejection{Kind: call.KindNotFound, Type: call.ErrNotFound, Message: fmt.Sprintf("no call %s waits for approval", id)}
	}
	if err != nil {
		return nil, call.StateUnknown(id, "toolpool could not read the approval; retry")
	}
	if d.argsDigest != "" && d.argsDigest != pc.Call.ArgsDigest {
		return nil, &call.Rejection{Kind: call.KindConflict, Type: call.ErrDigestMismatch, Message: fmt.Sprintf("the call's arguments have digest %s, not %s: list the approvals again and approve what you see", pc.Call.ArgsDigest, d.argsDigest)}
	}
	if d.always && d.approve {
		if s.rules == nil {
			return nil, invalid("approve always is not available on this dispatcher")
		}
		if err := s.rules.AddAllowRule(ctx, p.tenant, pc.Call.Tool, d.argvPrefix); err != nil {
			return nil, invalid("add approve-always rule: %v", err)
		}
		if s.onRuleAdded != nil {
			s.onRuleAdded()
		}
	}
	rec, err := s.store.Get(ctx, id)
	if err != nil {
		return nil, call.StateUnknown(id, "toolpool could not read the call; retry")
	}
	res := s.expireIfDue(ctx, rec)
	if res.Status != call.StatusPendingApproval {
		_ = s.approvals.DeletePending(ctx, p.tenant, id)
		return nil, &call.Rejection{Kind: call.KindConflict, Type: call.ErrNotPending, Message: fmt.Sprintf("call %s is %s, no longer waiting for approval", id, res.Status)}
	}
	actor := p.tenant + "/" + p.role
	if p.name != "" {
		actor = p.tenant + "/" + p.name
	}
	if via != "" {
		actor += " via " + via
	}
	c := pc.Call
	if !d.approve {
		msg := "a person denied this call (" + actor + ")"
		if d.reason != "" {
			msg += ": " + d.reason
		}
		res.Fail(call.StatusDenied, call.ErrPolicyDenied, msg+"; do not retry it as it is")
		res.FinishedAt = s.now().UTC()
	} else {
		res.Status, res.Output = call.StatusQueued, ""
		c.Deadline = s.now().UTC().Add(s.cfg.QueueTimeout)
		res.Deadline = c.Deadline
	}
	if _, err := s.store.Update(ctx, res, rec.Revision); err != nil {
		return nil, &call.Rejection{Kind: call.KindConflict, Type: call.ErrConflict, Message: "the call changed meanwhile; list the approvals again"}
	}
	if s.recorder != nil {
		event := "rejected"
		if d.approve {
			event = "approved"
		}
		s.recorder.Record(ctx, event, res, actor)
	}
	if d.approve {
		if err := s.pub.Publish(ctx, c); err != nil {
			// The approval is recorded and the call parked still: the reconciler queues it.
			s.log.Error("publish approved call; the reconciler queues it later", "call_id", id, "error", err)
			return res, nil
		}
	}
	_ = s.approvals.DeletePending(ctx, p.tenant, id)
	return res, nil
}
