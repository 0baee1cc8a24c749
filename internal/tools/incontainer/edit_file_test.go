package incontainer

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
)

func TestEditFile(t *testing.T) {
	const src = "package main\n\nfunc a() {\n\tx := 1\n\treturn\n}\n\nfunc b() {\n\tx := 1\n\treturn\n}\n"
	tests := []struct {
		name     string
		files    map[string]string
		args     map[string]any
		wantType string
		wantOut  string // exact when exact, else a fragment
		exact    bool
		file     string
		content  string
	}{
		{
			name: "unique replacement", files: map[string]string{"m.go": src},
			args:  map[string]any{"path": "m.go", "old_string": "func a() {\n\tx := 1", "new_string": "func a() {\n\tx := 2"},
			exact: true, wantOut: "Edited m.go: replaced 1 occurrence.\n\n--- a/m.go\n+++ b/m.go\n@@ -1,7 +1,7 @@\n package main\n \n func a() {\n-\tx := 1\n+\tx := 2\n \treturn\n }\n ",
			file: "m.go", content: strings.Replace(src, "x := 1", "x := 2", 1),
		},
		{
			name: "not unique", files: map[string]string{"m.go": src},
			args:     map[string]any{"path": "m.go", "old_string": "x := 1", "new_string": "x := 2"},
			wantType: call.ErrInvalidParams, wantOut: "edit m.go: old_string was found 2 times, but it must occur exactly once: add surrounding lines to make it unique, or set replace_all to true to replace all 2",
			file: "m.go", content: src,
		},
		{
			name: "replace_all", files: map[string]string{"m.go": src},
			args:    map[string]any{"path": "m.go", "old_string": "x := 1", "new_string": "y := 1", "replace_all": true},
			wantOut: "Edited m.go: replaced 2 occurrences.", file: "m.go", content: strings.ReplaceAll(src, "x := 1", "y := 1"),
		},
		{
			name: "not found", files: map[string]string{"m.go": src},
			args:     map[string]any{"path": "m.go", "old_string": "    x := 1", "new_string": "x"},
			wantType: call.ErrInvalidParams, wantOut: "edit m.go: old_string was not found in the file: the text occurs with different leading or trailing whitespace",
			file: "m.go", content: src,
		},
		{
			name: "not found at all", files: map[string]string{"m.go": src},
			args:     map[string]any{"path": "m.go", "old_string": "nothing like it", "new_string": "x"},
			wantType: call.ErrInvalidParams, wantOut: "check whitespace, indentation (tabs or spaces) and line breaks",
		},
		{
			name: "same strings", files: map[string]string{"m.go": src},
			args:     map[string]any{"path": "m.go", "old_string": "x", "new_string": "x"},
			wantType: call.ErrInvalidParams, wantOut: "old_string and new_string are the same",
		},
		{
			name: "create missing file", files: map[string]string{},
			args:  map[string]any{"path": "new/f.txt", "old_string": "", "new_string": "a\nb\n"},
			exact: true, wantOut: "Created new/f.txt (4 bytes).\n\n--- a/new/f.txt\n+++ b/new/f.txt\n@@ -0,0 +1,2 @@\n+a\n+b",
			file: "new/f.txt", content: "a\nb\n",
		},
		{
			name: "empty old_string on non-empty file", files: map[string]string{"m.go": src},
			args:     map[string]any{"path": "m.go", "old_string": "", "new_string": "x"},
			wantType: call.ErrInvalidParams, wantOut: "use write_file to replace the whole file",
		},
		{
			name: "missing file", files: map[string]string{},
			args:     map[string]any{"path": "gone.go", "old_string": "a", "new_string": "b"},
			wantType: call.ErrNotFound, wantOut: "edit gone.go: no such file or directory",
		},
		{
			name: "directory", files: map[string]string{"d/x": ""},
			args:     map[string]any{"path": "d", "old_string": "a", "new_string": "b"},
			wantType: call.ErrInvalidParams, wantOut: "edit d: it is a directory",
		},
		{
			name: "CRLF file matched with LF", files: map[string]string{"w.txt": "one\r\ntwo\r\nthree\r\n"},
			args:    map[string]any{"path": "w.txt", "old_string": "one\ntwo", "new_string": "one\n2"},
			wantOut: "Edited w.txt", file: "w.txt", content: "one\r\n2\r\nthree\r\n",
		},
		{
			name: "unicode", files: map[string]string{"u.txt": "héllo wörld\n"},
			args:    map[string]any{"path": "u.txt", "old_string": "wörld", "new_string": "世界"},
			wantOut: "-héllo wörld\n+héllo 世界", file: "u.txt", content: "héllo 世界\n",
		},
		{
			name: "no final newline", files: map[string]string{"n.txt": "a\nb"},
			args:  map[string]any{"path": "n.txt", "old_string": "b", "new_string": "c"},
			exact: true, wantOut: "Edited n.txt: replaced 1 occurrence.\n\n--- a/n.txt\n+++ b/n.txt\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file",
			file: "n.txt", content: "a\nc",
		},
		{
			name: "binary file", files: map[string]string{"b.bin": "\x00\x01abc"},
			args:     map[string]any{"path": "b.bin", "old_string": "abc", "new_string": "x"},
			wantType: call.ErrInvalidParams, wantOut: "binary",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := files(t, tt.files)
			r := run(t, ws, "edit_file", tt.args)
			wantResult(t, r, tt.wantType, tt.wantOut)
			if tt.exact && r.Output != tt.wantOut {
				t.Errorf("output =\n%s\nwant\n%s", r.Output, tt.wantOut)
			}
			if tt.file != "" {
				b, err := os.ReadFile(filepath.Join(ws, tt.file))
				if err != nil || string(b) != tt.content {
					t.Errorf("file = %q, %v; want %q", b, err, tt.content)
				}
			}
		})
	}
}

