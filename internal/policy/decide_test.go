package policy

import (
	"context"
	"slices"
	"strings"
	"testing"
)

func mustParse(t *testing.T, y string) *Policy {
	t.Helper()
	p, err := Parse([]byte(y), "test.yaml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return p
}

type decideCase struct {
	name string
	req  Request
	want Action
	rule string
}

func runDecideCases(t *testing.T, e Engine, cases []decideCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := e.Decide(context.Background(), c.req)
			if d.Action != c.want || (c.rule != "" && d.Rule != c.rule) {
				t.Errorf("Decide(%+v) = %s by %s (%s); want %s by %q", c.req, d.Action, d.Rule, d.Reason, c.want, c.rule)
			}
			if !strings.Contains(d.Reason, "by rule "+d.Rule+": ") {
				t.Errorf("reason %q does not name rule %q", d.Reason, d.Rule)
			}
		})
	}
}

func paths(p ...string) Facts { return Facts{Paths: p} }

// TestDecideFileTools: the default policy on the file tools and their paths.
func TestDecideFileTools(t *testing.T) {
	runDecideCases(t, Default(), []decideCase{
		{"read_file allows", Request{Tool: "read_file", Facts: paths("src/main.go")}, Allow, RuleToolAction},
		{"list_files allows", Request{Tool: "list_files", Facts: paths(".")}, Allow, RuleToolAction},
		{"glob allows", Request{Tool: "glob", Facts: paths("/workspace/src")}, Allow, ""},
		{"grep allows", Request{Tool: "grep", Facts: paths("~/src")}, Allow, ""},
		{"write_file asks", Request{Tool: "write_file", Facts: paths("out.txt")}, Ask, RuleToolAction},
		{"edit_file asks", Request{Tool: "edit_file", Facts: paths("main.go")}, Ask, RuleToolAction},
		{"web_fetch asks", Request{Tool: "web_fetch", Facts: Facts{URL: "https://go.dev/doc"}}, Ask, RuleToolAction},
		{"read .env", Request{Tool: "read_file", Facts: paths(".env")}, Deny, RuleDeniedPath},
		{"read nested .env", Request{Tool: "read_file", Facts: paths("a/b/.env")}, Deny, RuleDeniedPath},
		{"read pem", Request{Tool: "read_file", Facts: paths("certs/server.pem")}, Deny, RuleDeniedPath},
		{"read ssh key by ~", Request{Tool: "read_file", Facts: paths("~/.ssh/id_ed25519")}, Deny, RuleDeniedPath},
		{"write key", Request{Tool: "write_file", Facts: paths("x.key")}, Deny, RuleDeniedPath},
		{"read /etc/passwd", Request{Tool: "read_file", Facts: paths("/etc/passwd")}, Deny, RuleOutsideRoots},
		{"climb out", Request{Tool: "read_file", Facts: paths("../../etc/passwd")}, Deny, RuleOutsideRoots},
		{"sibling directory", Request{Tool: "read_file", Facts: paths("/workspace2/x")}, Deny, RuleOutsideRoots},
		{"climb out and back in", Request{Tool: "read_file", Facts: paths("a/../../workspace/b")}, Allow, ""},
		{"NUL in path", Request{Tool: "read_file", Facts: paths("a\x00b")}, Deny, RuleInvalidPath},
		{"empty path", Request{Tool: "read_file", Facts: paths("")}, Deny, RuleInvalidPath},
		{"another user's home", Request{Tool: "read_file", Facts: paths("~root/x")}, Deny, RuleInvalidPath},
		{"one bad path of several", Request{Tool: "list_files", Facts: paths("a", "b", ".env")}, Deny, RuleDeniedPath},
		{"no tool", Request{}, Deny, RuleInvalidRequest},
		{"custom read tool", Request{Tool: "my_reader", Kind: "read"}, Allow, RuleKindAction},
		{"custom execute tool", Request{Tool: "deploy", Kind: "execute"}, Ask, RuleKindAction},
		{"custom tool without kind", Request{Tool: "mystery"}, Ask, RuleKindAction},
		{"unknown kind counts as other", Request{Tool: "mystery", Kind: "weird"}, Ask, RuleKindAction},
		{"custom tool paths still checked", Request{Tool: "my_reader", Kind: "read", Facts: paths(".env")}, Deny, RuleDeniedPath},
		{"bad URL scheme", Request{Tool: "web_fetch", Facts: Facts{URL: "file:///etc/passwd"}}, Deny, RuleInvalidURL},
		{"URL without host", Request{Tool: "web_fetch", Facts: Facts{URL: "https:///x"}}, Deny, RuleInvalidURL},
	})
}

