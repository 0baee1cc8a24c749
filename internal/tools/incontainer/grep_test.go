package incontainer

import (
	"fmt"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
)

func TestGrep(t *testing.T) {
	var ctx strings.Builder
	for i := 1; i <= 20; i++ {
		if i == 5 || i == 7 || i == 16 {
			fmt.Fprintf(&ctx, "MATCH %d\n", i)
		} else {
			fmt.Fprintf(&ctx, "line %d\n", i)
		}
	}
	ws := files(t, map[string]string{
		"a.go":              "package a\n\nfunc Hello() {}\n",
		"src/b.go":          "package b\n// hello there\n",
		"src/c.ts":          "const hello = 1;\r\n",
		"ctx.txt":           ctx.String(),
		"bin.dat":           "hello\x00world",
		".git/config":       "hello\n",
		"node_modules/x.js": "hello\n",
		"uni.txt":           "naïve café\n",
	})
	tests := []struct {
		name     string
		args     map[string]any
		wantType string
		want     string
	}{
		{name: "case sensitive", args: map[string]any{"pattern": "hello"}, want: "src/b.go:2:// hello there\nsrc/c.ts:1:const hello = 1;"},
		{name: "ignore case", args: map[string]any{"pattern": "hello", "ignore_case": true},
			want: "a.go:3:func Hello() {}\nsrc/b.go:2:// hello there\nsrc/c.ts:1:const hello = 1;"},
		{name: "glob on name", args: map[string]any{"pattern": "^package", "glob": "*.go"}, want: "a.go:1:package a\nsrc/b.go:1:package b"},
		{name: "glob on path", args: map[string]any{"pattern": "hello", "glob": "src/**/*.{ts,js}"}, want: "src/c.ts:1:const hello = 1;"},
		{name: "path is a file", args: map[string]any{"pattern": "package", "path": "src/b.go"}, want: "src/b.go:1:package b"},
		{name: "path is a dir", args: map[string]any{"pattern": "package", "path": "/workspace/src"}, want: "src/b.go:1:package b"},
		{name: "unicode", args: map[string]any{"pattern": `caf.$`}, want: "uni.txt:1:naïve café"},
		{name: "context", args: map[string]any{"pattern": "MATCH", "context": 1}, want: "" +
			"ctx.txt-4-line 4\nctx.txt:5:MATCH 5\nctx.txt-6-line 6\nctx.txt:7:MATCH 7\nctx.txt-8-line 8\n--\n" +
			"ctx.txt-15-line 15\nctx.txt:16:MATCH 16\nctx.txt-17-line 17"},
		{name: "limit", args: map[string]any{"pattern": "MATCH", "limit": 2},
			want: "ctx.txt:5:MATCH 5\nctx.txt:7:MATCH 7\n[stopped after 2 matching lines: narrow the pattern, path or glob, or raise limit (at most 2000)]"},
		{name: "no match", args: map[string]any{"pattern": "zebra"}, want: `No matches for "zebra" in /workspace.`},
		{name: "no match with glob", args: map[string]any{"pattern": "zebra", "glob": "*.go"}, want: `No matches for "zebra" in /workspace (files matching "*.go").`},
		{name: "invalid regexp", args: map[string]any{"pattern": "func("}, wantType: call.ErrInvalidParams,
			want: "invalid regular expression \"func(\": error parsing regexp: missing closing ): `func(` (Go RE2 syntax: escape literal characters such as ( [ . * + ? { | with \\, and note that lookaround and backreferences are not supported)"},
		{name: "missing path", args: map[string]any{"pattern": "x", "path": "nope"}, wantType: call.ErrNotFound,
			want: "search nope: no such file or directory in the workspace: check the path with list_files or glob"},
		{name: "bad glob", args: map[string]any{"pattern": "x", "glob": "[z"}, wantType: call.ErrInvalidParams,
			want: `glob pattern "[z" is malformed at "[z": syntax error in pattern (escape a literal *, ?, [ or \ with \)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, ws, "grep", tt.args)
			if errType(r) != tt.wantType || r.Output != tt.want {
				t.Errorf("got (%q)\n%s\nwant (%q)\n%s", errType(r), r.Output, tt.wantType, tt.want)
			}
		})
	}
}

func TestGrepLarge(t *testing.T) {
	var b strings.Builder
	for i := range 200_000 {
		fmt.Fprintf(&b, "row %d of a large file\n", i)
	}
	b.WriteString(strings.Repeat("y", 3<<20) + " needle\n") // a 3 MiB line
	ws := files(t, map[string]string{"big.txt": b.String()})
	r := run(t, ws, "grep", map[string]any{"pattern": `^row 1999(99|98) `})
	wantResult(t, r, "", "big.txt:199999:row 199998 of a large file\nbig.txt:200000:row 199999 of a large file")
	r = run(t, ws, "grep", map[string]any{"pattern": `^y+`})
	wantResult(t, r, "", "big.txt:200001:yyy", "more bytes]")
	if len(r.Output) > 1000 {
		t.Errorf("a long line was not cut: %d bytes", len(r.Output))
	}
}
