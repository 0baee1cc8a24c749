// Package mcp tests toolpool's /mcp endpoint with clients no one here wrote: the official MCP TypeScript
// SDK clients (test/mcp/client, installed from npm) against the real dispatcher binary, with its embedded
// NATS, and a real worker with its private containerd.
package mcp

import (
	"bufio"
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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error

	npmOnce sync.Once
	npmErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binaries builds the dispatcher and the worker once per test process.
func binaries(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "tpmcpbin"); buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-trimpath", "-o", binDir+"/",
			"github.com/toolpool/toolpool/cmd/dispatcher", "github.com/toolpool/toolpool/cmd/worker")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// requireNode fails (CI=true) or skips the test unless Node.js 18 or later is installed, installs the
// clients of client/package-lock.json into client/node_modules (again only when the lock file changed
// since the last install), and returns Node's major version: the 2.x clients need 20.
func requireNode(t testing.TB) int {
	t.Helper()
	out, err := exec.Command("node", "--version").Output()
	major := 0
	if v, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "v"); ok {
		major, _ = strconv.Atoi(strings.SplitN(v, ".", 2)[0])
	}
	if err != nil || major < 18 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("this test needs Node.js 18 or later and npm (make deps installs them): node --version: %q, %v", out, err)
		}
		t.Skipf("this test needs Node.js 18 or later and npm (make deps installs them): node --version: %q, %v", out, err)
	}
	npmOnce.Do(func() { npmErr = npmInstall() })
	if npmErr != nil {
		t.Fatal(npmErr)
	}
	return major
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

// proc is a started binary whose JSON log lines are collected.
type proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs []map[string]any
	raw  bytes.Buffer
	done chan struct{}
}

func start(t testing.TB, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(filepath.Join(binaries(t), name), args...), done: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			p.mu.Lock()
			p.raw.WriteString(sc.Text() + "\n")
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				p.logs = append(p.logs, m)
			}
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() { p.stop(t) })
	return p
}

// waitLog returns the first log line whose msg is msg, waiting up to timeout.
func (p *proc) waitLog(t testing.TB, msg string, timeout time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		for _, l := range p.logs {
			if l["msg"] == msg {
				p.mu.Unlock()
				return l
			}
		}
		p.mu.Unlock()
		select {
		case <-p.done:
			t.Fatalf("%s exited before logging %q:\n%s", p.name, msg, p.output())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("%s did not log %q within %s:\n%s", p.name, msg, timeout, p.output())
	return nil
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.raw.String()
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop(t testing.TB) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	waited := make(chan error, 1)
	go func() { waited <- p.cmd.Wait() }()
	select {
	case err := <-waited:
		if err != nil {
			t.Errorf("%s exited with %v:\n%s", p.name, err, p.output())
		}
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		<-waited
		t.Errorf("%s did not stop within 60s of SIGTERM", p.name)
	}
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
	dispatcher *proc
	worker     *proc
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
	natsURL := s.dispatcher.waitLog(t, "started embedded nats", 30*time.Second)["url"].(string)
	s.url = "http://" + s.dispatcher.waitLog(t, "dispatcher ready", 30*time.Second)["listen"].(string)
	s.worker = start(t, "worker", "--data-dir", filepath.Join(dir, "w"), "--nats-url", natsURL,
		"--listen", "127.0.0.1:0", "--id", "mcp-worker", "--slots", "4")
	s.worker.waitLog(t, "worker ready", 60*time.Second)
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
