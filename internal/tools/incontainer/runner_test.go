package incontainer

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
)

// run calls RunnerMain for tool in workspace ws with args (a JSON string or a value to encode) and returns
// the decoded RunnerResult. It fails the test unless exactly one JSON object was written.
func run(t *testing.T, ws, tool string, args any, opts ...RunnerOption) RunnerResult {
	t.Helper()
	var in []byte
	switch a := args.(type) {
	case string:
		in = []byte(a)
	default:
		var err error
		if in, err = json.Marshal(a); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	code := RunnerMain(context.Background(), tool, ws, bytes.NewReader(in), &out, opts...)
	if code != RunnerExitOK {
		t.Fatalf("RunnerMain(%s) = %d, want %d; stdout %s", tool, code, RunnerExitOK, out.String())
	}
	dec := json.NewDecoder(&out)
	var res RunnerResult
	if err := dec.Decode(&res); err != nil {
		t.Fatalf("decode RunnerResult: %v (stdout %q)", err, out.String())
	}
	if dec.More() {
		t.Fatalf("RunnerMain wrote more than one JSON value")
	}
	return res
}

// files creates a workspace holding the given files (content by relative path) and returns its path.
func files(t *testing.T, fs map[string]string) string {
	t.Helper()
	ws := t.TempDir()
	writeFiles(t, ws, fs)
	return ws
}

// writeFiles writes the given files (content by relative path) into directory ws, readable by all.
func writeFiles(t *testing.T, ws string, fs map[string]string) {
	t.Helper()
	for name, content := range fs {
		p := filepath.Join(ws, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func errType(r RunnerResult) string {
	if r.Error == nil {
		return ""
	}
	return r.Error.Type
}

// wantResult checks a result's error type and that its output holds every wanted fragment.
func wantResult(t *testing.T, r RunnerResult, typ string, fragments ...string) {
	t.Helper()
	if got := errType(r); got != typ {
		t.Errorf("error type = %q, want %q (output %q)", got, typ, r.Output)
	}
	for _, f := range fragments {
		if !strings.Contains(r.Output, f) {
			t.Errorf("output lacks %q:\n%s", f, r.Output)
		}
	}
}

// TestRunnerMainEndToEnd runs every runner tool once through RunnerMain: JSON in, exactly one JSON out.
func TestRunnerMainEndToEnd(t *testing.T) {
	ws := files(t, map[string]string{"a.txt": "alpha\nbeta\n", "dir/b.go": "package b\n"})
	tests := []struct {
		name, tool, args string
		wantOut          string
	}{
		{"read_file", "read_file", `{"path":"a.txt"}`, "     1\talpha\n     2\tbeta\n"},
		{"write_file", "write_file", `{"path":"new/c.txt","content":"x"}`, "Created new/c.txt (1 bytes)."},
		{"edit_file", "edit_file", `{"path":"a.txt","old_string":"beta","new_string":"gamma"}`, "Edited a.txt: replaced 1 occurrence.\n\n--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n alpha\n-beta\n+gamma"},
		{"list_files", "list_files", `{"path":"dir"}`, "file     dir/b.go (10 bytes)"},
		{"glob", "glob", `{"pattern":"**/*.go"}`, "dir/b.go"},
		{"grep", "grep", `{"pattern":"^package"}`, "dir/b.go:1:package b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			code := RunnerMain(context.Background(), tt.tool, ws, strings.NewReader(tt.args), &out)
			if code != RunnerExitOK {
				t.Fatalf("exit code %d", code)
			}
			var raw map[string]any
			if err := json.Unmarshal(out.Bytes(), &raw); err != nil {
				t.Fatalf("stdout is not one JSON object: %v: %q", err, out.String())
			}
			if raw["error"] != nil {
				t.Fatalf("error %v", raw["error"])
			}
			if got := raw["output"].(string); got != tt.wantOut {
				t.Errorf("output =\n%q\nwant\n%q", got, tt.wantOut)
			}
		})
	}
	t.Run("web_fetch", func(t *testing.T) {
		// The full path through the egress proxy is in web_fetch_test.go; here only the JSON contract.
		r := run(t, ws, "web_fetch", `{"url":"http://example.com/"}`, WithEgressSocket(filepath.Join(t.TempDir(), "none.sock")))
		if errType(r) != "network_error" {
			t.Errorf("error type = %q, want network_error (%s)", errType(r), r.Output)
		}
	})
}

func TestRunnerMainUsage(t *testing.T) {
	ws := t.TempDir()
	tests := []struct {
		name, tool, workspace, args string
		wantCode                    int
		wantType                    string
		wantMsg                     string
	}{
		{"unknown tool", "nope", ws, `{}`, RunnerExitUsage, call.ErrInternal, `unknown tool "nope"`},
		{"run_shell is not a runner tool", "run_shell", ws, `{"command":"true"}`, RunnerExitUsage, call.ErrInternal, "unknown tool"},
		{"missing workspace", "read_file", filepath.Join(ws, "missing"), `{"path":"a"}`, RunnerExitUsage, call.ErrInternal, "open workspace"},
		{"bad JSON", "read_file", ws, `{"path":`, RunnerExitOK, call.ErrInvalidParams, "decode arguments"},
		{"unknown argument", "read_file", ws, `{"path":"a","bogus":1}`, RunnerExitOK, call.ErrInvalidParams, "bogus"},
		{"empty stdin means no arguments", "list_files", ws, ``, RunnerExitOK, "", "empty directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			code := RunnerMain(context.Background(), tt.tool, tt.workspace, strings.NewReader(tt.args), &out)
			if code != tt.wantCode {
				t.Errorf("code = %d, want %d", code, tt.wantCode)
			}
			var r RunnerResult
			if err := json.Unmarshal(out.Bytes(), &r); err != nil {
				t.Fatalf("stdout %q: %v", out.String(), err)
			}
			wantResult(t, r, tt.wantType, tt.wantMsg)
		})
	}
}

func TestRunnerMainCancelled(t *testing.T) {
	ws := files(t, map[string]string{"a.txt": "x\n"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out bytes.Buffer
	RunnerMain(ctx, "grep", ws, strings.NewReader(`{"pattern":"x"}`), &out)
	var r RunnerResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	wantResult(t, r, call.ErrCancelled, "stopped")
}

// TestEscapes proves no tool reaches outside the workspace, by ".." or through a planted symlink.
func TestEscapes(t *testing.T) {
	ws := files(t, map[string]string{"in.txt": "inside\n"})
	if err := os.Symlink("/", filepath.Join(ws, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(ws, "passwd")); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(ws, "out")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, tool string
		args       any
		wantType   string
		wantMsg    string
	}{
		{"read dotdot", "read_file", map[string]any{"path": "../../../../etc/passwd"}, call.ErrInvalidParams, "climbs out of the workspace"},
		{"read absolute outside", "read_file", map[string]any{"path": "/etc/passwd"}, call.ErrInvalidParams, "outside the workspace"},
		{"read absolute workspace dotdot", "read_file", map[string]any{"path": "/workspace/../etc/passwd"}, call.ErrInvalidParams, "outside the workspace"},
		{"read through dir symlink", "read_file", map[string]any{"path": "escape/etc/passwd"}, call.ErrPermissionDenied, "leads outside the workspace"},
		{"read file symlink", "read_file", map[string]any{"path": "passwd"}, call.ErrPermissionDenied, "leads outside the workspace"},
		{"write through symlink", "write_file", map[string]any{"path": "out/x.txt", "content": "pwned"}, call.ErrPermissionDenied, "leads outside the workspace"},
		{"write dotdot", "write_file", map[string]any{"path": "a/../../x.txt", "content": "pwned"}, call.ErrInvalidParams, "climbs out"},
		{"edit through symlink", "edit_file", map[string]any{"path": "escape/etc/hostname", "old_string": "", "new_string": "x"}, call.ErrPermissionDenied, "leads outside the workspace"},
		{"create through symlink", "edit_file", map[string]any{"path": "out/new.txt", "old_string": "", "new_string": "x"}, call.ErrPermissionDenied, "leads outside the workspace"},
		{"list through symlink", "list_files", map[string]any{"path": "escape/etc"}, call.ErrPermissionDenied, "leads outside the workspace"},
		{"list dotdot", "list_files", map[string]any{"path": ".."}, call.ErrInvalidParams, "climbs out"},
		{"glob through symlink", "glob", map[string]any{"pattern": "*", "path": "escape/etc"}, call.ErrPermissionDenied, "leads outside the workspace"},
		{"glob pattern dotdot", "glob", map[string]any{"pattern": "../*"}, call.ErrInvalidParams, `uses ".."`},
		{"grep through symlink", "grep", map[string]any{"pattern": "root", "path": "escape/etc/passwd"}, call.ErrPermissionDenied, "leads outside the workspace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, ws, tt.tool, tt.args)
			wantResult(t, r, tt.wantType, tt.wantMsg)
			if strings.Contains(r.Output, "root:") {
				t.Errorf("output shows /etc/passwd: %s", r.Output)
			}
		})
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("files were written outside the workspace: %v", entries)
	}
	t.Run("grep walk skips symlinks out", func(t *testing.T) {
		r := run(t, ws, "grep", map[string]any{"pattern": "root:"})
		wantResult(t, r, "", "No matches")
	})
}
