package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// TestToolsInContainers runs every built-in tool through the whole stack, each call in its own container,
// on the edge cases users hit.
func TestToolsInContainers(t *testing.T) {
	s := startStackWith(t, stackOptions{policy: permissivePolicy})
	callTool := func(tool string, args map[string]any) *call.Result {
		t.Helper()
		r := s.do(t, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": tool, "workspace": "tools", "args": args})
		if r.code != http.StatusOK {
			t.Fatalf("%s: HTTP %d %s", tool, r.code, r.body)
		}
		return r.result(t)
	}
	// The fixtures, written through the tools themselves.
	for path, content := range map[string]string{
		"empty.txt":       "",
		"nonl.txt":        "first\nlast without newline",
		"crlf.txt":        "one\r\ntwo\r\n",
		"unicode.txt":     "héllo wörld ✓ 日本語\n",
		"bin.dat":         "ELF\x00\x01\x02binary",
		"dir/inner.go":    "package inner\n\nfunc Dup() {}\nfunc Dup2() {}\n",
		"dup.txt":         "x = 1\nx = 1\n",
		"node_modules/a":  "ignored\n",
		"src/deep/b.go":   "package deep\n",
		"edit/target.txt": "alpha\nbeta\ngamma\n",
	} {
		if res := callTool("write_file", map[string]any{"path": path, "content": content}); res.Status != call.StatusOK {
			t.Fatalf("write %s: %+v", path, res.Error)
		}
	}
	// A large file: 60,000 lines.
	if res := s.shell(t, "dev-token", "tools", `awk 'BEGIN{for(i=1;i<=60000;i++) print "line " i > "large.txt"}'`, nil).result(t); res.Status != call.StatusOK {
		t.Fatalf("large file: %s", res.Output)
	}

	tests := []struct {
		name      string
		tool      string
		args      map[string]any
		status    call.Status
		errType   string
		contains  []string
		truncated bool
	}{
		{name: "read empty file", tool: "read_file", args: map[string]any{"path": "empty.txt"}, status: call.StatusOK, contains: []string{"empty"}},
		{name: "read file without final newline", tool: "read_file", args: map[string]any{"path": "nonl.txt"}, status: call.StatusOK, contains: []string{"1\tfirst", "2\tlast without newline"}},
		{name: "read CRLF file", tool: "read_file", args: map[string]any{"path": "crlf.txt"}, status: call.StatusOK, contains: []string{"1\tone\n", "2\ttwo"}},
		{name: "read unicode", tool: "read_file", args: map[string]any{"path": "unicode.txt"}, status: call.StatusOK, contains: []string{"héllo wörld ✓ 日本語"}},
		{name: "read large file with offset and limit", tool: "read_file", args: map[string]any{"path": "large.txt", "offset": 50000, "limit": 3}, status: call.StatusOK, contains: []string{"50000\tline 50000", "50002\tline 50002"}},
		{name: "read large file is capped with a hint", tool: "read_file", args: map[string]any{"path": "large.txt"}, status: call.StatusOK, contains: []string{"offset"}},
		{name: "read binary file is refused", tool: "read_file", args: map[string]any{"path": "bin.dat"}, status: call.StatusError, contains: []string{"binary"}},
		{name: "read missing file", tool: "read_file", args: map[string]any{"path": "nope.txt"}, status: call.StatusError, errType: call.ErrNotFound, contains: []string{"nope.txt"}},
		{name: "read a directory", tool: "read_file", args: map[string]any{"path": "dir"}, status: call.StatusError, contains: []string{"list_files"}},
		{name: "edit not unique", tool: "edit_file", args: map[string]any{"path": "dup.txt", "old_string": "x = 1", "new_string": "x = 2"}, status: call.StatusError, contains: []string{"2 times", "replace_all"}},
		{name: "edit not found", tool: "edit_file", args: map[string]any{"path": "edit/target.txt", "old_string": "delta", "new_string": "x"}, status: call.StatusError, contains: []string{"not found"}},
		{name: "edit replace_all", tool: "edit_file", args: map[string]any{"path": "dup.txt", "old_string": "x = 1", "new_string": "x = 2", "replace_all": true}, status: call.StatusOK, contains: []string{"+x = 2"}},
		{name: "edit unique returns a diff", tool: "edit_file", args: map[string]any{"path": "edit/target.txt", "old_string": "beta", "new_string": "BETA"}, status: call.StatusOK, contains: []string{"-beta", "+BETA"}},
		{name: "list files skips node_modules", tool: "list_files", args: map[string]any{"path": "."}, status: call.StatusOK, contains: []string{"dir/", "large.txt"}},
		{name: "glob with **", tool: "glob", args: map[string]any{"pattern": "**/*.go"}, status: call.StatusOK, contains: []string{"dir/inner.go", "src/deep/b.go"}},
		{name: "glob with no match", tool: "glob", args: map[string]any{"pattern": "**/*.rs"}, status: call.StatusOK, contains: []string{"No files match"}},
		{name: "grep with context", tool: "grep", args: map[string]any{"pattern": "func Dup2", "path": "dir"}, status: call.StatusOK, contains: []string{"dir/inner.go:4:"}},
		{name: "grep invalid regexp", tool: "grep", args: map[string]any{"pattern": "a(b"}, status: call.StatusError, errType: call.ErrInvalidParams, contains: []string{"missing closing )"}},
		{name: "run_shell in a subdirectory", tool: "run_shell", args: map[string]any{"command": "pwd; ls", "cwd": "src/deep"}, status: call.StatusOK, contains: []string{"/workspace/src/deep", "b.go"}},
	}
	t.Run("a path climbing out of the workspace is refused before it runs", func(t *testing.T) {
		r := s.do(t, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": "read_file", "workspace": "tools",
			"args": map[string]any{"path": "../../etc/passwd"}})
		if r.code != http.StatusUnprocessableEntity || !strings.Contains(r.errorInfo(t).Message, "climbs out of the workspace") {
			t.Fatalf("HTTP %d %s", r.code, r.body)
		}
	})
	t.Run("a planted symlink leads nowhere outside", func(t *testing.T) {
		// Policy asks before a command that names /; a person approves it here.
		plant := s.shell(t, "dev-token", "tools", "ln -s / escape && ln -s /etc/passwd pw", nil).result(t)
		if plant.Status != call.StatusPendingApproval {
			t.Fatalf("plant: %s %s", plant.Status, plant.Output)
		}
		s.do(t, http.MethodPost, "/v1/approvals/"+plant.ID, "dev-token", map[string]any{"decision": "approve"})
		if res := s.do(t, http.MethodGet, "/v1/calls/"+plant.ID+"?wait=30s", "dev-token", nil).result(t); res.Status != call.StatusOK {
			t.Fatalf("plant: %s %s", res.Status, res.Output)
		}
		for _, p := range []string{"escape/etc/passwd", "pw"} {
			res := callTool("read_file", map[string]any{"path": p})
			if ctrtest.Runtime() == containerd.GVisorRuntime && res.Status == call.StatusOK {
				// gVisor follows a symlink opened with O_DIRECTORY|O_NOFOLLOW (google/gvisor#14786), which
				// os.Root relies on, so the file tools can follow a planted symlink out of /workspace, but
				// only within the call's own container: what they read is its synthesized /etc/passwd.
				if !strings.Contains(res.Output, "sandbox:x:65532:65532") || strings.Count(res.Output, ":x:") != 3 {
					t.Fatalf("read %s through a symlink under gVisor: not the container's own passwd: %q", p, res.Output)
				}
				continue
			}
			if res.Status != call.StatusError || strings.Contains(res.Output, "root:x:0:0") {
				t.Fatalf("read %s through a symlink: %s %q", p, res.Status, res.Output)
			}
		}
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := callTool(tt.tool, tt.args)
			if res.Status != tt.status {
				t.Fatalf("status %s, want %s: %+v %q", res.Status, tt.status, res.Error, res.Output)
			}
			if tt.errType != "" && (res.Error == nil || res.Error.Type != tt.errType) {
				t.Fatalf("error %+v, want type %s", res.Error, tt.errType)
			}
			for _, want := range tt.contains {
				if !strings.Contains(strings.ToLower(res.Output), strings.ToLower(want)) {
					t.Errorf("output lacks %q:\n%s", want, res.Output)
				}
			}
			if strings.Contains(res.Output, "node_modules/a") {
				t.Errorf("an ignored directory was listed:\n%s", res.Output)
			}
		})
	}
}
