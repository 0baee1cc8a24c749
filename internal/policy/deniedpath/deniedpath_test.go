package deniedpath

import (
	"strings"
	"testing"
)

func TestGlobMatch(t *testing.T) {
	cases := []struct {
		name, pattern, path string
		want                bool
	}{
		{"anywhere at root of workspace", "**/.env", "/workspace/.env", true},
		{"anywhere nested", "**/.env", "/workspace/a/b/.env", true},
		{"anywhere outside workspace", "**/.env", "/tmp/.env", true},
		{"not a suffix match", "**/.env", "/workspace/x.env", false},
		{"not a longer name", "**/.env", "/workspace/.envrc", false},
		{"extension", "**/*.pem", "/workspace/certs/a.pem", true},
		{"extension wrong", "**/*.pem", "/workspace/certs/a.pem.txt", false},
		{"tilde dir itself", "~/.ssh/**", "/workspace/.ssh", true},
		{"tilde dir child", "~/.ssh/**", "/workspace/.ssh/id_rsa", true},
		{"tilde dir elsewhere", "~/.ssh/**", "/workspace/a/.ssh/id_rsa", false},
		{"relative to workspace", "secrets/*", "/workspace/secrets/db", true},
		{"relative is not anywhere", "secrets/*", "/workspace/a/secrets/db", false},
		{"absolute", "/etc/**", "/etc/ssl/x", true},
		{"middle doublestar", "/a/**/z", "/a/z", true},
		{"middle doublestar deep", "/a/**/z", "/a/b/c/z", true},
		{"middle doublestar wrong end", "/a/**/z", "/a/b/c/y", false},
		{"two doublestars", "**/x/**/y", "/q/x/r/s/y", true},
		{"star does not cross slash", "/a/*", "/a/b/c", false},
		{"question mark", "**/id_?sa", "/workspace/id_rsa", true},
		{"class", "**/*.p[eE]m", "/workspace/a.pEm", true},
		{"escaped star", `**/\*.txt`, "/workspace/*.txt", true},
		{"escaped star is literal", `**/\*.txt`, "/workspace/a.txt", false},
		{"trailing slash pattern", "build/", "/workspace/build", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, err := CompileGlob(c.pattern)
			if err != nil {
				t.Fatalf("CompileGlob(%q): %v", c.pattern, err)
			}
			if got := g.Match(c.path); got != c.want {
				t.Errorf("%q.Match(%q) = %v, want %v", c.pattern, c.path, got, c.want)
			}
		})
	}
}

func TestCompileGlobErrors(t *testing.T) {
	for _, c := range []struct{ name, pattern, want string }{
		{"empty", "", "empty"},
		{"NUL", "a\x00", "NUL"},
		{"doublestar inside a segment", "a**", "whole path segment"},
		{"malformed class", "[a", "malformed"},
		{"dot dot", "a/../b", `".."`},
		{"empty segment", "a//b", "empty"},
		{"tilde user", "~root/x", "workspace root"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := CompileGlob(c.pattern); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("CompileGlob(%q) = %v, want an error saying %q", c.pattern, err, c.want)
			}
		})
	}
}

func TestSet(t *testing.T) {
	d, err := Compile([]string{"**/.env", "~/.ssh/**"})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"/workspace/a/.env": "**/.env", "/workspace/.ssh/id_rsa": "~/.ssh/**", "/workspace/a.go": ""} {
		if got, ok := d.Match(p); got != want || ok != (want != "") {
			t.Errorf("Match(%q) = %q, %v; want %q", p, got, ok, want)
		}
	}
	if _, err := Compile([]string{"a**"}); err == nil || !strings.Contains(err.Error(), `compile denied glob "a**"`) {
		t.Errorf("Compile(a**) = %v, want an error naming the pattern", err)
	}
	var none *Set
	if nilSet, err := Compile(nil); err != nil || nilSet != nil {
		t.Errorf("Compile(nil) = %v, %v; want nil, nil", nilSet, err)
	}
	if _, ok := none.Match("/workspace/.env"); ok {
		t.Error("a nil Set matched")
	}
}
