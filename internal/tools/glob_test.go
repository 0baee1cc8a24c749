package tools

import (
	"os"
	"path/filepath"
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

func FuzzGlob(f *testing.F) {
	f.Add("**/*.{go,ts}", "a/b/c.go")
	f.Add("a/[b-", "a/b")
	f.Add("{{{a}}}", "a")
	f.Fuzz(func(t *testing.T, pattern, p string) {
		g, err := compileGlob(pattern)
		if err != nil {
			return
		}
		segs := strings.Split(p, "/")
		if len(segs) > 20 {
			return
		}
		g.match(segs)
		g.matchPrefix(segs)
	})
}
