package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/tools/incontainer"
)

// TestWithPolicy: only the tools that touch files in the container carry the policy, and a model cannot
// send the field itself.
func TestWithPolicy(t *testing.T) {
	reg, err := NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"read_file", "write_file", "edit_file", "list_files", "glob", "grep"} {
		tl, _ := reg.Lookup(name)
		out, err := tl.WithPolicy(json.RawMessage(`{"path":"a"}`), []string{"**/.env"})
		if err != nil || !strings.Contains(string(out), `"_policy":{"denied_globs":["**/.env"]}`) {
			t.Errorf("%s: WithPolicy = %s, %v", name, out, err)
		}
		if err := tl.Validate(json.RawMessage(`{"path":"a","pattern":"x","content":"","old_string":"a","new_string":"b","_policy":{}}`)); err == nil {
			t.Errorf("%s: a request may send %s", name, incontainer.PolicyArg)
		}
	}
	for _, name := range []string{"run_shell", "web_fetch"} {
		tl, _ := reg.Lookup(name)
		in := json.RawMessage(`{"command":"ls"}`)
		if out, err := tl.WithPolicy(in, []string{"**/.env"}); err != nil || string(out) != string(in) {
			t.Errorf("%s: WithPolicy = %s, %v; want the arguments unchanged", name, out, err)
		}
	}
}

// TestWithPolicyReachesTheRunner: the arguments WithPolicy writes are what the runner reads: the denied
// file stays out, and the policy is not taken for an argument of the tool.
func TestWithPolicyReachesTheRunner(t *testing.T) {
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, ".env"), []byte("SECRET=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tl, _ := mustRegistry(t).Lookup("read_file")
	args, err := tl.WithPolicy(json.RawMessage(`{"path":".env"}`), []string{"**/.env"})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := incontainer.RunnerMain(context.Background(), "read_file", ws, bytes.NewReader(args), &out); code != incontainer.RunnerExitOK {
		t.Fatalf("RunnerMain = %d: %s", code, out.String())
	}
	got := tl.Finish(Run{Stdout: out.Bytes()})
	if got.Error == nil || got.Error.Type != call.ErrPolicyDenied || strings.Contains(got.Output, "SECRET") {
		t.Errorf("Finish = %+v, want a policy_denied error without the file", got)
	}
}