const layeredYAML = `
default_action: ask
kinds: {read: allow, search: allow, edit: ask, execute: ask, fetch: ask}
limits: {timeout_ms: 60000, output_bytes: 100000, max_file_bytes: 5000, max_results: 100}
paths:
  allowed_roots: [/workspace]
  denied_globs: ["**/.env"]
tools:
  read_file: {action: allow}
  write_file: {action: ask}
  run_shell:
    action: ask
    limits: {timeout_ms: 120000}
  web_fetch:
    action: allow
    network: true
    allowed_domains: [go.dev, "*.python.org", example.com]
  legacy_tool: {enabled: false}
commands:
  - {name: read-only-commands, action: allow, commands: [ls, cat, "git status", "git log"]}
  - {name: mutating-commands, action: ask, commands: [rm, "git push", "npm test"]}
  - {name: forbidden-commands, action: deny, reason: "is never allowed", commands: [sudo]}
tenants:
  acme:
    limits: {timeout_ms: 30000, max_results: 500}
    paths:
      denied_globs: ["**/secrets/**"]
    tools:
      write_file: {enabled: false}
      read_file: {action: deny}
      web_fetch:
        allowed_domains: [docs.python.org, evil.com]
        limits: {output_bytes: 50000}
    commands:
      - {name: acme-no-push, action: deny, reason: "is off for acme", commands: ["git push"]}
      - {name: acme-wants-npm, action: allow, commands: ["npm test", "git"]}
  strict:
    default_action: ask
    kinds: {read: ask}
    tools:
      run_shell: {action: deny}
      web_fetch: {network: false}
  loose:
    tools:
      read_file: {action: allow}
      write_file: {action: allow}
      legacy_tool: {enabled: true}
`

