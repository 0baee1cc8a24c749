// Package e2e starts the real dispatcher and worker binaries, with the dispatcher's embedded NATS and the
// worker's private containerd, and calls them over HTTP the way a client does.
package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
	"github.com/toolpool/toolpool/internal/testproc"
)

// binaries builds dispatcher, worker, toolpool and nats-server once per test process.
func binaries(t testing.TB) string { return testproc.All(t) }

func TestMain(m *testing.M) {
	code := m.Run()
	testproc.Cleanup()
	os.Exit(code)
}

// start starts binary name (dispatcher, worker, nats-server) with args and the dev tenant's token.
func start(t testing.TB, name string, args ...string) *testproc.Proc {
	t.Helper()
	return testproc.Start(t, filepath.Join(binaries(t), name), []string{"TOOLPOOL_TOKEN=dev-token"}, args...)
}

// stack is a running dispatcher and worker.
type stack struct {
	url        string
	natsURL    string
	dispatcher *testproc.Proc
	worker     *testproc.Proc
	dataDir    string
	configPath string
	policyPath string
	opts       stackOptions
	workerID   string // the worker's --id; "" is e2e-worker
}

const dispatcherConfig = `
api:
  tenants:
    - name: alpha
      tokens: [{token: alpha-token}]
    - name: beta
      tokens: [{token: beta-token}]
`

const permissivePolicy = `
version: 1
default_action: allow
`

// stackOptions vary a stack.
type stackOptions struct {
	policy       string // policy file content; "" means the shipped default policy
	workerConfig string // worker YAML config
	extraConfig  string // appended to the dispatcher's YAML config
	natsURL      string // an external NATS server; "" embeds one
}

// startStack starts a dispatcher with tenants alpha, beta and dev (tokens alpha-token, beta-token,
// dev-token; dev is an approver) and one worker, under a fresh data directory, with a permissive policy.
func startStack(t testing.TB) *stack {
	return startStackWith(t, stackOptions{policy: permissivePolicy})
}

func startStackWith(t testing.TB, o stackOptions) *stack {
	t.Helper()
	ctrtest.Require(t)
	s := &stack{dataDir: ctrtest.ShortTempDir(t), opts: o}
	s.configPath = filepath.Join(s.dataDir, "dispatcher.yaml")
	if err := os.WriteFile(s.configPath, []byte(dispatcherConfig+o.extraConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	if o.policy != "" {
		s.policyPath = filepath.Join(s.dataDir, "policy.yaml")
		if err := os.WriteFile(s.policyPath, []byte(o.policy), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s.natsURL = o.natsURL
	s.checkNothingLeftAfterStop(t)
	s.startDispatcher(t)
	s.startWorker(t)
	return s
}

// startWorker starts (or restarts) the stack's worker on its data directory.
func (s *stack) startWorker(t testing.TB) {
	t.Helper()
	args := []string{"--data-dir", filepath.Join(s.dataDir, "w"), "--nats-url", s.natsURL,
		"--listen", "127.0.0.1:0", "--id", cmp.Or(s.workerID, "e2e-worker"), "--slots", "4", "--runtime", ctrtest.Runtime()}
	if s.opts.workerConfig != "" {
		path := filepath.Join(s.dataDir, "worker.yaml")
		if err := os.WriteFile(path, []byte(s.opts.workerConfig), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", path)
	}
	s.worker = start(t, "worker", args...)
	s.worker.WaitLog(t, "worker ready", 60*time.Second)
}

func (s *stack) startDispatcher(t testing.TB) {
	t.Helper()
	args := []string{"--config", s.configPath, "--dev-tenant", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(s.dataDir, "d")}
	if s.policyPath != "" {
		args = append(args, "--policy", s.policyPath)
	}
	if s.opts.natsURL != "" {
		args = append(args, "--nats-url", s.opts.natsURL)
	} else {
		natsListen := "127.0.0.1:0"
		if s.natsURL != "" { // a restart keeps the address the worker knows
			natsListen = strings.TrimPrefix(s.natsURL, "nats://")
		}
		args = append(args, "--nats-listen", natsListen)
	}
	s.dispatcher = start(t, "dispatcher", args...)
	if s.opts.natsURL == "" {
		s.natsURL = s.dispatcher.WaitLog(t, "started embedded nats", 30*time.Second)["url"].(string)
		if s.worker != nil {
			stopFirst(t, s.worker)
		}
	}
	s.url = "http://" + s.dispatcher.WaitLog(t, "dispatcher ready", 30*time.Second)["listen"].(string)
}

// stopFirst stops worker when t ends, before a NATS server started after it (a restarted dispatcher's
// embedded one, or an external server restarted), which t's cleanup would otherwise stop first: a worker
// stopped after its NATS drains without it.
func stopFirst(t testing.TB, worker *testproc.Proc) {
	t.Cleanup(func() { worker.Stop(t) })
}

// response is an HTTP answer: its code and body.
type response struct {
	code int
	body []byte
}

func (r response) result(t testing.TB) *call.Result {
	t.Helper()
	var res call.Result
	if err := json.Unmarshal(r.body, &res); err != nil {
		t.Fatalf("decode result (HTTP %d): %v: %s", r.code, err, r.body)
	}
	return &res
}

func (r response) errorInfo(t testing.TB) call.ErrorInfo {
	t.Helper()
	var e struct {
		Error call.ErrorInfo `json:"error"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Message == "" {
		t.Fatalf("decode error (HTTP %d): %v: %s", r.code, err, r.body)
	}
	return e.Error
}

// do sends a request as token (none when "") with body (nil, a string, bytes, or a value sent as JSON) and
// returns the answer.
func (s *stack) do(t testing.TB, method, path, token string, body any) response {
	t.Helper()
	r, _ := s.send(t, method, path, token, body, nil)
	return r
}

// send is do with extra request headers; it returns the answer's headers too.
func (s *stack) send(t testing.TB, method, path, token string, body any, header map[string]string) (response, http.Header) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{code: resp.StatusCode, body: data}, resp.Header
}

// shell runs a run_shell call for tenant token in workspace ws and waits for its result.
func (s *stack) shell(t testing.TB, token, ws, command string, extra map[string]any) response {
	t.Helper()
	body := map[string]any{"tool": "run_shell", "args": map[string]any{"command": command}, "workspace": ws}
	for k, v := range extra {
		body[k] = v
	}
	return s.do(t, http.MethodPost, "/v1/calls", token, body)
}
