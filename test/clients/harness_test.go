// Package clients tests toolpool's REST contract and its clients against the real stack: the dispatcher
// binary (embedded NATS) and a worker with its private containerd. TestOpenAPIContract validates real
// answers of every operation of the OpenAPI document (internal/dispatcher/openapi.json) against it; the
// Python and TypeScript clients' own suites (clients/python, clients/typescript) run against the same
// kind of stack, given its URL and tokens in the environment.
package clients

import (
	"os"
	"testing"

	"github.com/toolpool/toolpool/internal/stacktest"
	"github.com/toolpool/toolpool/internal/testproc"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testproc.Cleanup()
	os.Exit(code)
}

// The tenant of these tests (stacktest's): an approver and a caller (a bot whose calls go to workspace
// botspace).
const (
	approverToken = stacktest.ApproverToken
	callerToken   = stacktest.CallerToken
)

// stack is a running dispatcher (embedded NATS) and worker (private containerd).
type stack struct{ *stacktest.Stack }

// startStack starts a dispatcher (uploads up to 1 MiB; extra: more top-level YAML for its config) and a
// worker for the test; they stop when it ends. It fails (CI=true) or skips the test without root and
// containerd.
func startStack(t testing.TB, extra string) *stack {
	t.Helper()
	return &stack{stacktest.Start(t, stacktest.Options{API: "  max_upload_bytes: 1048576\n", Config: extra, WorkerID: "clients-worker"})}
}
