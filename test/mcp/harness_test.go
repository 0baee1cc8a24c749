// Package mcp tests toolpool's /mcp endpoint with clients no one here wrote: the official MCP TypeScript
// SDK clients (test/mcp/client, installed from npm) against the real dispatcher binary, with its embedded
// NATS, and a real worker with its private containerd.
package mcp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/stacktest"
	"github.com/toolpool/toolpool/internal/testproc"
)

var (
	npmOnce    sync.Once
	npmInstErr error
)

func TestMain(m *testing.M) {
	code := m.Run()
	testproc.Cleanup()
	os.Exit(code)
}

// requireNode fails (CI=true) or skips the test unless Node.js 20 or later and npm are installed (the 2.x
// client needs 20), and installs the clients of client/package-lock.json into client/node_modules with
// npm ci (again only when the lock file changed since the last install).
func requireNode(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("this test needs root, containerd and Node.js: skipped under -short")
	}
	testproc.RequireNode(t, 20)
	npmOnce.Do(func() { npmInstErr = npmInstall() })
	if npmInstErr != nil {
		t.Fatal(npmInstErr)
	}
}

func npmInstall() error {
	lock, err := os.ReadFile("client/package-lock.json")
	if err != nil {
		return fmt.Errorf("read the clients' lock file: %w", err)
	}
	sum := sha256.Sum256(lock)
	stamp := filepath.Join("client", "node_modules", ".toolpool-lock-sha256")
	if b, err := os.ReadFile(stamp); err == nil && string(b) == hex.EncodeToString(sum[:]) {
		return nil
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = "client"
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm ci in test/mcp/client: %w\n%s", err, out)
	}
	return os.WriteFile(stamp, []byte(hex.EncodeToString(sum[:])), 0o644)
}

// The tenant of these tests (stacktest's): an approver (alice) and a caller whose calls go to workspace
// botspace.
const (
	approverToken = stacktest.ApproverToken
	callerToken   = stacktest.CallerToken
)

// stack is a running dispatcher (embedded NATS) and worker (private containerd).
type stack struct{ *stacktest.Stack }

// startStack starts the stack with /mcp open to browsers of https://app.example.com.
func startStack(t testing.TB) *stack {
	t.Helper()
	return &stack{stacktest.Start(t, stacktest.Options{
		Config: "mcp:\n  allowed_origins: [\"https://app.example.com\"]\n", WorkerID: "mcp-worker"})}
}

// node runs client/run.mjs with args and decodes the JSON it prints.
func node(t testing.TB, args ...string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{"run.mjs"}, args...)...)
	cmd.Dir = "client"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node run.mjs %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	var v map[string]any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("node run.mjs %s printed no JSON: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return v
}