// TestDecideLayers: each layer can only tighten the one before it.
func TestDecideLayers(t *testing.T) {
	p := mustParse(t, layeredYAML)
	shell := func(tenant, cmd string) Request {
		return Request{Tenant: tenant, Tool: "run_shell", Facts: Facts{Command: cmd}}
	}
	runDecideCases(t, p, []decideCase{
		{"global allows read", Request{Tool: "read_file"}, Allow, RuleToolAction},
		{"tenant denies read", Request{Tenant: "acme", Tool: "read_file"}, Deny, RuleToolAction},
		{"tenant disables write_file", Request{Tenant: "acme", Tool: "write_file"}, Deny, RuleToolDisabled},
		{"other tenant unaffected", Request{Tenant: "globex", Tool: "write_file"}, Ask, ""},
		{"operator disables a tool", Request{Tool: "legacy_tool"}, Deny, RuleToolDisabled},
		{"tenant cannot re-enable", Request{Tenant: "loose", Tool: "legacy_tool"}, Deny, RuleToolDisabled},
		{"tenant cannot loosen ask", Request{Tenant: "loose", Tool: "write_file"}, Ask, RuleToolAction},
		{"tenant default tightens kinds", Request{Tenant: "strict", Tool: "my_reader", Kind: "read"}, Ask, RuleKindAction},
		{"tenant denied glob adds", Request{Tenant: "acme", Tool: "list_files", Facts: paths("app/secrets/db")}, Deny, RuleDeniedPath},
		{"tenant denied glob only for the tenant", Request{Tool: "list_files", Facts: paths("app/secrets/db")}, Allow, ""},
		{"global denied glob applies to tenant", Request{Tenant: "acme", Tool: "list_files", Facts: paths(".env")}, Deny, RuleDeniedPath},
		{"global shell allow", shell("", "git status"), Allow, "read-only-commands"},
		{"tenant rule tightens push", shell("acme", "git push origin"), Deny, "acme-no-push"},
		{"tenant allow cannot loosen", shell("acme", "npm test"), Ask, "mutating-commands"},
		{"tenant broad allow cannot loosen unlisted", shell("acme", "git commit -m x"), Ask, RuleToolAction},
		{"global deny stays", shell("acme", "sudo ls"), Deny, "forbidden-commands"},
		{"tenant denies all shell", shell("strict", "ls"), Deny, RuleToolAction},
		{"tenant denies empty shell line", shell("strict", "x=1"), Deny, RuleToolAction},
		{"unknown tenant gets global", shell("nobody", "ls"), Allow, ""},
		{"global domain allowlist", Request{Tool: "web_fetch", Facts: Facts{URL: "https://go.dev/x"}}, Allow, ""},
		{"global wildcard", Request{Tool: "web_fetch", Facts: Facts{URL: "https://docs.python.org/3/"}}, Allow, ""},
		{"wildcard excludes apex", Request{Tool: "web_fetch", Facts: Facts{URL: "https://python.org/"}}, Deny, RuleDomainNotAllowed},
		{"domain not listed", Request{Tool: "web_fetch", Facts: Facts{URL: "http://evil.com/"}}, Deny, RuleDomainNotAllowed},
		{"suffix is not a subdomain", Request{Tool: "web_fetch", Facts: Facts{URL: "https://notgo.dev/"}}, Deny, RuleDomainNotAllowed},
		{"IP address", Request{Tool: "web_fetch", Facts: Facts{URL: "http://169.254.169.254/latest"}}, Deny, RuleDomainNotAllowed},
		{"host case and port", Request{Tool: "web_fetch", Facts: Facts{URL: "https://GO.DEV:443/x"}}, Allow, ""},
		{"tenant narrows domains", Request{Tenant: "acme", Tool: "web_fetch", Facts: Facts{URL: "https://go.dev/x"}}, Deny, RuleDomainNotAllowed},
		{"tenant keeps a covered domain", Request{Tenant: "acme", Tool: "web_fetch", Facts: Facts{URL: "https://docs.python.org/x"}}, Allow, ""},
		{"tenant cannot add a domain", Request{Tenant: "acme", Tool: "web_fetch", Facts: Facts{URL: "https://evil.com/x"}}, Deny, RuleDomainNotAllowed},
	})
}

