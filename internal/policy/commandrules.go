package policy

import (
	"fmt"
	"strings"

	"github.com/toolpool/toolpool/internal/policy/shell"
)

// The engine's side of judging a shell command: the shell analyser (package shell) reads the line and
// asks, through shellRules, for the verdict of the command rules on each command it finds.

// judgeShell decides a shell command with its environment and working directory for e's tool, and
// reports what the analyser saw.
func (e *decideEnv) judgeShell(f Facts) (finding, shell.Seen) {
	res := shell.Judge(shellRules{e}, e.paths, shell.Input{Command: f.Command, Env: f.Env, Cwd: f.Cwd})
	v := e.newVerdict()
	if res.Found {
		v.add(fromShell(res.Finding, true))
	}
	if res.NoCommand {
		if tf := e.toolFinding(); tf.action == Deny {
			v.add(tf)
		} else {
			v.add(finding{action: Allow, rule: RuleNoCommand, detail: "the line runs no command"})
		}
	}
	return v.best, res.Seen
}

// shellRules is the shell analyser's view of one request's rules (shell.Rules).
type shellRules struct{ e *decideEnv }

func (r shellRules) Command(argv []string) (shell.Finding, bool) {
	f, listed := r.e.ruleFinding(argv)
	return r.e.final(f).toShell(), listed
}

func (r shellRules) Forbidden(argv []string) []shell.Finding {
	var out []shell.Finding
	for _, l := range r.e.layers {
		if f, ok := l.commandOpinion(argv); ok && f.action == Deny {
			out = append(out, r.e.final(f).toShell())
		}
	}
	return out
}

func (r shellRules) Shape(f shell.Finding) shell.Finding {
	return r.e.final(fromShell(f, false)).toShell()
}

// final shapes f by the posture and the built-in ask settings unless it is already shaped.
func (e *decideEnv) final(f finding) finding {
	if !f.shaped {
		f = e.shape(f)
		f.shaped = true
	}
	return f
}

func fromShell(f shell.Finding, shaped bool) finding {
	return finding{action: f.Action, rule: f.Rule, detail: f.Detail, blind: f.Blind, shaped: shaped}
}

func (f finding) toShell() shell.Finding {
	return shell.Finding{Action: f.action, Rule: f.rule, Detail: f.detail, Blind: f.blind}
}

// ruleFinding is the layers' verdict on argv from their command rules, or from their action for the
// tool when no rule of a layer names it. listed reports whether any layer has a rule for it.
func (e *decideEnv) ruleFinding(argv []string) (f finding, listed bool) {
	v := e.newVerdict()
	for _, l := range e.layers {
		if rf, ok := l.commandOpinion(argv); ok {
			v.add(rf)
			listed = true
			continue
		}
		if a, _, why, ok := l.toolAction(e.tool, e.kind); ok {
			v.add(unlistedFinding(a, l.origin, why, argv))
		}
	}
	if !v.set {
		v.add(finding{action: Ask, rule: RuleDefault, detail: fmt.Sprintf("`%s` is on no command list and no policy sets an action for %s, so a person must approve it", showArgv(argv), e.tool)})
	}
	return e.approved(v.best, argv), listed
}

func unlistedFinding(a Action, origin, why string, argv []string) finding {
	rule := RuleToolAction
	switch {
	case strings.HasPrefix(why, "sets tools of kind"):
		rule = RuleKindAction
	case strings.HasPrefix(why, "sets its default"):
		rule = RuleDefault
	}
	var detail string
	switch a {
	case Allow:
		detail = fmt.Sprintf("`%s` is on no command list; %s %s", showArgv(argv), origin, why)
	case Ask:
		detail = fmt.Sprintf("`%s` is on no command list; %s %s, so a person must approve it (commands on an allow list need no approval)", showArgv(argv), origin, why)
	default:
		detail = fmt.Sprintf("`%s` is on no command list; %s %s, so only listed commands run", showArgv(argv), origin, why)
	}
	return finding{action: a, rule: rule, detail: detail}
}

// showArgv names a command for a message: the program and, when it looks like a subcommand, the next
// word.
func showArgv(argv []string) string {
	if len(argv) > 1 && argv[1] != "\x00" && !strings.HasPrefix(argv[1], "-") && len(argv[1]) <= 24 && !strings.ContainsAny(argv[1], "/.=") {
		return argv[0] + " " + argv[1]
	}
	return argv[0]
}

// commandOpinion is a layer's longest matching command rule (the strictest among equally long ones).
func (l *layer) commandOpinion(argv []string) (finding, bool) {
	best := -1
	var bf finding
	for _, r := range l.commands {
		for _, p := range r.prefixes {
			if !hasPrefix(argv, p) {
				continue
			}
			if len(p) > best || len(p) == best && r.action.StricterThan(bf.action) {
				best = len(p)
				bf = finding{action: r.action, rule: r.name, detail: ruleDetail(r, p)}
			}
		}
	}
	return bf, best >= 0
}

func ruleDetail(r commandRule, prefix []string) string {
	what := "`" + strings.Join(prefix, " ") + "` "
	if r.reason != "" {
		return what + r.reason
	}
	switch r.action {
	case Allow:
		return what + "is allowed"
	case Ask:
		return what + "needs a person's approval"
	default:
		return what + "is not allowed"
	}
}
