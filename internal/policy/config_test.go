package policy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestDefaultParses(t *testing.T) {
	p := Default()
	if p == nil || p.global == nil {
		t.Fatal("Default() returned no policy")
	}
	if p != Default() {
		t.Error("Default() returned a different policy on the second call")
	}
	// The shipped file also loads from disk, unchanged.
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, DefaultYAML(), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err != nil {
		t.Fatalf("Load(default.yaml): %v", err)
	}
	// Every built-in tool name validates with KnownTools.
	if _, err := Parse(DefaultYAML(), "default.yaml", KnownTools("read_file", "write_file", "edit_file", "list_files", "glob", "grep", "run_shell", "web_fetch")); err != nil {
		t.Fatalf("Parse(default.yaml, KnownTools): %v", err)
	}
}

func TestDefaultYAMLIsACopy(t *testing.T) {
	b := DefaultYAML()
	b[0] = '!'
	if DefaultYAML()[0] == '!' {
		t.Error("DefaultYAML returned the embedded bytes, not a copy")
	}
}

// TestParseErrors: every invalid file is rejected with the file, line and field named.
func TestParseErrors(t *testing.T) {
	cases := []struct {
		name  string
		yaml  string
		line  int
		field string
		msg   string // a substring of the error
	}{
		{"empty file", "", 0, "", "empty"},
		{"not a mapping", "- a\n- b\n", 1, "", "mapping"},
		{"syntax error", "default_action: [\n", 0, "", ""},
		{"unknown top-level field", "default_action: ask\ndefault_acton: allow\n", 2, "default_acton", `unknown field "default_acton"`},
		{"unknown tool field", "tools:\n  read_file:\n    acton: allow\n", 3, "tools.read_file.acton", "unknown field"},
		{"unknown rule field", "commands:\n  - name: x\n    action: allow\n    command: [ls]\n", 4, "commands.0.command", "unknown field"},
		{"bad default action", "default_action: alow\n", 1, "default_action", `"alow" is not an action`},
		{"bad tool action", "tools:\n  read_file:\n    action: yes\n", 3, "tools.read_file.action", "is not an action"},
		{"bad kind", "kinds:\n  reading: allow\n", 2, "kinds.reading", "not a tool kind"},
		{"bad kind action", "kinds:\n  read: sure\n", 2, "kinds.read", "not an action"},
		{"wrong type", "limits:\n  timeout_ms: soon\n", 2, "limits.timeout_ms", "whole number"},
		{"negative limit", "limits:\n  output_bytes: -1\n", 2, "limits.output_bytes", "negative"},
		{"bad glob", "paths:\n  denied_globs:\n    - '**/x'\n    - 'a**b'\n", 4, "paths.denied_globs[1]", "whole path segment"},
		{"malformed glob", "paths:\n  denied_globs: ['[x']\n", 2, "paths.denied_globs[0]", "malformed"},
		{"glob with ..", "paths:\n  denied_globs: ['a/../b']\n", 2, "paths.denied_globs[0]", `".."`},
		{"relative root", "paths:\n  allowed_roots: [workspace]\n", 2, "paths.allowed_roots[0]", "not absolute"},
		{"unclean root", "paths:\n  allowed_roots: [/workspace/../etc]\n", 2, "paths.allowed_roots[0]", "not clean"},
		{"bad domain", "tools:\n  web_fetch:\n    allowed_domains: ['https://x.org/']\n", 3, "tools.web_fetch.allowed_domains[0]", "bare host"},
		{"unknown preset", "tools:\n  run_shell:\n    egress_presets: [go, maven]\n", 3, "tools.run_shell.egress_presets[1]", `"maven" is not an egress preset`},
		{"bad port", "tools:\n  run_shell:\n    allowed_ports: [443, 70000]\n", 3, "tools.run_shell.allowed_ports[1]", "between 1 and 65535"},
		{"rule without commands", "commands:\n  - name: x\n    action: allow\n", 2, "commands[0].commands", "lists no commands"},
		{"rule with a path", "commands:\n  - name: x\n    action: deny\n    commands: [/usr/bin/rm]\n", 4, "commands[0].commands[0]", "without a directory"},
		{"rule with shell syntax", "commands:\n  - name: x\n    action: deny\n    commands: ['rm *']\n", 4, "commands[0].commands[0]", "literal words"},
		{"rule with a bad name", "commands:\n  - name: Read Only\n    action: allow\n    commands: [ls]\n", 2, "commands[0].name", "lowercase"},
		{"rule with a built-in name", "commands:\n  - name: denied-path\n    action: allow\n    commands: [ls]\n", 2, "commands[0].name", "built-in"},
		{"duplicate rule name", "commands:\n  - {name: a, action: allow, commands: [ls]}\n  - {name: a, action: deny, commands: [rm]}\n", 3, "commands[1].name", "used twice"},
		{"bad rule action", "commands:\n  - {name: a, action: perhaps, commands: [ls]}\n", 2, "commands[0].action", "not an action"},
		{"bad tool name", "tools:\n  'read file': {action: allow}\n", 2, "tools.read file", "character"},
		{"bad tenant name", "tenants:\n  '-acme': {default_action: ask}\n", 2, "tenants.-acme", "starts with"},
		{"tenant file in Parse", "tenants:\n  acme:\n    file: acme.yaml\n", 3, "tenants.acme.file", "only when the policy is loaded"},
		{"tenant file and fields", "tenants:\n  acme:\n    file: acme.yaml\n    default_action: ask\n", 2, "tenants.acme", "either file"},
		{"unknown tenant field", "tenants:\n  acme:\n    tool: {}\n", 3, "tenants.acme.tool", "unknown field"},
		{"bad tenant rule", "tenants:\n  acme:\n    commands:\n      - {name: a, action: never, commands: [ls]}\n", 4, "tenants.acme.commands[0].action", "not an action"},
		{"unsupported version", "version: 2\n", 1, "version", "not supported"},
		{"builtin_asks names a deny rule", "builtin_asks:\n  reverse-shell: allow\n", 2, "builtin_asks.reverse-shell", "not a built-in check that asks"},
		{"builtin_asks bad action", "builtin_asks:\n  redirect-write: sure\n", 2, "builtin_asks.redirect-write", "not an action"},
		{"tenant relaxes a built-in ask", "tenants:\n  acme:\n    builtin_asks: {redirect-write: allow}\n", 3, "tenants.acme.builtin_asks.redirect-write", "only tighten"},
		{"two documents", "default_action: ask\n---\ndefault_action: allow\n", 2, "", "more than one"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.yaml), "policy.yaml")
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			if !strings.HasPrefix(err.Error(), "parse policy: policy.yaml") {
				t.Errorf("error %q does not start with the file name", err)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %q is not a *ConfigError", err)
			}
			if ce.File != "policy.yaml" {
				t.Errorf("File = %q, want policy.yaml", ce.File)
			}
			if c.line != 0 && ce.Line != c.line {
				t.Errorf("Line = %d, want %d (%v)", ce.Line, c.line, err)
			}
			if c.field != "" && ce.Field != c.field && ce.Field != strings.ReplaceAll(strings.ReplaceAll(c.field, "[", "."), "]", "") {
				t.Errorf("Field = %q, want %q (%v)", ce.Field, c.field, err)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Errorf("error %q does not say %q", err, c.msg)
			}
		})
	}
}

