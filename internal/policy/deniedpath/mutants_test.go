package deniedpath

import (
	"slices"
	"strings"
	"testing"
)

// The tests in this file kill the mutants `make mutants` found surviving in deniedpath (the baseline,
// scripts/mutants-baseline.txt, names each), and the classes behind them.

// TestDoubleStarCrossesDotDirectories: "**" matches every segment, hidden ones (".git", ".config") included,
// wherever it stands in the pattern, and "*" within a segment matches a leading dot. A "**" that skipped
// dot-directories would let "**/.env" miss ".devcontainer/.env": a denied file read through a hidden
// directory.
func TestDoubleStarCrossesDotDirectories(t *testing.T) {
	cases := []struct{ pattern, path string }{
		{"**/.env", "/workspace/.devcontainer/.env"},
		{"**/.env", "/workspace/.a/.b/.env"},
		{"**/*.pem", "/workspace/.config/x.pem"},
		{"**/*.pem", "/.hidden/x.pem"},
		{"**/*.pem", "/workspace/.x.pem"},
		{"~/**", "/workspace/.git/config"},
		{"~/.ssh/**", "/workspace/.ssh/.hidden/key"},
		{"/a/**/z", "/a/.b/.c/z"},
		{"/a/**", "/a/.b"},
		{"secrets/**/*.key", "/workspace/secrets/.old/a.key"},
		{"**/.git/**", "/workspace/repo/.git/.hooks/pre-commit"},
	}
	for _, c := range cases {
		g, err := CompileGlob(c.pattern)
		if err != nil {
			t.Fatalf("CompileGlob(%q): %v", c.pattern, err)
		}
		if !g.Match(c.path) {
			t.Errorf("%q does not match %q", c.pattern, c.path)
		}
		if set, _ := Compile([]string{c.pattern}); !matches(set, c.path) {
			t.Errorf("Set{%q} does not match %q", c.pattern, c.path)
		}
	}
}

func matches(s *Set, p string) bool { _, ok := s.Match(p); return ok }

// TestExpandHome pins "~" alone, "~/x" and "~user".
func TestExpandHome(t *testing.T) {
	for in, want := range map[string]struct {
		out string
		ok  bool
	}{
		"~": {WorkspaceRoot, true}, "~/": {WorkspaceRoot + "/", true}, "~/a/b": {WorkspaceRoot + "/a/b", true},
		"~root": {"~root", false}, "/etc": {"/etc", true}, "a~": {"a~", true},
	} {
		if out, ok := ExpandHome(in); out != want.out || ok != want.ok {
			t.Errorf("ExpandHome(%q) = %q, %v; want %q, %v", in, out, ok, want.out, want.ok)
		}
	}
	if g, err := CompileGlob("~"); err != nil || !g.Match(WorkspaceRoot) || g.Match("/workspacex") {
		t.Errorf(`CompileGlob("~") = %v, %v: want it to match the workspace root only`, g.Segments(), err)
	}
}

// TestCompileGlobSegments pins the normalization of each kind of segment: a trailing slash (only at the
// end, never the root), "**/**" folded, and the segments refused, each with its reason.
func TestCompileGlobSegments(t *testing.T) {
	good := map[string][]string{
		"dir/":         {"workspace", "dir"},
		"/":            nil,
		"/etc/":        {"etc"},
		"**/**/x":      {"**", "x"},
		"/a/**/**/**":  {"a", "**"},
		"**":           {"**"},
		"~/.ssh/**":    {"workspace", ".ssh", "**"},
		"/a/b/c.txt":   {"a", "b", "c.txt"},
		"x/**/y/**/**": {"workspace", "x", "**", "y", "**"},
	}
	for pattern, want := range good {
		g, err := CompileGlob(pattern)
		if pattern == "/" {
			if err == nil {
				t.Errorf("CompileGlob(%q) = %v, want an error (an empty segment)", pattern, g.Segments())
			}
			continue
		}
		if err != nil || !slices.Equal(g.Segments(), want) {
			t.Errorf("CompileGlob(%q) = %q, %v; want %q", pattern, g.Segments(), err, want)
		}
		if g.Source() != pattern {
			t.Errorf("Source() = %q, want %q", g.Source(), pattern)
		}
	}
	bad := map[string]string{
		"":        "empty",
		"a//b":    "empty or \".\" segment",
		"/a/./b":  "empty or \".\" segment",
		"a/.":     "empty or \".\" segment",
		"a/../b":  `".." segment`,
		"..":      `".." segment`,
		"a**":     "whole path segment",
		"**a/b":   "whole path segment",
		"a/b**/c": "whole path segment",
		"[a":      "malformed",
		"~x/y":    "only",
		"a\x00b":  "NUL",
	}
	for pattern, want := range bad {
		if _, err := CompileGlob(pattern); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CompileGlob(%q) error = %v, want one saying %q", pattern, err, want)
		}
		if _, err := Compile([]string{"ok/*", pattern}); err == nil {
			t.Errorf("Compile with %q: no error", pattern)
		}
	}
}
