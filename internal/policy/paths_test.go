package policy

import (
	"strings"
	"testing"
)

func TestResolvePath(t *testing.T) {
	cases := []struct {
		name, in, want string
		wantErr        string
	}{
		{"relative", "a/b.txt", "/workspace/a/b.txt", ""},
		{"dot", ".", "/workspace", ""},
		{"absolute", "/etc/passwd", "/etc/passwd", ""},
		{"tilde", "~", "/workspace", ""},
		{"tilde slash", "~/.ssh/id_rsa", "/workspace/.ssh/id_rsa", ""},
		{"cleans", "a//b/./c/../d/", "/workspace/a/b/d", ""},
		{"climbs out", "../x", "/x", ""},
		{"climbs past root", "../../../../x", "/x", ""},
		{"double slash root", "//", "/", ""},
		{"tilde user", "~root/x", "", "another user's home"},
		{"tilde plus", "~+", "", "another user's home"},
		{"empty", "", "", "empty"},
		{"NUL", "a\x00b", "", "control character"},
		{"newline", "a\nb", "", "control character"},
		{"DEL", "a\x7fb", "", "control character"},
		{"invalid UTF-8", "a\xffb", "", "UTF-8"},
		{"too long", strings.Repeat("a", 5000), "", "limit"},
		{"unicode", "données/été.txt", "/workspace/données/été.txt", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ResolvePath(c.in)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("ResolvePath(%q) = %q, %v; want an error saying %q", c.in, got, err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("ResolvePath(%q) = %q, %v; want %q", c.in, got, err, c.want)
			}
		})
	}
}

func TestWithin(t *testing.T) {
	cases := []struct {
		name, root, p string
		want          bool
	}{
		{"itself", "/workspace", "/workspace", true},
		{"child", "/workspace", "/workspace/a", true},
		{"deep child", "/workspace", "/workspace/a/b/c", true},
		{"sibling with common prefix", "/workspace", "/workspace2", false},
		{"sibling file with common prefix", "/workspace", "/workspace2/x", false},
		{"parent", "/workspace", "/", false},
		{"root contains all", "/", "/etc", true},
		{"tmp", "/tmp", "/tmpx", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := within(c.root, c.p); got != c.want {
				t.Errorf("within(%q, %q) = %v, want %v", c.root, c.p, got, c.want)
			}
		})
	}
}

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
			g, err := compileGlob(c.pattern)
			if err != nil {
				t.Fatalf("compileGlob(%q): %v", c.pattern, err)
			}
			if got := g.match(c.path); got != c.want {
				t.Errorf("%q.match(%q) = %v, want %v", c.pattern, c.path, got, c.want)
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
			if _, err := compileGlob(c.pattern); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("compileGlob(%q) = %v, want an error saying %q", c.pattern, err, c.want)
			}
		})
	}
}

// TestGlobsIntersect: can a shell glob from a command line reach a denied file?
func TestGlobsIntersect(t *testing.T) {
	cases := []struct {
		name, shell, denied string
		want                bool
	}{
		{"star reaches pem", "/workspace/*", "**/*.pem", true},
		{"star skips dotfiles", "/workspace/*", "**/.env", false},
		{"dot star reaches dotfiles", "/workspace/.*", "**/.env", true},
		{"question mark skips leading dot", "/workspace/?env", "**/.env", false},
		{"class skips leading dot", "/workspace/[.]env", "**/.env", false},
		{"inner star reaches", "/workspace/.e*v", "**/.env", true},
		{"different extension", "/workspace/*.go", "**/*.pem", false},
		{"same extension", "/workspace/src/*.pem", "**/*.pem", true},
		{"class may match", "/workspace/*.p[a-z]m", "**/*.pem", true},
		{"class cannot match", "/workspace/*.p[0-9]m", "**/*.pem", false},
		{"directory glob", "/workspace/*/id_rsa", "**/id_rsa", true},
		{"ssh dir", "/workspace/.ss?/*", "~/.ssh/**", true},
		{"deeper dir outside the denied one", "/workspace/src/*", "~/.ssh/**", false},
		{"doublestar in shell glob", "/workspace/**", "**/.git/config", true},
		{"multi-byte name", "/workspace/?", "/workspace/é", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, err := compileGlob(c.denied)
			if err != nil {
				t.Fatal(err)
			}
			if got := globsIntersect(splitAbs(c.shell), g.segments); got != c.want {
				t.Errorf("globsIntersect(%q, %q) = %v, want %v", c.shell, c.denied, got, c.want)
			}
		})
	}
}
