package shell

import (
	"path"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/policy/deniedpath"
)

// FuzzDecoders checks the escape decoders: no panic, a string without backslashes decodes to itself,
// and $'...' never yields a NUL (bash's value is a C string).
func FuzzDecoders(f *testing.F) {
	for _, s := range []string{`\x73udo`, `\163`, `\u0073`, `\U0001F600`, `\c[`, `\0`, `a\`, `%b%s%%`, `\e[1m`, `%d`, `\x`, "plain"} {
		f.Add(s, "arg")
	}
	f.Fuzz(func(t *testing.T, s, arg string) {
		d := decodeANSIC(s)
		if strings.IndexByte(d, 0) >= 0 {
			t.Fatalf("decodeANSIC(%q) = %q holds a NUL", s, d)
		}
		if !strings.ContainsAny(s, "\\\x00") && d != s {
			t.Fatalf("decodeANSIC(%q) = %q, want it unchanged", s, d)
		}
		if e, _ := decodeEcho(s); !strings.Contains(s, `\`) && e != s {
			t.Fatalf("decodeEcho(%q) = %q, want it unchanged", s, e)
		}
		if out, ok := printfOutput([]string{s, arg, arg}); ok && len(out) > 64*(len(s)+2*len(arg))+64 {
			t.Fatalf("printfOutput(%q) is %d bytes", s, len(out))
		}
		_ = posixDollarQuotes(s)
	})
}

var pathSeeds = [][2]string{
	{"a.txt", "**/.env"}, {"~/.ssh/id_rsa", "~/.ssh/**"}, {"../../etc/passwd", "/etc/**"},
	{"/workspace2/x", "/workspace/**"}, {"a/./b/../c", "**/c"}, {"~", "~"}, {"~root", "**"},
	{"x\x00y", "*"}, {"/", "/*"}, {"//a//b/", "/a/*"}, {"\xff", "**/*.pem"}, {"a.pem", "**/*.p[e]m"},
	{"dir/", "dir/**"}, {".env.local", "**/.env.*"}, {"[x].key", `**/\[x\].key`},
}

// FuzzPath checks ResolvePath and the glob matcher: no panics; a resolved path is absolute, clean and
// resolves to itself; containment is by whole components; and a path that matches a denied glob is
// always found to intersect it, so the shell's glob check can never miss what the matcher catches.
func FuzzPath(f *testing.F) {
	for _, s := range pathSeeds {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, p, pattern string) {
		r, err := ResolvePath(p)
		if err == nil {
			if !strings.HasPrefix(r, "/") || path.Clean(r) != r || strings.ContainsRune(r, 0) {
				t.Fatalf("ResolvePath(%q) = %q: not a clean absolute path", p, r)
			}
			if again, err := ResolvePath(r); err != nil || again != r {
				t.Fatalf("ResolvePath(%q) = %q, but ResolvePath(%q) = %q, %v", p, r, r, again, err)
			}
			inside := r == WorkspaceRoot || strings.HasPrefix(r, WorkspaceRoot+"/")
			if within(WorkspaceRoot, r) != inside {
				t.Fatalf("within(%q, %q) = %v", WorkspaceRoot, r, !inside)
			}
			if !strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "~") && !strings.Contains(p, "..") && !inside {
				t.Fatalf("relative path %q resolved outside the workspace: %q", p, r)
			}
		}
		g, err := deniedpath.CompileGlob(pattern)
		if err != nil || r == "" {
			return
		}
		if g.Match(r) {
			lit := deniedpath.SplitAbs(escapeGlob(r))
			if !globsIntersect(lit, g.Segments()) {
				t.Fatalf("%q matches %q, but the intersection test says they cannot meet", r, pattern)
			}
		}
	})
}
