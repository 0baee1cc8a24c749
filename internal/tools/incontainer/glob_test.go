package incontainer

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

func TestGlob(t *testing.T) {
	names := []string{
		"main.go", "README.md", "src/a.go", "src/b_test.go", "src/web/app.ts", "src/web/view.tsx",
		"src/deep/er/x.go", ".git/objects/ab.go", "node_modules/pkg/index.js", "vendor/v.go",
	}
	fs := map[string]string{}
	for _, n := range names {
		fs[n] = "x"
	}
	ws := files(t, fs)
	// Later in names is newer, so the expected order is reverse alphabetical by that list.
	base := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, n := range names {
		mt := base.Add(time.Duration(i) * time.Hour)
		if err := os.Chtimes(filepath.Join(ws, n), mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name     string
		args     map[string]any
		wantType string
		want     string
	}{
		{name: "top level only", args: map[string]any{"pattern": "*.go"}, want: "main.go"},
		{name: "recursive newest first", args: map[string]any{"pattern": "**/*.go"},
			want: "vendor/v.go\nsrc/deep/er/x.go\nsrc/b_test.go\nsrc/a.go\nmain.go"},
		{name: "braces", args: map[string]any{"pattern": "src/**/*.{ts,tsx}"}, want: "src/web/view.tsx\nsrc/web/app.ts"},
		{name: "under path", args: map[string]any{"pattern": "*.go", "path": "src"}, want: "src/b_test.go\nsrc/a.go"},
		{name: "double star in the middle", args: map[string]any{"pattern": "src/**/x.go"}, want: "src/deep/er/x.go"},
		{name: "character class and ?", args: map[string]any{"pattern": "src/[ab]?*.go"}, want: "src/b_test.go"},
		{name: "ignored dir named in pattern", args: map[string]any{"pattern": "node_modules/**/*.js"}, want: "node_modules/pkg/index.js"},
		{name: "absolute pattern", args: map[string]any{"pattern": "/workspace/src/*.go"}, want: "src/b_test.go\nsrc/a.go"},
		{name: "limit", args: map[string]any{"pattern": "**/*.go", "limit": 2},
			want: "vendor/v.go\nsrc/deep/er/x.go\n[5 files match; showing the 2 most recently modified: narrow the pattern or path, or raise limit (at most 5000)]"},
		{name: "no match", args: map[string]any{"pattern": "**/*.rs"}, want: `No files match "**/*.rs" under /workspace.`},
		{name: "no match hint", args: map[string]any{"pattern": "*.ts"},
			want: `No files match "*.ts" under /workspace. The pattern has no "/", so it only matches files directly in that directory: try "**/*.ts" to search every level.`},
		{name: "bad pattern", args: map[string]any{"pattern": "src/[a"}, wantType: call.ErrInvalidParams,
			want: `glob pattern "src/[a" is malformed at "[a": syntax error in pattern (escape a literal *, ?, [ or \ with \)`},
		{name: "unclosed brace", args: map[string]any{"pattern": "*.{go"}, wantType: call.ErrInvalidParams,
			want: `glob pattern "*.{go" has a "{" without a matching "}"`},
		{name: "path is a file", args: map[string]any{"pattern": "*", "path": "main.go"}, wantType: call.ErrInvalidParams,
			want: "search main.go: it is a file, not a directory: give a directory as path"},
		{name: "missing path", args: map[string]any{"pattern": "*", "path": "nope"}, wantType: call.ErrNotFound,
			want: "search nope: no such file or directory in the workspace: check the path with list_files or glob"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, ws, "glob", tt.args)
			if errType(r) != tt.wantType || r.Output != tt.want {
				t.Errorf("got (%q)\n%s\nwant (%q)\n%s", errType(r), r.Output, tt.wantType, tt.want)
			}
		})
	}
}

func TestMatchSegs(t *testing.T) {
	tests := []struct {
		pattern, path string
		want          bool
	}{
		{"**", "a/b/c", true},
		{"**/*.go", "a.go", true},
		{"**/*.go", "a/b/c.go", true},
		{"a/**/b", "a/b", true},
		{"a/**/b", "a/x/y/b", true},
		{"a/**/b", "a/x/y/c", false},
		{"a/**", "a/x", true},
		{"*.go", "a/b.go", false},
		{"a/*/c", "a/b/c", true},
		{"a/*/c", "a/b/b/c", false},
		{"**/x/**/*.md", "p/x/q/r/y.md", true},
		{"{a,b}/*.go", "b/z.go", true},
		{"{a,b{c,d}}/z", "bd/z", true},
	}
	for _, tt := range tests {
		g, err := compileGlob(tt.pattern)
		if err != nil {
			t.Fatalf("%s: %v", tt.pattern, err)
		}
		if got := g.match(splitPath(tt.path)); got != tt.want {
			t.Errorf("match(%q, %q) = %v, want %v", tt.pattern, tt.path, got, tt.want)
		}
	}
}

