package shell

import (
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/policy/deniedpath"
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
			g, err := deniedpath.CompileGlob(c.denied)
			if err != nil {
				t.Fatal(err)
			}
			if got := globsIntersect(deniedpath.SplitAbs(c.shell), g.Segments()); got != c.want {
				t.Errorf("globsIntersect(%q, %q) = %v, want %v", c.shell, c.denied, got, c.want)
			}
		})
	}
}
