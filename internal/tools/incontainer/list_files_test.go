package incontainer

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
)

func TestListFiles(t *testing.T) {
	ws := files(t, map[string]string{
		"README.md":               "hello",
		"src/main.go":             "package main\n",
		"src/pkg/deep/x.go":       "package deep\n",
		".git/HEAD":               "ref: refs/heads/main\n",
		"node_modules/m/index.js": "x",
		"empty/.keep":             "",
	})
	if err := os.Symlink("README.md", filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(ws, "void"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     map[string]any
		wantType string
		want     string
	}{
		{name: "default depth 2", args: map[string]any{}, want: "" +
			"dir      .git/ (ignored: not listed; set include_ignored to see inside)\n" +
			"file     README.md (5 bytes)\n" +
			"dir      empty/\n" +
			"file     empty/.keep (0 bytes)\n" +
			"symlink  link -> README.md\n" +
			"dir      node_modules/ (ignored: not listed; set include_ignored to see inside)\n" +
			"dir      src/\n" +
			"file     src/main.go (13 bytes)\n" +
			"dir      src/pkg/\n" +
			"dir      void/"},
		{name: "depth 1 of a subdirectory", args: map[string]any{"path": "src", "depth": 1}, want: "" +
			"file     src/main.go (13 bytes)\n" +
			"dir      src/pkg/"},
		{name: "deep", args: map[string]any{"path": "/workspace/src/pkg", "depth": 5}, want: "" +
			"dir      src/pkg/deep/\n" +
			"file     src/pkg/deep/x.go (13 bytes)"},
		{name: "include ignored", args: map[string]any{"path": ".git", "include_ignored": true}, want: "file     .git/HEAD (21 bytes)"},
		{name: "inside an ignored dir named directly", args: map[string]any{"path": "node_modules", "depth": 3}, want: "" +
			"dir      node_modules/m/\n" +
			"file     node_modules/m/index.js (1 bytes)"},
		{name: "limit", args: map[string]any{"limit": 2}, want: "" +
			"dir      .git/ (ignored: not listed; set include_ignored to see inside)\n" +
			"file     README.md (5 bytes)\n" +
			"[listing cut at 2 entries: list a subdirectory, lower depth, or raise limit (at most 5000)]"},
		{name: "empty directory", args: map[string]any{"path": "void"}, want: "[void is an empty directory]"},
		{name: "a file", args: map[string]any{"path": "README.md"}, wantType: call.ErrInvalidParams, want: "list README.md: it is a file, not a directory: use read_file to read it"},
		{name: "missing", args: map[string]any{"path": "nope"}, wantType: call.ErrNotFound, want: "list nope: no such file or directory in the workspace: check the path with list_files or glob"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, ws, "list_files", tt.args)
			if errType(r) != tt.wantType || r.Output != tt.want {
				t.Errorf("got (%q)\n%s\nwant (%q)\n%s", errType(r), r.Output, tt.wantType, tt.want)
			}
		})
	}
}

func TestListFilesTruncated(t *testing.T) {
	fs := map[string]string{}
	for i := range 30 {
		fs[fmt.Sprintf("f%02d", i)] = ""
	}
	r := run(t, files(t, fs), "list_files", map[string]any{"limit": 10})
	if !r.Truncated {
		t.Error("not truncated")
	}
	wantResult(t, r, "", "file     f09 (0 bytes)\n[listing cut at 10 entries")
}