func splitPath(p string) []string { return strings.Split(p, "/") }

// FuzzGlob checks the glob matcher against properties that a walk over the workspace relies on: it agrees
// with a plain recursive matcher built on path.Match (one pattern segment per path segment, "**" for any
// number of segments, each brace alternative on its own); without braces or "**" it is path.Match on the
// whole path (but that a character class never matches "/"); and it never prunes a directory below which a path matches (matchPrefix holds for every
// ancestor of a match), so glob cannot miss a file the pattern names.
func FuzzGlob(f *testing.F) {
	f.Add("**/*.{go,ts}", "a/b/c.go")
	f.Add("a/[b-", "a/b")
	f.Add("{{{a}}}", "a")
	f.Add("src/**/x.go", "src/deep/er/x.go")
	f.Add("a/**/b/**", "a/b")
	f.Add("**/x/**/*.md", "p/x/q/r/y.md")
	f.Add("*/?", "ab/c")
	f.Add("./a//b/.", "a/b")
	f.Add(`\*/[!a]`, "*/b")
	f.Fuzz(func(t *testing.T, pattern, p string) {
		g, err := compileGlob(pattern)
		if err != nil {
			return
		}
		segs := strings.Split(p, "/")
		if len(segs) > 8 || len(g.alts) > 8 {
			return // the reference matcher is exponential in "**"
		}
		got := g.match(segs)
		want := false
		for _, alt := range g.alts {
			if len(alt) > 8 {
				return
			}
			want = want || refMatch(alt, segs)
		}
		if got != want {
			t.Fatalf("compileGlob(%q).match(%q) = %v; the reference matcher says %v (alternatives %q)", pattern, p, got, want, g.alts)
		}
		// path.Match's character classes may match "/" ("[^0]" matches "/"), the glob's never do (it matches
		// segment by segment): with a class in the pattern only a glob match must be a path.Match match.
		if !strings.ContainsAny(pattern, "{}") && !strings.Contains(pattern, "**") {
			pm, err := path.Match(path.Clean(pattern), p)
			if err == nil && (got && !pm || !got && pm && !strings.Contains(pattern, "[")) {
				t.Fatalf("compileGlob(%q).match(%q) = %v; path.Match(%q, %q) = %v", pattern, p, got, path.Clean(pattern), p, pm)
			}
		}
		if got {
			for k := 1; k < len(segs); k++ {
				if !g.matchPrefix(segs[:k]) {
					t.Fatalf("%q matches %q, but matchPrefix(%q) prunes the directory it is in", pattern, p, strings.Join(segs[:k], "/"))
				}
			}
		}
	})
}

// refMatch is the plain recursive matcher FuzzGlob compares with: pattern segments against path segments,
// "**" for zero or more of them, path.Match for every other.
func refMatch(pat, segs []string) bool {
	switch {
	case len(pat) == 0:
		return len(segs) == 0
	case pat[0] == "**":
		return refMatch(pat[1:], segs) || len(segs) > 0 && refMatch(pat, segs[1:])
	case len(segs) == 0:
		return false
	}
	ok, _ := path.Match(pat[0], segs[0])
	return ok && refMatch(pat[1:], segs[1:])
}

// TestGlobEscapesInBraces: inside braces, a backslash escapes the next character, so "\}" and "\," are
// literal, not the end of the braces or a separator.
func TestGlobEscapesInBraces(t *testing.T) {
	tests := []struct {
		pattern string
		want    []string
	}{
		{`x{\},y}.txt`, []string{`x\}.txt`, `xy.txt`}},
		{`{x\,y,z}.txt`, []string{`x\,y.txt`, `z.txt`}},
		{`{a,\{b\}}`, []string{`a`, `\{b\}`}},
		{`{a,b\\}c`, []string{`ac`, `b\\c`}},
	}
	for _, tt := range tests {
		done := make(chan []string, 1)
		go func() {
			got, _ := expandBraces(tt.pattern)
			done <- got
		}()
		select {
		case got := <-done:
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("expandBraces(%q) = %q, want %q", tt.pattern, got, tt.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("expandBraces(%q) did not return within 10s", tt.pattern)
		}
	}
	ws := files(t, map[string]string{"x}.txt": "", "xy.txt": "", "xz.txt": "", "x,y.txt": "", "z.txt": "", "{b}.txt": ""})
	for pattern, want := range map[string][]string{
		`x{\},y}.txt`:  {"xy.txt", "x}.txt"}, // in byte order
		`{x\,y,z}.txt`: {"x,y.txt", "z.txt"},
		`\{b\}.txt`:    {"{b}.txt"},
	} {
		r := run(t, ws, "glob", map[string]any{"pattern": pattern})
		got := strings.Split(r.Output, "\n")
		slices.Sort(got)
		if errType(r) != "" || !slices.Equal(got, want) {
			t.Errorf("glob %q: got (%q)\n%s\nwant %q", pattern, errType(r), r.Output, want)
		}
	}
}
