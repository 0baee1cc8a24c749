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
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
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

// start starts the dispatcher or the worker binary.
func start(t testing.TB, name string, args ...string) *testproc.Proc {
	t.Helper()
	bin := testproc.Binaries(t, testproc.Stack...)
	return testproc.Start(t, filepath.Join(bin, name), nil, args...)
}

// The tenant of these tests: an approver (alice) and a caller whose calls go to workspace botspace.
const (
	approverToken = "acme-approver"
	callerToken   = "acme-caller"
)

const dispatcherConfig = `
api:
  tenants:
    - name: acme
      tokens:
        - {token: acme-approver, role: approver, name: alice}
        - {token: acme-caller, name: ci-bot, workspace: botspace}
mcp:
  allowed_origins: ["https://app.example.com"]
`

// testPolicy allows what it does not name; mkdir waits for a person and sudo is refused.
const testPolicy = `
version: 1
default_action: allow
commands:
  - name: forbidden-commands
    action: deny
    reason: never allowed here
    commands: [sudo]
  - name: mutating-commands
    action: ask
    reason: it changes the workspace
    commands: [mkdir]
`

// stack is a running dispatcher (embedded NATS) and worker (private containerd).
type stack struct {
	url        string
	dispatcher *testproc.Proc
	worker     *testproc.Proc
}

func startStack(t testing.TB) *stack {
	t.Helper()
	ctrtest.Require(t)
	dir := ctrtest.ShortTempDir(t)
	for name, content := range map[string]string{"dispatcher.yaml": dispatcherConfig, "policy.yaml": testPolicy} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := &stack{}
	s.dispatcher = start(t, "dispatcher", "--config", filepath.Join(dir, "dispatcher.yaml"), "--policy", filepath.Join(dir, "policy.yaml"),
		"--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "d"))
	natsURL := s.dispatcher.WaitLog(t, "started embedded nats", 30*time.Second)["url"].(string)
	s.url = "http://" + s.dispatcher.WaitLog(t, "dispatcher ready", 30*time.Second)["listen"].(string)
	s.worker = start(t, "worker", "--data-dir", filepath.Join(dir, "w"), "--nats-url", natsURL,
		"--listen", "127.0.0.1:0", "--id", "mcp-worker", "--slots", "4")
	s.worker.WaitLog(t, "worker ready", 60*time.Second)
	return s
}

// do sends a REST request and returns the status code and the decoded JSON body.
func (s *stack) do(t testing.TB, method, path, token string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var v map[string]any
	data, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("%s %s: HTTP %d, not JSON: %s", method, path, resp.StatusCode, data)
	}
	return resp.StatusCode, v
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
