package containerd_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// writeAttempts tries every way a shell has to change a workspace: create, append, truncate, remove,
// rename, mkdir, chmod, link, touch, in the root and in a subdirectory. It prints each one that worked.
const writeAttempts = `cd /workspace
echo new > created && echo "wrote created"
echo more >> keep && echo "appended keep"
: > keep && echo "truncated keep"
rm -f sub/inner && [ ! -e sub/inner ] && echo "removed sub/inner"
mv keep moved 2>/dev/null && echo "renamed keep"
mkdir dir && echo "made dir"
chmod 600 sub 2>/dev/null && echo "chmod sub"
ln -s x link 2>/dev/null && echo "made link"
touch -d 2001-01-01 sub 2>/dev/null && echo "touched sub"
exit 0`

// TestReadOnlyWorkspace: a Spec with WorkspaceReadOnly runs with its workspace read-only, warm and cold:
// nothing the process does changes a file on the host. Without it the same lines change the workspace
// (the control that shows the attempts work).
func TestReadOnlyWorkspace(t *testing.T) {
	rt, d, probe := newPooledRuntime(t, containerd.Config{})
	cold := ctrtest.NewRuntimeOn(t, containerd.Config{Address: d.Address()})
	for _, warm := range []bool{true, false} {
		for _, ro := range []bool{true, false} {
			name := map[bool]string{true: "warm", false: "cold"}[warm] + map[bool]string{true: " read-only", false: " writable"}[ro]
			t.Run(name, func(t *testing.T) {
				ws := workspace(t)
				if err := os.MkdirAll(filepath.Join(ws, "sub"), 0o755); err != nil {
					t.Fatal(err)
				}
				for _, f := range []string{"keep", "sub/inner"} {
					if err := os.WriteFile(filepath.Join(ws, f), []byte("original\n"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				before := treeOf(t, ws)
				spec := warmSpec(probe, ws, writeAttempts)
				spec.WorkspaceReadOnly = ro
				var out sandbox.Outcome
				if warm {
					out = runWarm(t, rt, spec)
				} else {
					var err error
					if out, err = cold.Run(context.Background(), spec); err != nil {
						t.Fatal(err)
					}
				}
				after := treeOf(t, ws)
				switch {
				case ro && (out.Stdout.String() != "" || after != before):
					t.Errorf("a read-only workspace changed: the call printed %q; before:\n%s\nafter:\n%s", out.Stdout.String(), before, after)
				case ro && !strings.Contains(out.Stderr.String(), "Read-only file system"):
					t.Errorf("the writes did not fail for a read-only file system: %q", out.Stderr.String())
				case !ro && (!strings.Contains(out.Stdout.String(), "wrote created") || after == before):
					t.Errorf("a writable workspace did not change (the attempts are broken): %q %q", out.Stdout.String(), out.Stderr.String())
				}
			})
		}
	}
}

// treeOf describes the files under dir: each path, mode, modification time and content.
func treeOf(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		b.WriteString(rel + " " + fi.Mode().String() + " " + fi.ModTime().String())
		if fi.Mode().IsRegular() {
			c, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b.WriteString(" " + strings.TrimSpace(string(c)))
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
