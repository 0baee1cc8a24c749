package policy

import (
	"context"
	"slices"
	"testing"
)

// The tests in this file kill the mutants `make mutants` found surviving in policy's postures (the
// baseline, scripts/mutants-baseline.txt, names each), and the classes behind them.

// TestReadOnlyPostureKinds pins the read-only posture's kind rule on its own, under a policy that allows
// everything (the shipped policy asks for most writes, which hides a kind rule gone wrong): a tool of kind
// read, search or fetch runs, a tool of any other kind is refused by the posture, a built-in tool by its
// built-in kind (write_file and edit_file are edits, not reads), even when the policy allows the tool by
// name; the other postures leave every kind as the policy says.
func TestReadOnlyPostureKinds(t *testing.T) {
	p := mustParse(t, "version: 1\ndefault_action: allow\ntools:\n  write_file: {action: allow}\n  edit_file: {action: allow}\n")
	reads := []string{"read", "search", "fetch"}
	ctx := context.Background()
	for _, kind := range toolKinds {
		for _, posture := range []Posture{PostureInteractive, PostureAutonomous, PostureReadOnly} {
			d := p.Decide(ctx, Request{Tenant: "t", Tool: "custom_tool", Kind: kind, Posture: posture})
			want, rule := Allow, ""
			if posture == PostureReadOnly && !slices.Contains(reads, kind) {
				want, rule = Deny, RulePosture
			}
			if d.Action != want || (rule != "" && d.Rule != rule) {
				t.Errorf("kind %s under %s: %s by %s (%s); want %s by %q", kind, posture, d.Action, d.Rule, d.Reason, want, rule)
			}
		}
	}
	for tool, kind := range builtinKinds {
		if tool == "run_shell" { // the shell's own rule: TestReadOnlyShellNeedsACommandRule
			continue
		}
		d := p.Decide(ctx, Request{Tenant: "t", Tool: tool, Posture: PostureReadOnly, Facts: paths("a.txt")})
		want := Allow
		if !slices.Contains(reads, kind) {
			want = Deny
		}
		if d.Action != want {
			t.Errorf("built-in %s (kind %s) under read-only: %s by %s (%s); want %s", tool, kind, d.Action, d.Rule, d.Reason, want)
		}
		if want == Deny && d.Rule != RulePosture {
			t.Errorf("built-in %s refused by %s, want %s", tool, d.Rule, RulePosture)
		}
	}
}

// TestReadOnlyShellNeedsACommandRule: under the read-only posture a shell command runs only when a command
// rule allows it; allowed by the tool's action, its kind's, the default, or an approve-always rule, it is
// refused; an ask is refused whatever builtin_asks relaxes.
func TestReadOnlyShellNeedsACommandRule(t *testing.T) {
	ctx := context.Background()
	shell := func(cmd string, posture Posture) Request {
		return Request{Tenant: "t", Tool: "run_shell", Posture: posture, Facts: Facts{Command: cmd}}
	}
	for name, y := range map[string]string{
		"default":    "version: 1\ndefault_action: allow\n",
		"tool":       "version: 1\ndefault_action: deny\ntools:\n  run_shell: {action: allow}\n",
		"kind":       "version: 1\ndefault_action: deny\nkinds:\n  execute: allow\n",
		"command":    "version: 1\ndefault_action: deny\ncommands:\n  - {name: py, action: allow, commands: [python3]}\n",
		"relaxation": "version: 1\ndefault_action: allow\nbuiltin_asks:\n  redirect-write: allow\n",
	} {
		p := mustParse(t, y)
		ro := p.Decide(ctx, shell("python3 x.py", PostureReadOnly))
		in := p.Decide(ctx, shell("python3 x.py", PostureInteractive))
		switch name {
		case "command":
			if ro.Action != Allow {
				t.Errorf("%s: a command rule's allow under read-only: %s by %s (%s)", name, ro.Action, ro.Rule, ro.Reason)
			}
		default:
			if ro.Action != Deny || ro.Rule != RulePosture && name != "relaxation" {
				t.Errorf("%s: read-only: %s by %s (%s); want deny by %s", name, ro.Action, ro.Rule, ro.Reason, RulePosture)
			}
			if in.Action != Allow {
				t.Errorf("%s: interactive: %s by %s (%s); want allow", name, in.Action, in.Rule, in.Reason)
			}
		}
		if name == "relaxation" {
			if d := p.Decide(ctx, shell("ls > out.txt", PostureReadOnly)); d.Action != Deny {
				t.Errorf("read-only with redirect_write relaxed: %s by %s; want deny", d.Action, d.Rule)
			}
			if d := p.Decide(ctx, shell("ls > out.txt", PostureInteractive)); d.Action != Allow {
				t.Errorf("interactive with redirect_write relaxed: %s by %s (%s); want allow", d.Action, d.Rule, d.Reason)
			}
		}
	}
}
