package e2e

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// TestEndToEnd drives the whole path: HTTP → dispatcher → JetStream → worker → its own container → result.
func TestEndToEnd(t *testing.T) {
	s := startStack(t)

	t.Run("run_shell returns the envelope", func(t *testing.T) {
		r := s.shell(t, "dev-token", "ws1", "echo hi; echo err >&2; id -un", nil)
		res := r.result(t)
		if r.code != http.StatusOK || res.Status != call.StatusOK || res.ExitCode == nil || *res.ExitCode != 0 {
			t.Fatalf("HTTP %d: %s", r.code, r.body)
		}
		if res.Stdout != "hi\nsandbox\n" || res.Stderr != "err\n" || !strings.Contains(res.Output, "hi\nsandbox\n") {
			t.Errorf("stdout %q stderr %q output %q", res.Stdout, res.Stderr, res.Output)
		}
		if res.Tenant != "dev" || res.Workspace != "ws1" || res.Tool != "run_shell" || res.Worker != "e2e-worker" || !strings.HasPrefix(res.ID, "c_") {
			t.Errorf("envelope identity: %s", r.body)
		}
		if res.Timing.TotalMS <= 0 || res.Timing.SandboxMS <= 0 || res.Decision == nil || res.Decision.Action != "allow" {
			t.Errorf("timing or decision missing: %s", r.body)
		}
	})

	t.Run("calls run in the worker's warm pool and say so", func(t *testing.T) {
		// The worker prewarms its usual profile and keeps it warm while calls come: a run of calls must
		// find a ready container (on a loaded host the pool may lag behind one call, never all of them).
		// Under gVisor (the gVisor tier) every call must run cold and say so.
		warm := 0
		for range 10 {
			r := s.shell(t, "dev-token", "ws1", "echo hi", nil)
			res := r.result(t)
			if res.Status != call.StatusOK || res.Stdout != "hi\n" {
				t.Fatalf("call: %s", r.body)
			}
			if !strings.Contains(string(r.body), `"warm":`) {
				t.Fatalf("the result does not say warm or cold: %s", r.body)
			}
			if res.Timing.Warm {
				warm++
			}
		}
		switch gvisor := ctrtest.Runtime() == containerd.GVisorRuntime; {
		case gvisor && warm != 0:
			// The pool holds runc containers only: a gVisor call run warm would have run under runc.
			t.Errorf("%d of 10 calls under gVisor ran warm, in the pool's runc containers", warm)
		case !gvisor && warm == 0:
			t.Errorf("none of 10 calls ran warm")
		}
	})

	t.Run("non-zero exit is a tool error, not an HTTP error", func(t *testing.T) {
		r := s.shell(t, "dev-token", "ws1", "echo out; exit 3", nil)
		res := r.result(t)
		if r.code != http.StatusOK || res.Status != call.StatusError || *res.ExitCode != 3 || res.Error == nil || res.Error.Type != call.ErrExitCode {
			t.Fatalf("HTTP %d: %s", r.code, r.body)
		}
	})

	t.Run("timeout keeps what was printed", func(t *testing.T) {
		// 2 s leave a loaded host time to start the shell and print before the timeout.
		r := s.shell(t, "dev-token", "ws1", "echo started; sleep 60", map[string]any{"timeout_ms": 2000})
		res := r.result(t)
		if r.code != http.StatusOK || res.Status != call.StatusTimeout || !strings.Contains(res.Output, "started") || res.Error.Type != call.ErrTimeout {
			t.Fatalf("HTTP %d: %s", r.code, r.body)
		}
	})

	t.Run("no wait answers 202 then GET waits for the result", func(t *testing.T) {
		r := s.shell(t, "dev-token", "ws1", "sleep 0.3; echo later", map[string]any{"wait": false})
		res := r.result(t)
		if r.code != http.StatusAccepted || res.Status != call.StatusQueued {
			t.Fatalf("HTTP %d: %s", r.code, r.body)
		}
		g := s.do(t, http.MethodGet, "/v1/calls/"+res.ID+"?wait=30s", "dev-token", nil)
		if got := g.result(t); g.code != http.StatusOK || got.Status != call.StatusOK || got.Stdout != "later\n" {
			t.Fatalf("GET: HTTP %d: %s", g.code, g.body)
		}
	})

	t.Run("workspace persists between calls", func(t *testing.T) {
		w := s.do(t, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": "write_file", "workspace": "persist",
			"args": map[string]any{"path": "dir/file.txt", "content": "kept\n"}})
		if res := w.result(t); res.Status != call.StatusOK {
			t.Fatalf("write_file: %s", w.body)
		}
		r := s.shell(t, "dev-token", "persist", "cat dir/file.txt; stat -c %U dir/file.txt", nil)
		if res := r.result(t); res.Stdout != "kept\nsandbox\n" {
			t.Fatalf("%s", r.body)
		}
		rf := s.do(t, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": "read_file", "workspace": "persist",
			"args": map[string]any{"path": "dir/file.txt"}})
		if res := rf.result(t); res.Status != call.StatusOK || !strings.Contains(res.Output, "kept") {
			t.Fatalf("read_file: %s", rf.body)
		}
	})

	t.Run("tenants cannot reach each other", func(t *testing.T) {
		a := s.do(t, http.MethodPost, "/v1/calls", "alpha-token", map[string]any{"tool": "write_file", "workspace": "shared",
			"args": map[string]any{"path": "secret", "content": "alpha-secret"}}).result(t)
		if a.Status != call.StatusOK {
			t.Fatalf("alpha: %+v", a)
		}
		b := s.shell(t, "beta-token", "shared", "cat secret 2>&1; ls -a /workspace", nil).result(t)
		if strings.Contains(b.Output, "alpha-secret") || !strings.Contains(b.Output, "No such file") {
			t.Fatalf("beta saw alpha's workspace: %q", b.Output)
		}
		if g := s.do(t, http.MethodGet, "/v1/calls/"+a.ID, "beta-token", nil); g.code != http.StatusNotFound {
			t.Fatalf("beta read alpha's call: HTTP %d %s", g.code, g.body)
		}
		if _, err := os.Stat(filepath.Join(s.dataDir, "w", "workspaces", "alpha", "shared", "secret")); err != nil {
			t.Fatalf("alpha's file is not in alpha's workspace on the host: %v", err)
		}
	})

	t.Run("tools are listed with schemas in every format", func(t *testing.T) {
		for format, schemaKey := range map[string]string{"": `"schema"`, "openai": `"parameters"`, "anthropic": `"input_schema"`, "mcp": `"inputSchema"`} {
			r := s.do(t, http.MethodGet, "/v1/tools?format="+format, "dev-token", nil)
			if r.code != http.StatusOK || !strings.Contains(string(r.body), `"run_shell"`) || !strings.Contains(string(r.body), schemaKey) {
				t.Fatalf("format %q: HTTP %d: %.300s", format, r.code, r.body)
			}
		}
		if r := s.do(t, http.MethodGet, "/v1/tools?format=xml", "dev-token", nil); r.code != http.StatusBadRequest || !strings.Contains(r.errorInfo(t).Message, "openai") {
			t.Fatalf("bad format: HTTP %d %s", r.code, r.body)
		}
	})

	t.Run("bad input gets clear errors", func(t *testing.T) {
		tests := []struct {
			name     string
			token    string
			body     string
			wantCode int
			wantMsg  string
		}{
			{"no token", "", `{"tool":"run_shell","args":{"command":"true"}}`, 401, "Authorization: Bearer"},
			{"bad token", "nope", `{"tool":"run_shell","args":{"command":"true"}}`, 401, "not known"},
			{"malformed json", "dev-token", `{"tool":`, 400, "not the expected JSON"},
			{"unknown field", "dev-token", `{"tool":"run_shell","args":{"command":"true"},"bogus":1}`, 400, `unknown field "bogus"`},
			{"unknown tool", "dev-token", `{"tool":"launch_rockets","args":{}}`, 422, "run_shell"},
			{"bad args", "dev-token", `{"tool":"run_shell","args":{"cmd":"true"}}`, 422, "command"},
			{"hostile workspace", "dev-token", `{"tool":"run_shell","args":{"command":"true"},"workspace":"../alpha"}`, 400, "workspace"},
			{"workspace with slash", "dev-token", `{"tool":"run_shell","args":{"command":"true"},"workspace":"a/b"}`, 400, "workspace"},
			{"invalid utf8", "dev-token", "{\"tool\":\"run_shell\",\"args\":{\"command\":\"echo \xff\"}}", 400, "UTF-8"},
			{"negative timeout", "dev-token", `{"tool":"run_shell","args":{"command":"true"},"timeout_ms":-5}`, 400, "timeout_ms"},
			{"huge body", "dev-token", `{"tool":"run_shell","args":{"command":"` + strings.Repeat("x", 9<<20) + `"}}`, 413, "limit"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				r := s.do(t, http.MethodPost, "/v1/calls", tt.token, tt.body)
				if r.code != tt.wantCode {
					t.Fatalf("HTTP %d, want %d: %s", r.code, tt.wantCode, r.body)
				}
				if e := r.errorInfo(t); !strings.Contains(e.Message, tt.wantMsg) {
					t.Fatalf("message %q does not mention %q", e.Message, tt.wantMsg)
				}
			})
		}
	})

	t.Run("web_fetch goes through the egress proxy, which refuses private addresses", func(t *testing.T) {
		for _, url := range []string{s.url + "/healthz", "http://169.254.169.254/latest/meta-data/", "http://[::1]:4222/"} {
			r := s.do(t, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": "web_fetch", "workspace": "ws1",
				"args": map[string]any{"url": url}})
			res := r.result(t)
			if res.Status != call.StatusError || res.Error == nil || !strings.Contains(res.Output, "the egress proxy refused the destination") {
				t.Fatalf("%s: HTTP %d %s", url, r.code, r.body)
			}
		}
	})

	t.Run("unknown call is 404", func(t *testing.T) {
		if r := s.do(t, http.MethodGet, "/v1/calls/c_nope", "dev-token", nil); r.code != http.StatusNotFound {
			t.Fatalf("HTTP %d: %s", r.code, r.body)
		}
	})

	t.Run("cli prints the result", func(t *testing.T) {
		cmd := exec.Command(filepath.Join(binaries(t), "toolpool"), "call", "run_shell", "--workspace", "ws1", "command=echo from-cli; ls -la")
		cmd.Env = append(os.Environ(), "TOOLPOOL_URL="+s.url, "TOOLPOOL_TOKEN=dev-token")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "from-cli") || !strings.Contains(string(out), "[ok · exit 0") {
			t.Fatalf("toolpool call: %v\n%s", err, out)
		}
	})

	t.Run("results survive a dispatcher restart", func(t *testing.T) {
		res := s.shell(t, "dev-token", "ws1", "echo durable", nil).result(t)
		s.dispatcher.Stop(t)
		s.startDispatcher(t)
		g := s.do(t, http.MethodGet, "/v1/calls/"+res.ID, "dev-token", nil)
		if got := g.result(t); g.code != http.StatusOK || got.Stdout != "durable\n" {
			t.Fatalf("after restart: HTTP %d: %s", g.code, g.body)
		}
		// The worker reconnects to the restarted NATS and keeps serving.
		deadline := time.Now().Add(30 * time.Second)
		for {
			r := s.shell(t, "dev-token", "ws1", "echo again", nil)
			if res := r.result(t); res.Status == call.StatusOK && res.Stdout == "again\n" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no result after the restart: %s", r.body)
			}
		}
	})
}
