package clients

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/testproc"
)

// TestTypeScriptClient installs the TypeScript client's dev dependencies from its lock file (npm ci),
// compiles its sources with tsc and requires the result to be the committed dist/ (what npm install of
// the directory gives a user, without a build), then runs its suite (clients/typescript/test) with node
// --test against the real stack.
func TestTypeScriptClient(t *testing.T) {
	if testing.Short() {
		t.Skip("this test needs root, containerd and Node.js: skipped under -short")
	}
	testproc.RequireNode(t, 20)
	root, err := filepath.Abs("../../clients/typescript")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	install := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	install.Dir = root
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in clients/typescript (installs typescript): %v\n%s", err, out)
	}
	built := t.TempDir()
	tsc := exec.CommandContext(ctx, "npx", "--no-install", "tsc", "-p", "tsconfig.json", "--outDir", built)
	tsc.Dir = root
	if out, err := tsc.CombinedOutput(); err != nil {
		t.Fatalf("tsc in clients/typescript: %v\n%s", err, out)
	}
	sameTree(t, built, filepath.Join(root, "dist"), "clients/typescript/dist is not what its sources compile to: run npm run build in clients/typescript and commit dist")
	s := startStack(t, "")
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-reporter=spec", "test/")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "TOOLPOOL_URL="+s.URL, "TOOLPOOL_TOKEN="+callerToken, "TOOLPOOL_APPROVER_TOKEN="+approverToken)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Fatalf("the TypeScript client's suite failed: %v", err)
	}
}

// sameTree fails the test unless directories want and got hold the same files with the same bytes.
func sameTree(t *testing.T, want, got, hint string) {
	t.Helper()
	read := func(dir string) map[string]string {
		files := map[string]string{}
		err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			rel, _ := filepath.Rel(dir, p)
			files[rel] = string(b)
			return err
		})
		if err != nil {
			t.Fatalf("%s: %v", hint, err)
		}
		return files
	}
	w, g := read(want), read(got)
	for name, content := range w {
		if g[name] != content {
			t.Fatalf("%s (%s differs)", hint, name)
		}
	}
	for name := range g {
		if _, ok := w[name]; !ok {
			t.Fatalf("%s (%s is not built from any source)", hint, name)
		}
	}
}
