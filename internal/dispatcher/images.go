package dispatcher

import (
	"errors"
	"fmt"
	"strings"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
)

// image chooses the image call req of tool runs on: the one the request asks for, which policy's
// images.allow must admit (403 with the rule and its patterns otherwise, 422 for a reference that does
// not parse), else the tenant's default, else none (the worker's default). The request's reference is
// kept as written; the worker resolves it and the result names it by digest.
func (s *Server) image(p principal, req *call.Request, tool string) (string, error) {
	if req.Image == "" {
		return p.image, nil
	}
	v, err := s.policy.CheckImage(p.tenant, tool, req.Image)
	if errors.Is(err, policy.ErrImageReference) {
		return "", &call.Rejection{Kind: call.KindInvalidParams, Type: call.ErrInvalidParams, Message: `"image": ` + err.Error()}
	}
	if err != nil {
		return "", err
	}
	if !v.Allowed {
		allowed := "none"
		if len(v.Patterns) > 0 {
			allowed = strings.Join(v.Patterns, ", ")
		}
		return "", &call.Rejection{Kind: call.KindDenied, Type: call.ErrPolicyDenied,
			Message: fmt.Sprintf("image %q refused by rule %s: %s (allowed: %s)", req.Image, v.Rule, v.Reason, allowed)}
	}
	return req.Image, nil
}
