package dispatcher

import (
	"errors"
	"fmt"
	"strings"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
)

// checkImage refuses image reference ref, given in field (`"image"` of a call, of a workspace) for tool
// (a workspace's default: "", judged by the images sections of the layers and the tenant), unless it is
// empty or policy's images.allow admits it: 403 with the rule and its patterns, 422 for a reference that
// does not parse. The reference is kept as written; the worker resolves it and the result names it by
// digest.
func (s *Server) checkImage(tenant, tool, field, ref string) error {
	if ref == "" {
		return nil
	}
	v, err := s.policy.CheckImage(tenant, tool, ref)
	if errors.Is(err, policy.ErrImageReference) {
		return &call.Rejection{Kind: call.KindInvalidParams, Type: call.ErrInvalidParams, Message: field + ": " + err.Error()}
	}
	if err != nil {
		return err
	}
	if !v.Allowed {
		allowed := "none"
		if len(v.Patterns) > 0 {
			allowed = strings.Join(v.Patterns, ", ")
		}
		return &call.Rejection{Kind: call.KindDenied, Type: call.ErrPolicyDenied,
			Message: fmt.Sprintf("image %q refused by rule %s: %s (allowed: %s)", ref, v.Rule, v.Reason, allowed)}
	}
	return nil
}
