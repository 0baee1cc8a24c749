// Package clients tests toolpool's REST contract and its clients against the real stack: the dispatcher
// binary (embedded NATS) and a worker with its private containerd. TestOpenAPIContract validates real
// answers of every operation of the OpenAPI document (internal/dispatcher/openapi.json) against it; the
// Python and TypeScript clients' own suites (clients/python, clients/typescript) run against the same
// kind of stack, given its URL and tokens in the environment.
package clients

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
	"github.com/toolpool/toolpool/internal/testproc"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testproc.Cleanup()
	os.Exit(code)
}

// The tenant of these tests: an approver and a caller (a bot whose calls go to workspace botspace).
const (
	approverToken = "acme-approver"
	callerToken   = "acme-caller"
)

const dispatcherConfig = `
api:
  max_upload_bytes: 1048576
  tenants:
    - name: acme
      tokens:
        - {token: acme-approver, role: approver, name: alice}
        - {token: acme-caller, name: ci-bot, workspace: botspace}
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
	url string
}

// startStack starts a dispatcher (dispatcherConfig, then extra: more top-level YAML) and a worker for
// the test; they stop when it ends. It fails (CI=true) or skips the test without root and containerd.
func startStack(t testing.TB, extra string) *stack {
	t.Helper()
	ctrtest.Require(t)
	dir := ctrtest.ShortTempDir(t)
	for name, content := range map[string]string{"dispatcher.yaml": dispatcherConfig + extra, "policy.yaml": testPolicy} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bin := testproc.Binaries(t, testproc.Stack...)
	d := testproc.Start(t, filepath.Join(bin, "dispatcher"), nil, "--config", filepath.Join(dir, "dispatcher.yaml"),
		"--policy", filepath.Join(dir, "policy.yaml"), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "d"))
	natsURL := d.WaitLog(t, "started embedded nats", 30*time.Second)["url"].(string)
	s := &stack{url: "http://" + d.WaitLog(t, "dispatcher ready", 30*time.Second)["listen"].(string)}
	w := testproc.Start(t, filepath.Join(bin, "worker"), nil, "--data-dir", filepath.Join(dir, "w"), "--nats-url", natsURL,
		"--listen", "127.0.0.1:0", "--id", "clients-worker", "--slots", "4")
	w.WaitLog(t, "worker ready", 60*time.Second)
	return s
}
