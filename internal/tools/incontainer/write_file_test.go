package incontainer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
)

func TestWriteFile(t *testing.T) {
	ws := files(t, map[string]string{"old.txt": "old content", "dir/keep": ""})
	if err := os.Chmod(filepath.Join(ws, "old.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "target.txt"), []byte("target"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("target.txt", filepath.Join(ws, "link.txt")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     map[string]any
		wantType string
		wantOut  string
		file     string // the file to check afterwards
		content  string
		mode     os.FileMode
	}{
		{name: "create with parents", args: map[string]any{"path": "a/b/c.txt", "content": "héllo\n"},
			wantOut: "Created a/b/c.txt (7 bytes).", file: "a/b/c.txt", content: "héllo\n", mode: 0o644},
		{name: "overwrite keeps mode", args: map[string]any{"path": "old.txt", "content": "new"},
			wantOut: "Overwrote old.txt (3 bytes; it had 11 bytes).", file: "old.txt", content: "new", mode: 0o755},
		{name: "empty content", args: map[string]any{"path": "/workspace/empty.txt", "content": ""},
			wantOut: "Created empty.txt (0 bytes).", file: "empty.txt", content: "", mode: 0o644},
		{name: "through a symlink inside", args: map[string]any{"path": "link.txt", "content": "via link"},
			wantOut: "Overwrote link.txt (8 bytes; it had 6 bytes).", file: "target.txt", content: "via link", mode: 0o644},
		{name: "directory", args: map[string]any{"path": "dir", "content": "x"}, wantType: call.ErrInvalidParams, wantOut: "write dir: it is a directory"},
		{name: "workspace root", args: map[string]any{"path": ".", "content": "x"}, wantType: call.ErrInvalidParams, wantOut: "it is the workspace directory"},
		{name: "parent is a file", args: map[string]any{"path": "old.txt/x", "content": "x"}, wantType: call.ErrNotFound, wantOut: "not a directory"},
		{name: "missing content", args: map[string]any{"path": "x"}, wantType: call.ErrInvalidParams, wantOut: `"content" is required`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, ws, "write_file", tt.args)
			wantResult(t, r, tt.wantType, tt.wantOut)
			if tt.file == "" {
				return
			}
			b, err := os.ReadFile(filepath.Join(ws, tt.file))
			if err != nil || string(b) != tt.content {
				t.Errorf("file %s = %q, %v; want %q", tt.file, b, err, tt.content)
			}
			info, _ := os.Stat(filepath.Join(ws, tt.file))
			if info.Mode().Perm() != tt.mode {
				t.Errorf("mode = %v, want %v", info.Mode().Perm(), tt.mode)
			}
		})
	}
	if li, err := os.Lstat(filepath.Join(ws, "link.txt")); err != nil || li.Mode()&os.ModeSymlink == 0 {
		t.Error("the symlink was replaced")
	}
	var leftovers []string
	filepath.WalkDir(ws, func(p string, d os.DirEntry, err error) error {
		if strings.Contains(d.Name(), ".toolpool-") {
			leftovers = append(leftovers, p)
		}
		return nil
	})
	if len(leftovers) > 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}
