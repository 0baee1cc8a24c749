package policy

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckImage(t *testing.T) {
	p, err := Parse([]byte(`version: 1
default_action: allow
images:
  allow: [registry.example.com, ghcr.io/acme/, docker.io/library/python]
tools:
  web_fetch:
    images: {allow: [ghcr.io/acme/fetch], digests_only: true}
tenants:
  strict:
    images: {allow: [ghcr.io/acme/], digests_only: true}
`), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const digest = "@sha256:0123456789012345678901234567890123456789012345678901234567890123"
	for _, tt := range []struct {
		tenant, tool, ref string
		allowed           bool
		reason            string
	}{
		{"a", "run_shell", "registry.example.com/any/thing:1", true, ""},
		{"a", "run_shell", "ghcr.io/acme/python:3.12", true, ""},
		{"a", "run_shell", "python:3.12", true, ""}, // docker.io/library/python
		{"a", "run_shell", "ghcr.io/acmecorp/python:3.12", false, "ghcr.io/acme/"},
		{"a", "run_shell", "docker.io/library/python-evil:1", false, "not among the images"},
		{"a", "run_shell", "registry.example.com.evil.io/x:1", false, "registry.example.com, ghcr.io/acme/, docker.io/library/python"},
		{"a", "web_fetch", "ghcr.io/acme/fetch:1", false, "by digest only"},
		{"a", "web_fetch", "ghcr.io/acme/fetch" + digest, true, ""},
		{"a", "web_fetch", "ghcr.io/acme/python" + digest, false, "tools.web_fetch.images"},
		{"strict", "run_shell", "ghcr.io/acme/python:3.12", false, "tenant"},
		{"strict", "run_shell", "ghcr.io/acme/python" + digest, true, ""},
		{"strict", "run_shell", "registry.example.com/x" + digest, false, "ghcr.io/acme/"},
	} {
		v, err := p.CheckImage(tt.tenant, tt.tool, tt.ref)
		if err != nil {
			t.Fatalf("%s: %v", tt.ref, err)
		}
		if v.Allowed != tt.allowed || !strings.Contains(v.Reason, tt.reason) && !strings.Contains(v.Rule, tt.reason) {
			t.Errorf("%s %s %s: allowed %v rule %q reason %q; want %v and %q", tt.tenant, tt.tool, tt.ref, v.Allowed, v.Rule, v.Reason, tt.allowed, tt.reason)
		}
		if !v.Allowed && len(v.Patterns) == 0 {
			t.Errorf("%s: a refusal lists no allowed patterns", tt.ref)
		}
	}
	if _, err := p.CheckImage("a", "run_shell", "Bad::Ref"); !errors.Is(err, ErrImageReference) {
		t.Errorf("unparsable reference: err %v, want ErrImageReference", err)
	}
}

func TestNoImagesSectionAllowsNoImage(t *testing.T) {
	p, err := Parse([]byte("version: 1\ndefault_action: allow\n"), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	v, err := p.CheckImage("a", "run_shell", "python:3.12")
	if err != nil || v.Allowed || !strings.Contains(v.Reason, "images.allow") {
		t.Errorf("verdict %+v err %v: without an images section no image may be asked for", v, err)
	}
}

func TestImagePatternErrors(t *testing.T) {
	for _, tt := range []struct{ pattern, want string }{
		{"", "empty image pattern"},
		{"Registry.Example.com", "not a registry host"},
		{"ghcr.io/acme/python:3.12", "no tag or digest"},
		{"ghcr.io/ACME/", "not a repository prefix"},
	} {
		_, err := Parse([]byte("version: 1\ndefault_action: allow\nimages: {allow: ['"+tt.pattern+"']}\n"), "policy.yaml")
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "images.allow[0]") {
			t.Errorf("pattern %q: err %v, want one at images.allow[0] saying %q", tt.pattern, err, tt.want)
		}
	}
}
