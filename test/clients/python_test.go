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

// debianPython is the interpreter the Python client is tested with: Debian's, with python3-pytest
// (scripts/deps.sh installs it), not whatever python3 comes first on PATH.
const debianPython = "/usr/bin/python3"

// requirePytest fails (CI=true) or skips the test unless Debian's python3 can import pytest.
func requirePytest(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("this test needs root, containerd and python3-pytest: skipped under -short")
	}
	if out, err := exec.Command(debianPython, "-c", "import pytest").CombinedOutput(); err != nil {
		testproc.Lack(t, "Debian's python3 with pytest (make deps installs python3-pytest): "+string(out))
	}
}

// TestPythonClient installs the Python client with pip (as a user does, from a copy of the directory;
// offline, with Debian's setuptools) and runs its suite (clients/python/tests) with Debian's pytest against the
// installed copy and the real stack.
func TestPythonClient(t *testing.T) {
	requirePytest(t)
	root, err := filepath.Abs("../../clients/python")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// pip builds in the source tree (build/, *.egg-info): build a copy, so the repository stays clean.
	tmp := t.TempDir()
	site, copied := filepath.Join(tmp, "site"), filepath.Join(tmp, "src")
	if err := os.CopyFS(copied, os.DirFS(root)); err != nil {
		t.Fatal(err)
	}
	pip := exec.CommandContext(ctx, debianPython, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
		"--no-index", "--target", site, copied)
	if out, err := pip.CombinedOutput(); err != nil {
		t.Fatalf("pip install clients/python: %v\n%s", err, out)
	}
	s := startStack(t, "")
	cmd := exec.CommandContext(ctx, debianPython, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PYTHONPATH="+site, "PYTHONDONTWRITEBYTECODE=1",
		"TOOLPOOL_URL="+s.URL, "TOOLPOOL_TOKEN="+callerToken, "TOOLPOOL_APPROVER_TOKEN="+approverToken)
	out, err := cmd.CombinedOutput()
	t.Logf("pytest:\n%s", out)
	if err != nil {
		t.Fatalf("the Python client's suite failed: %v", err)
	}
}