func TestParseKnownTools(t *testing.T) {
	y := []byte("tools:\n  read_file: {action: allow}\n  my_tool: {action: ask}\n")
	if _, err := Parse(y, "p.yaml"); err != nil {
		t.Fatalf("unknown tool names must pass without KnownTools: %v", err)
	}
	_, err := Parse(y, "p.yaml", KnownTools("read_file"))
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "tools.my_tool" || ce.Line != 3 {
		t.Fatalf("Parse with KnownTools: %v, want an error at line 3 on tools.my_tool", err)
	}
}

func TestLoadTenantFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	main := write("policy.yaml", "default_action: allow\ntenants:\n  acme:\n    file: tenants/acme.yaml\n  globex:\n    default_action: deny\n")
	write("tenants/acme.yaml", "tools:\n  write_file: {enabled: false}\n")
	p, err := Load(main)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got, want := p.Sources(), []string{main, filepath.Join(dir, "tenants/acme.yaml")}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Sources() = %v, want %v", got, want)
	}
	if got := p.Tenants(); strings.Join(got, ",") != "acme,globex" {
		t.Errorf("Tenants() = %v", got)
	}
	if p.ToolEnabled("acme", "write_file", nil) {
		t.Error("acme's file disables write_file, but it is enabled")
	}

	write("tenants/acme.yaml", "tools:\n  write_file: {enabeld: false}\n")
	_, err = Load(main)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.File != filepath.Join(dir, "tenants/acme.yaml") || ce.Line != 2 || ce.Field != "tools.write_file.enabeld" {
		t.Fatalf("Load with a bad tenant file: %v; want the tenant file, line 2, tools.write_file.enabeld", err)
	}

	write("policy.yaml", "tenants:\n  acme:\n    file: missing.yaml\n")
	if _, err := Load(main); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("Load with a missing tenant file: %v, want an error naming it", err)
	}
	if _, err := Load(filepath.Join(dir, "nope.yaml")); err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Fatalf("Load of a missing file: %v", err)
	}
}