func TestDecideLimits(t *testing.T) {
	p := mustParse(t, layeredYAML)
	cases := []struct {
		name   string
		tenant string
		tool   string
		want   Limits
	}{
		{"global defaults", "", "read_file", Limits{TimeoutMS: 60000, OutputBytes: 100000, MaxFileBytes: 5000, MaxResults: 100}},
		{"tool overrides its layer", "", "run_shell", Limits{TimeoutMS: 120000, OutputBytes: 100000, MaxFileBytes: 5000, MaxResults: 100}},
		{"tenant tightens", "acme", "run_shell", Limits{TimeoutMS: 30000, OutputBytes: 100000, MaxFileBytes: 5000, MaxResults: 100}},
		{"tenant cannot loosen", "acme", "read_file", Limits{TimeoutMS: 30000, OutputBytes: 100000, MaxFileBytes: 5000, MaxResults: 100}},
		{"domains and network", "", "web_fetch", Limits{TimeoutMS: 60000, OutputBytes: 100000, MaxFileBytes: 5000, MaxResults: 100,
			AllowedDomains: []string{"go.dev", "*.python.org", "example.com"}, Network: true}},
		{"tenant domains intersect", "acme", "web_fetch", Limits{TimeoutMS: 30000, OutputBytes: 50000, MaxFileBytes: 5000, MaxResults: 100,
			AllowedDomains: []string{"docs.python.org"}, Network: true}},
		{"tenant turns network off", "strict", "web_fetch", Limits{TimeoutMS: 60000, OutputBytes: 100000, MaxFileBytes: 5000, MaxResults: 100,
			AllowedDomains: []string{"go.dev", "*.python.org", "example.com"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := p.Decide(context.Background(), Request{Tenant: c.tenant, Tool: c.tool})
			got := d.Limits
			if got.TimeoutMS != c.want.TimeoutMS || got.OutputBytes != c.want.OutputBytes || got.MaxFileBytes != c.want.MaxFileBytes ||
				got.MaxResults != c.want.MaxResults || got.Network != c.want.Network || !slices.Equal(got.AllowedDomains, c.want.AllowedDomains) {
				t.Errorf("Limits = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestIntersectDomains(t *testing.T) {
	cases := []struct {
		name string
		a, b []string
		want []string
	}{
		{"same", []string{"a.com"}, []string{"a.com"}, []string{"a.com"}},
		{"disjoint", []string{"a.com"}, []string{"b.com"}, []string{}},
		{"wildcard covers host", []string{"*.a.com"}, []string{"x.a.com", "a.com"}, []string{"x.a.com"}},
		{"wildcard covers narrower wildcard", []string{"*.com"}, []string{"*.a.com"}, []string{"*.a.com"}},
		{"narrower wildcard does not cover wider", []string{"*.a.com"}, []string{"*.com"}, []string{"*.a.com"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := intersectDomains(c.a, c.b); !slices.Equal(got, c.want) {
				t.Errorf("intersectDomains(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
			}
		})
	}
}

// TestDecideRequestTools: the request's tools map can only switch tools off.
func TestDecideRequestTools(t *testing.T) {
	p := mustParse(t, layeredYAML)
	runDecideCases(t, p, []decideCase{
		{"false refuses", Request{Tool: "read_file", RequestTools: map[string]bool{"read_file": false}}, Deny, RuleRequestTools},
		{"false on shell", Request{Tool: "run_shell", Facts: Facts{Command: "ls"}, RequestTools: map[string]bool{"write_file": false, "run_shell": false}}, Deny, RuleRequestTools},
		{"true changes nothing", Request{Tool: "write_file", RequestTools: map[string]bool{"write_file": true}}, Ask, ""},
		{"true cannot re-enable the tenant's", Request{Tenant: "acme", Tool: "write_file", RequestTools: map[string]bool{"write_file": true}}, Deny, RuleToolDisabled},
		{"true cannot re-enable the operator's", Request{Tool: "legacy_tool", RequestTools: map[string]bool{"legacy_tool": true}}, Deny, RuleToolDisabled},
		{"other tools unaffected", Request{Tool: "read_file", RequestTools: map[string]bool{"write_file": false}}, Allow, ""},
		{"unknown names ignored", Request{Tool: "read_file", RequestTools: map[string]bool{"no_such_tool": false}}, Allow, ""},
		{"empty map", Request{Tool: "read_file", RequestTools: map[string]bool{}}, Allow, ""},
	})
}

func TestToolEnabled(t *testing.T) {
	p := mustParse(t, layeredYAML)
	cases := []struct {
		name   string
		tenant string
		tool   string
		req    map[string]bool
		want   bool
	}{
		{"enabled by default", "", "read_file", nil, true},
		{"custom tool enabled by default", "", "my_tool", nil, true},
		{"operator disabled", "", "legacy_tool", nil, false},
		{"tenant disabled", "acme", "write_file", nil, false},
		{"tenant cannot re-enable", "loose", "legacy_tool", nil, false},
		{"request disables", "", "read_file", map[string]bool{"read_file": false}, false},
		{"request true cannot re-enable", "acme", "write_file", map[string]bool{"write_file": true}, false},
		{"request true keeps enabled", "", "read_file", map[string]bool{"read_file": true}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := p.ToolEnabled(c.tenant, c.tool, c.req); got != c.want {
				t.Errorf("ToolEnabled(%q, %q, %v) = %v, want %v", c.tenant, c.tool, c.req, got, c.want)
			}
		})
	}
}

func TestEngineFunc(t *testing.T) {
	var e Engine = EngineFunc(func(ctx context.Context, r Request) Decision {
		return Decision{Action: Deny, Rule: "test", Reason: r.Tool}
	})
	if d := e.Decide(context.Background(), Request{Tool: "x"}); d.Action != Deny || d.Reason != "x" {
		t.Errorf("EngineFunc.Decide = %+v", d)
	}
}

// TestDecideLongestPrefix: within a layer the longest matching argv prefix wins; rules never match by
// string prefix.
func TestDecideLongestPrefix(t *testing.T) {
	p := mustParse(t, `
tools: {run_shell: {action: ask}}
commands:
  - {name: git-ask, action: ask, commands: [git]}
  - {name: git-read, action: allow, commands: ["git diff", "git log"]}
  - {name: go-test-all, action: allow, commands: ["go test ./..."]}
`)
	shell := func(cmd string) Request { return Request{Tenant: "t1", Tool: "run_shell", Facts: Facts{Command: cmd}} }
	runDecideCases(t, p, []decideCase{
		{"longer prefix wins", shell("git diff --stat"), Allow, "git-read"},
		{"shorter prefix otherwise", shell("git push"), Ask, "git-ask"},
		{"not a string prefix", shell("git difftool"), Ask, "git-ask"},
		{"not a string prefix of the program", shell("gitk"), Ask, RuleToolAction},
		{"exact argv prefix with a path word", shell("go test ./..."), Allow, "go-test-all"},
		{"argv prefix with more words", shell("go test ./... -run X"), Allow, "go-test-all"},
		{"different argument", shell("go test ./pkg"), Ask, RuleToolAction},
		{"quotes are removed before matching", shell(`go 'test' "./..."`), Allow, "go-test-all"},
	})
}

// TestDecideClone: a workspace cloned from a git URL needs its tool granted network, and the URL's host
// must pass the tool's domain allowlist, as a command granted network would; tenants only narrow both.
func TestDecideClone(t *testing.T) {
	p := mustParse(t, `
version: 1
default_action: allow
tools:
  workspace_clone:
    network: true
    allowed_domains: [git.example.com, "*.corp.example"]
tenants:
  nonet:
    tools:
      workspace_clone: {network: false}
  narrow:
    tools:
      workspace_clone: {allowed_domains: [git.example.com]}
  asks:
    kinds: {workspace_clone: ask}
`)
	clone := func(tenant, url string) Request {
		return Request{Tenant: tenant, Tool: "workspace_clone", Kind: "workspace_clone", Facts: Facts{URL: url, Network: true}}
	}
	runDecideCases(t, p, []decideCase{
		{"listed host", clone("", "https://git.example.com/o/r.git"), Allow, ""},
		{"subdomain of a wildcard", clone("", "https://git.corp.example:8443/r.git"), Allow, ""},
		{"host not listed", clone("", "https://evil.example/r.git"), Deny, RuleDomainNotAllowed},
		{"tenant without network", clone("nonet", "https://git.example.com/o/r.git"), Deny, RuleNoNetwork},
		{"tenant narrows the hosts", clone("narrow", "https://git.corp.example/r.git"), Deny, RuleDomainNotAllowed},
		{"tenant keeps a host", clone("narrow", "https://git.example.com/o/r.git"), Allow, ""},
		{"tenant asks", clone("asks", "https://git.example.com/o/r.git"), Ask, RuleKindAction},
		{"no network needed, none checked", Request{Tenant: "nonet", Tool: "workspace_clone", Kind: "workspace_clone"}, Allow, ""},
	})
	// A policy that grants the tool nothing (the shipped one) denies every clone.
	runDecideCases(t, Default(), []decideCase{
		{"shipped policy", clone("", "https://github.com/o/r.git"), Deny, RuleNoNetwork},
	})
}

// TestDefaultDeniesEverySSHIdentity: every private key file name OpenSSH's ssh-keygen writes by default
// is a denied path under the default policy, wherever it lies (id_ed25519_sk, a security-key type, was
// readable: the list named four types of seven).
func TestDefaultDeniesEverySSHIdentity(t *testing.T) {
	var cases []decideCase
	for _, key := range []string{"id_rsa", "id_dsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk", "id_xmss"} {
		for _, dir := range []string{"", "keys/", "deploy/.config/"} {
			cases = append(cases, decideCase{"read " + dir + key, Request{Tool: "read_file", Facts: paths(dir + key)}, Deny, RuleDeniedPath})
		}
	}
	runDecideCases(t, Default(), cases)
}
