package tools

import (
	"encoding/json"
	"fmt"

	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

// Policy's denied globs reach the runner inside the call's container as an argument of the call
// (incontainer.PolicyArg), which the runner takes out and applies; see package incontainer.

// TakesDeniedGlobs reports whether the tool's in-container runner applies policy's denied globs: the
// built-in tools that read or write files in the container. Others (run_shell, web_fetch, custom tools)
// ignore them, so a call of theirs need not carry them.
func (t *Tool) TakesDeniedGlobs() bool {
	return !t.Custom && t.spec != nil && t.spec.runner && !t.spec.egress
}

// WithPolicy returns args with the denied globs the runner must apply, for the tools that take them
// (TakesDeniedGlobs); other tools' arguments are returned as they are. args must have passed Validate.
func (t *Tool) WithPolicy(args json.RawMessage, deniedGlobs []string) (json.RawMessage, error) {
	if !t.TakesDeniedGlobs() || len(deniedGlobs) == 0 {
		return args, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(incontainer.NormalArgs(args), &m); err != nil {
		return nil, fmt.Errorf("add policy to %s arguments: %w", t.Name, err)
	}
	p, err := json.Marshal(incontainer.CallPolicy{DeniedGlobs: deniedGlobs})
	if err != nil {
		return nil, fmt.Errorf("add policy to %s arguments: %w", t.Name, err)
	}
	m[incontainer.PolicyArg] = p
	out, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("add policy to %s arguments: %w", t.Name, err)
	}
	return out, nil
}