func TestUnifiedDiff(t *testing.T) {
	lines := func(n int) string {
		var b strings.Builder
		for i := 1; i <= n; i++ {
			b.WriteString("l" + string(rune('a'+(i-1)%26)) + "\n")
		}
		return b.String()
	}
	tests := []struct {
		name, before, old, new string
		all                    bool
		want                   string
	}{
		{"delete a whole line", "a\nb\nc\n", "b\n", "", false, "@@ -1,3 +1,2 @@\n a\n-b\n c"},
		{"insert lines", "a\nb\n", "a\n", "a\nx\ny\n", false, "@@ -1,2 +1,4 @@\n a\n+x\n+y\n b"},
		{"join lines", "a\nb\nc\n", "b\n", "B", false, "@@ -1,3 +1,2 @@\n a\n-b\n-c\n+Bc"},
		{"two hunks far apart", lines(30), "lb\n", "LB\n", true, "@@ -1,5 +1,5 @@\n la\n-lb\n+LB\n lc\n ld\n le\n@@ -25,6 +25,6 @@\n ly\n lz\n la\n-lb\n+LB\n lc\n ld"},
		{"two hunks merged", lines(10), "l", "L", true, "@@ -1,10 +1,10 @@\n-la\n-lb\n-lc\n-ld\n-le\n-lf\n-lg\n-lh\n-li\n-lj\n+La\n+Lb"},
		{"two changes on one line", "x x\nz\n", "x", "y", true, "@@ -1,2 +1,2 @@\n-x x\n+y y\n z"},
		{"two changes on a last line without newline", "x x", "x", "yy", true, "@@ -1 +1 @@\n-x x\n\\ No newline at end of file\n+yy yy\n\\ No newline at end of file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var spans []span
			var b strings.Builder
			start := 0
			for {
				i := strings.Index(tt.before[start:], tt.old)
				if i < 0 {
					break
				}
				i += start
				b.WriteString(tt.before[start:i])
				b.WriteString(tt.new)
				spans = append(spans, span{old: i, oldLen: len(tt.old), newLen: len(tt.new)})
				start = i + len(tt.old)
				if !tt.all {
					break
				}
			}
			b.WriteString(tt.before[start:])
			got := unifiedDiff("f", tt.before, b.String(), spans)
			got = strings.TrimPrefix(got, "--- a/f\n+++ b/f\n")
			if !strings.HasPrefix(got, tt.want) {
				t.Errorf("diff =\n%s\nwant prefix\n%s", got, tt.want)
			}
		})
	}
}

// applyDiff applies a unified diff made by unifiedDiff to before, for checking it.
func applyDiff(t *testing.T, before, diff string) string {
	t.Helper()
	old := splitLines(before)
	var out []string
	next := 0 // the next old line not yet copied
	lines := strings.Split(diff, "\n")
	for i := 2; i < len(lines); i++ { // skip the ---/+++ header
		l := lines[i]
		switch {
		case strings.HasPrefix(l, "@@ "):
			oldRange, _, _ := strings.Cut(strings.TrimPrefix(l, "@@ -"), " ")
			first, count, hasCount := strings.Cut(oldRange, ",")
			var n int
			fmt.Sscan(first, &n)
			start := n - 1
			if hasCount && count == "0" {
				start = n // an empty range names the line before
			}
			out = append(out, old[next:start]...)
			next = start
		case strings.HasPrefix(l, " "):
			out = append(out, old[next])
			next++
		case strings.HasPrefix(l, "-"):
			next++
		case strings.HasPrefix(l, "+"):
			text := l[1:] + "\n"
			if i+1 < len(lines) && lines[i+1] == `\ No newline at end of file` {
				text = l[1:]
			}
			out = append(out, text)
		}
	}
	out = append(out, old[next:]...)
	return strings.Join(out, "")
}

func FuzzEditDiff(f *testing.F) {
	f.Add("a\nb\nc\n", "b\n", "x", false)
	f.Add("a\nb", "b", "c\nd\n", false)
	f.Add("x x\nx\n", "x", "", true)
	f.Add("", "", "new\n", false)
	f.Fuzz(func(t *testing.T, before, old, new string, all bool) {
		if len(before) > 2000 || strings.Contains(before+old+new, "\r") {
			return
		}
		var spans []span
		var b strings.Builder
		start := 0
		if old == "" {
			if before != "" {
				return
			}
			spans = []span{{0, 0, len(new)}}
			b.WriteString(new)
		} else {
			for {
				i := strings.Index(before[start:], old)
				if i < 0 {
					break
				}
				i += start
				b.WriteString(before[start:i])
				b.WriteString(new)
				spans = append(spans, span{old: i, oldLen: len(old), newLen: len(new)})
				start = i + len(old)
				if !all {
					break
				}
			}
			b.WriteString(before[start:])
		}
		if len(spans) == 0 {
			return
		}
		after := b.String()
		diff := unifiedDiff("f", before, after, spans)
		if strings.Contains(diff, "[... diff cut") {
			return
		}
		// A "\ No newline" marker after a context or "-" line is informational for the old text.
		if got := applyDiff(t, before, diff); got != after {
			t.Fatalf("diff does not apply:\nbefore %q\nafter  %q\ngot    %q\ndiff:\n%s", before, after, got, diff)
		}
	})
}
