package incontainer

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
)

// secretsWorkspace holds secrets under the default policy's denied globs, and links to them.
func secretsWorkspace(t *testing.T) string {
	t.Helper()
	ws := files(t, map[string]string{
		"a.go":                "package a // SECRET is a word here\n",
		".env":                "SECRET=1\n",
		"config/.env":         "SECRET=2\n",
		"certs/server.key":    "SECRET key\n",
		".ssh/id_rsa":         "SECRET rsa\n",
		".docker/config.json": `{"auth": "SECRET"}` + "\n",
	})
	for link, target := range map[string]string{"link.txt": ".env", "dirlink": ".ssh", "nested/up.txt": "../config/.env"} {
		p := filepath.Join(ws, link)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	return ws
}

func defaultDenied(t *testing.T) []string {
	t.Helper()
	d := policy.Default().Decide(context.Background(), policy.Request{Tool: "grep"})
	if len(d.Limits.DeniedGlobs) == 0 {
		t.Fatal("the default policy has no denied globs")
	}
	return d.Limits.DeniedGlobs
}

// withPolicy adds the denied globs under PolicyArg, as the worker does (tools.Tool.WithPolicy, whose
// output package tools tests against RunnerMain).
func withPolicy(t *testing.T, args map[string]any, globs []string) map[string]any {
	t.Helper()
	out := maps.Clone(args)
	out[PolicyArg] = CallPolicy{DeniedGlobs: globs}
	return out
}

// TestSecretsStayOut: with the call's denied globs, no file tool returns a line of a denied file,
// whether it walks to it, names it through a link, or writes through a link.
func TestSecretsStayOut(t *testing.T) {
	globs := defaultDenied(t)
	tests := []struct {
		name     string
		tool     string
		args     map[string]any
		wantType string
		want     []string // fragments of the output
		dontWant []string
	}{
		{name: "grep walk skips denied files", tool: "grep", args: map[string]any{"pattern": "SECRET"},
			want: []string{"a.go:1:", "not searched: policy denies them"}, dontWant: []string{"SECRET=", "rsa", "auth", "SECRET key"}},
		{name: "grep of a denied directory", tool: "grep", args: map[string]any{"pattern": "SECRET", "path": ".ssh"}, wantType: call.ErrPolicyDenied},
		{name: "grep through a link to a secret", tool: "grep", args: map[string]any{"pattern": "SECRET", "path": "link.txt"}, wantType: call.ErrPolicyDenied},
		{name: "grep through a directory link", tool: "grep", args: map[string]any{"pattern": "SECRET", "path": "dirlink"}, want: []string{"No matches"}, dontWant: []string{"rsa"}},
		{name: "glob skips denied files", tool: "glob", args: map[string]any{"pattern": "**/*"},
			want: []string{"a.go", "not looked at"}, dontWant: []string{".env", "id_rsa", "server.key", "config.json"}},
		{name: "list_files skips denied entries", tool: "list_files", args: map[string]any{"depth": 3},
			want: []string{"a.go", "not listed: policy denies them"}, dontWant: []string{".env ", "id_rsa", ".ssh/"}},
		{name: "list_files of a denied directory", tool: "list_files", args: map[string]any{"path": ".ssh"}, wantType: call.ErrPolicyDenied},
		{name: "list_files hides a denied file", tool: "list_files", args: map[string]any{"path": ".docker"}, want: []string{"1 entries not listed"}, dontWant: []string{"config.json"}},
		{name: "read_file through a link", tool: "read_file", args: map[string]any{"path": "link.txt"}, wantType: call.ErrPolicyDenied,
			want: []string{"leads to .env"}, dontWant: []string{"SECRET"}},
		{name: "read_file through a directory link", tool: "read_file", args: map[string]any{"path": "dirlink/id_rsa"}, wantType: call.ErrPolicyDenied,
			dontWant: []string{"rsa\n"}},
		{name: "read_file through a relative link", tool: "read_file", args: map[string]any{"path": "nested/up.txt"}, wantType: call.ErrPolicyDenied},
		{name: "read_file of an ordinary file", tool: "read_file", args: map[string]any{"path": "a.go"}, want: []string{"package a"}},
		{name: "edit_file through a link", tool: "edit_file", args: map[string]any{"path": "link.txt", "old_string": "SECRET", "new_string": "x"},
			wantType: call.ErrPolicyDenied, dontWant: []string{"SECRET=1"}},
		{name: "write_file through a link", tool: "write_file", args: map[string]any{"path": "link.txt", "content": "x"}, wantType: call.ErrPolicyDenied},
		{name: "write_file into a linked denied directory", tool: "write_file", args: map[string]any{"path": "dirlink/authorized_keys", "content": "x"}, wantType: call.ErrPolicyDenied},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := secretsWorkspace(t)
			r := run(t, ws, tt.tool, withPolicy(t, tt.args, globs))
			wantResult(t, r, tt.wantType, tt.want...)
			for _, f := range tt.dontWant {
				if strings.Contains(r.Output, f) {
					t.Errorf("output holds %q:\n%s", f, r.Output)
				}
			}
			for name, want := range map[string]string{".env": "SECRET=1\n", ".ssh/id_rsa": "SECRET rsa\n"} {
				if b, err := os.ReadFile(filepath.Join(ws, name)); err != nil || string(b) != want {
					t.Errorf("%s is now %q (%v); a denied file must not change", name, b, err)
				}
			}
			if _, err := os.Stat(filepath.Join(ws, ".ssh", "authorized_keys")); err == nil {
				t.Error("a file was written into .ssh")
			}
		})
	}
}
