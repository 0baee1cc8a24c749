package policy

import (
	"fmt"
	"strings"
)

// Posture is how much a tenant's agents may do without a person. The dispatcher's configuration picks
// one per tenant; policy files do not.
//
//   - PostureInteractive (the default): decisions are as the policy says; a person approves what asks.
//   - PostureAutonomous: the container is the boundary. Everything that would ask runs without a person,
//     and only denials remain: forbidden programs, reverse shells, downloads piped into shells, writes
//     outside the roots, system paths and devices, denied paths. Two kinds of ask become denials instead,
//     because running them would mean running what policy cannot read: a line policy cannot parse (or
//     one too long or nested too deep), and a shell glob that may match a denied path.
//   - PostureReadOnly: nothing that writes or runs arbitrary programs. Every ask is a denial (whatever
//     the built-in ask settings relax), tools of the edit, delete, move, execute and other kinds are refused
//     (run_shell excepted), and a shell command runs only when a command rule allows it (not the tool's or
//     kind's action, nor an "approve always" rule). The operator's allow lists are trusted to list only
//     programs that read.
type Posture string

// The postures.
const (
	PostureInteractive Posture = "interactive"
	PostureAutonomous  Posture = "autonomous"
	PostureReadOnly    Posture = "read-only"
)

// ParsePosture checks a posture's name; "" is PostureInteractive.
func ParsePosture(s string) (Posture, error) {
	switch p := Posture(s); p {
	case "":
		return PostureInteractive, nil
	case PostureInteractive, PostureAutonomous, PostureReadOnly:
		return p, nil
	}
	return "", fmt.Errorf("posture %q is not one of interactive, autonomous, read-only", s)
}

// relaxableRules are the built-in checks that ask, and that builtin_asks may set: the operator's layer to
// allow, ask or deny, a tenant's layer only to ask or deny.
var relaxableRules = []string{
	RuleRedirectWrite, RuleUnresolved, RuleDangerousFlags, RuleInjectionEnv, RuleUnparseable,
	RuleOutsideRoots, RuleDeniedPath, RuleInvalidPath,
}

// readOnlyKinds are the kinds the read-only posture lets run.
var readOnlyKinds = map[string]bool{"read": true, "search": true, "fetch": true}

// shaper returns the function that every finding of a decision passes through: first the built-in ask
// settings of the layers (builtin_asks), then the posture.
func (e *decideEnv) shaper() func(finding) finding {
	asks := map[string]Action{}
	for i, l := range e.layers {
		for rule, a := range l.builtinAsks {
			if cur, ok := asks[rule]; ok && i > 0 {
				asks[rule] = cur.Stricter(a)
			} else if i > 0 {
				asks[rule] = Ask.Stricter(a) // a tenant can only tighten
			} else {
				asks[rule] = a
			}
		}
	}
	posture := e.posture
	return func(f finding) finding {
		if f.action == Ask && posture != PostureReadOnly {
			if a, ok := asks[f.rule]; ok && a != Ask {
				f.action = a
				f.detail = fmt.Sprintf("%s (builtin_asks sets %s to %s)", f.detail, f.rule, a)
			}
		}
		switch posture {
		case PostureAutonomous:
			if f.action != Ask {
				return f
			}
			if f.blind || f.rule == RuleDeniedPath {
				f.action = Deny
				f.detail += "; the autonomous posture refuses what policy cannot read rather than run it unread"
				return f
			}
			f.action = Allow
			f.detail = "the autonomous posture runs without approval what would otherwise ask: " + f.detail
		case PostureReadOnly:
			if f.action == Ask {
				f.action = Deny
				f.detail += "; the read-only posture refuses what would need approval"
				return f
			}
			if f.action == Allow && e.shell {
				switch f.rule {
				case RuleToolAction, RuleKindAction, RuleDefault, RuleApprovedAlways:
					return finding{action: Deny, rule: RulePosture, detail: "the read-only posture runs only the commands a command rule allows (" +
						strings.TrimSuffix(f.detail, ".") + "); use a command on the allow list"}
				}
			}
		}
		return f
	}
}

// postureFinding refuses, under the read-only posture, a tool whose kind writes or runs programs.
func (e *decideEnv) postureFinding() (finding, bool) {
	if e.posture != PostureReadOnly || e.shell || readOnlyKinds[e.kind] {
		return finding{}, false
	}
	return finding{action: Deny, rule: RulePosture, detail: fmt.Sprintf("the read-only posture refuses tools of kind %s, which write or run programs; use a read-only tool", e.kind)}, true
}
