package policy

import (
	"fmt"

	"github.com/toolpool/toolpool/internal/policy/shell"
)

// Action is what policy says about a call: run it, ask a person first, or refuse it. It is the shell
// analyser's type, so that the findings it returns need no translation.
type Action = shell.Action

// The three actions, from the most lenient to the strictest.
const (
	Allow = shell.Allow
	Ask   = shell.Ask
	Deny  = shell.Deny
)

func parseAction(s string) (Action, error) {
	a := Action(s)
	if !a.Valid() {
		return "", fmt.Errorf("%q is not an action: use allow, ask or deny", s)
	}
	return a, nil
}