// TestEgressLimits: presets add their domains to the layer's allowlist, and each layer's domains and
// ports narrow the layers before it (operator, then tenant).
func TestEgressLimits(t *testing.T) {
	p, err := Parse([]byte(`
tools:
  run_shell:
    network: true
    egress_presets: [go, github]
    allowed_domains: [git.example.com]
    allowed_ports: [443, 80]
tenants:
  acme:
    tools:
      run_shell:
        egress_presets: [go]
        allowed_ports: [443, 8443]
  open:
    tools:
      run_shell: {action: allow}
`), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tenant  string
		domains []string
		ports   []int
	}{
		{"", []string{"git.example.com", "proxy.golang.org", "sum.golang.org", "github.com", "api.github.com", "codeload.github.com", "objects.githubusercontent.com", "raw.githubusercontent.com"}, []int{443, 80}},
		{"acme", []string{"proxy.golang.org", "sum.golang.org"}, []int{443}},
		{"open", []string{"git.example.com", "proxy.golang.org", "sum.golang.org", "github.com", "api.github.com", "codeload.github.com", "objects.githubusercontent.com", "raw.githubusercontent.com"}, []int{443, 80}},
	} {
		l := effectiveLimits(p.layersFor(tc.tenant), "run_shell")
		if !l.Network || !sameSet(l.AllowedDomains, tc.domains) || !slices.Equal(l.AllowedPorts, tc.ports) {
			t.Errorf("tenant %q: network %v, domains %v, ports %v; want true, %v, %v", tc.tenant, l.Network, l.AllowedDomains, l.AllowedPorts, tc.domains, tc.ports)
		}
	}
	if l := effectiveLimits(p.layersFor("acme"), "read_file"); l.AllowedPorts != nil || l.AllowedDomains != nil {
		t.Errorf("a tool without egress rules got domains %v, ports %v", l.AllowedDomains, l.AllowedPorts)
	}
	if got := EgressPresets(); !slices.Equal(got, []string{"crates", "debian", "github", "go", "npm", "pypi"}) {
		t.Errorf("EgressPresets() = %v", got)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func TestParseDomainsNilVersusEmpty(t *testing.T) {
	p, err := Parse([]byte("tools:\n  a: {allowed_domains: []}\n  b: {action: allow}\n"), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if l := effectiveLimits(p.layersFor(""), "a"); l.AllowedDomains == nil || len(l.AllowedDomains) != 0 {
		t.Errorf("allowed_domains: [] gave %#v, want an empty, non-nil list", l.AllowedDomains)
	}
	if l := effectiveLimits(p.layersFor(""), "b"); l.AllowedDomains != nil {
		t.Errorf("no allowed_domains gave %#v, want nil", l.AllowedDomains)
	}
}

// TestWriteGitControl: git's control files stay read-only in a tool's container unless every layer that
// mentions write_git_control grants it.
func TestWriteGitControl(t *testing.T) {
	p, err := Parse([]byte(`
tools:
  run_shell: {write_git_control: true}
tenants:
  locked:
    tools:
      run_shell: {write_git_control: false}
  open:
    tools:
      run_shell: {action: allow}
`), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for tenant, want := range map[string]bool{"": true, "open": true, "locked": false} {
		if got := effectiveLimits(p.layersFor(tenant), "run_shell").WriteGitControl; got != want {
			t.Errorf("tenant %q: run_shell write_git_control %v, want %v", tenant, got, want)
		}
	}
	if effectiveLimits(p.layersFor("open"), "grep").WriteGitControl {
		t.Errorf("a tool that does not mention it may write git's control files")
	}
	if Default().Decide(context.Background(), Request{Tenant: "t", Tool: "run_shell", Facts: Facts{Command: "ls"}}).Limits.WriteGitControl {
		t.Errorf("the shipped default lets run_shell write git's control files")
	}
}
