// Package stacktest starts toolpool's whole stack for the tests of what talks to it from outside (the MCP
// clients, the web console, the REST clients): the dispatcher binary with its embedded NATS and one
// worker binary with a private containerd, serving one tenant, acme, with an approver and a caller, under
// a policy where mkdir asks and sudo is denied. It needs root and containerd (ctrtest.Require).
package stacktest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
	"github.com/toolpool/toolpool/internal/testproc"
)

// The tenant's tokens: an approver (alice) and a caller (ci-bot) whose calls go to workspace botspace.
const (
	ApproverToken = "acme-approver"
	CallerToken   = "acme-caller"
)

// Policy allows what it does not name; mkdir waits for a person (rule mutating-commands) and sudo is
// refused (rule forbidden-commands).
const Policy = `
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

// Options vary the stack.
type Options struct {
	// API is more YAML for the dispatcher config's api: section, each line indented by two spaces
	// ("  max_upload_bytes: 1048576\n").
	API string
	// Config is more top-level YAML for the dispatcher's config (mcp:, console:, queue:).
	Config string
	// WorkerListen is the worker's metrics address (default: a port of the system's choice).
	WorkerListen string
	// WorkerID names the worker (default "stack-worker").
	WorkerID string
}

// Stack is a running dispatcher and worker; both stop when the test ends.
type Stack struct {
	URL        string // the dispatcher's, http://127.0.0.1:PORT
	Dispatcher *testproc.Proc
	Worker     *testproc.Proc
}

// Start starts the stack for t, with the worker ready to take calls. It fails the test (CI=true) or skips
// it without root and containerd.
func Start(t testing.TB, o Options) *Stack {
	t.Helper()
	ctrtest.Require(t)
	dir := ctrtest.ShortTempDir(t)
	config := "api:\n" + o.API + `  tenants:
    - name: acme
      tokens:
        - {token: ` + ApproverToken + `, role: approver, name: alice}
        - {token: ` + CallerToken + `, name: ci-bot, workspace: botspace}
` + o.Config
	for name, content := range map[string]string{"dispatcher.yaml": config, "policy.yaml": Policy} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if o.WorkerListen == "" {
		o.WorkerListen = "127.0.0.1:0"
	}
	if o.WorkerID == "" {
		o.WorkerID = "stack-worker"
	}
	bin := testproc.Binaries(t, testproc.Stack...)
	s := &Stack{}
	s.Dispatcher = testproc.Start(t, filepath.Join(bin, "dispatcher"), nil, "--config", filepath.Join(dir, "dispatcher.yaml"),
		"--policy", filepath.Join(dir, "policy.yaml"), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "d"))
	natsURL := s.Dispatcher.WaitLog(t, "started embedded nats", 30*time.Second)["url"].(string)
	s.URL = "http://" + s.Dispatcher.WaitLog(t, "dispatcher ready", 30*time.Second)["listen"].(string)
	s.Worker = testproc.Start(t, filepath.Join(bin, "worker"), nil, "--data-dir", filepath.Join(dir, "w"), "--nats-url", natsURL,
		"--listen", o.WorkerListen, "--id", o.WorkerID, "--slots", "4")
	s.Worker.WaitLog(t, "worker ready", 60*time.Second)
	return s
}

// Do sends a REST request with token and body (nil: none; else sent as JSON) and returns the status code
// and the decoded JSON answer; an answer that is not JSON fails the test.
func (s *Stack) Do(t testing.TB, method, path, token string, body any) (int, map[string]any) {
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
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, rd)
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
