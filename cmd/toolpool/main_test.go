package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

const cliToken = "cli-token"

// request is what the CLI sent to the fake API; Query is as the API decodes it, encoded again with its keys
// sorted.
type request struct {
	Method, Path, Query string
	Body                map[string]any
}

// answer is the fake API's reply to one request.
type answer struct {
	code int
	body string
}

// fakeAPI answers each request with the answer registered for "METHOD /path" (the query is not part of
// the key) and records the requests. It fails the test on a request without the CLI's token and JSON
// content type, and on one it has no answer for.
type fakeAPI struct {
	t       *testing.T
	answers map[string]answer
	mu      sync.Mutex
	got     []request
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if auth := r.Header.Get("Authorization"); auth != "Bearer "+cliToken {
		f.t.Errorf("%s %s: Authorization %q", r.Method, r.URL.Path, auth)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		f.t.Errorf("%s %s: Content-Type %q", r.Method, r.URL.Path, ct)
	}
	req := request{Method: r.Method, Path: r.URL.Path, Query: r.URL.Query().Encode()} // as the API reads it
	if data, _ := io.ReadAll(r.Body); len(data) > 0 {
		if err := json.Unmarshal(data, &req.Body); err != nil {
			f.t.Errorf("%s %s: body is not a JSON object: %s", r.Method, r.URL.Path, data)
		}
	}
	f.mu.Lock()
	f.got = append(f.got, req)
	f.mu.Unlock()
	a, ok := f.answers[r.Method+" "+r.URL.Path]
	if !ok {
		f.t.Errorf("unexpected request %s %s", r.Method, r.URL.Path)
		a = answer{http.StatusNotFound, `{"error":{"type":"not_found","message":"no endpoint"}}`}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.code)
	io.WriteString(w, a.body)
}

func (f *fakeAPI) requests() []request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]request(nil), f.got...)
}

// serve points the CLI at a fake API serving h, for the test's duration.
func serve(t *testing.T, h http.Handler) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	t.Setenv("TOOLPOOL_URL", srv.URL+"/")
	t.Setenv("TOOLPOOL_TOKEN", cliToken)
}

// cli runs the command line and returns its exit code, stdout and stderr.
func cli(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

const (
	okResult = `{"id":"c_1","tenant":"acme","workspace":"ws","tool":"run_shell","status":"ok","exit_code":0,"output":"hi\n",
		"decision":{"action":"allow","rule":"read-only-commands"},"timing":{"total_ms":12}}`
	exitResult = `{"id":"c_1","tool":"run_shell","status":"error","exit_code":3,"output":"boom\n",
		"error":{"type":"exit_code","message":"the command exited with 3"}}`
	deniedResult = `{"id":"c_1","tool":"run_shell","status":"denied","output":"denied by rule forbidden-commands: no",
		"error":{"type":"policy_denied","message":"denied by rule forbidden-commands: no"},"decision":{"action":"deny","rule":"forbidden-commands"}}`
	queuedResult    = `{"id":"c_1","tool":"run_shell","status":"queued","output":""}`
	cancelledResult = `{"id":"c_1","tool":"run_shell","status":"cancelled","output":"the call was cancelled before it ran",
		"error":{"type":"cancelled","message":"the call was cancelled before it ran"}}`
	notFound     = `{"error":{"type":"not_found","message":"no call c_1 for tenant acme"}}`
	unauthorized = `{"error":{"type":"unauthorized","message":"the bearer token is not known: check TOOLPOOL_TOKEN"}}`
	notApprover  = `{"error":{"type":"permission_denied","message":"this token may not approve calls: approvals need a token with role approver"}}`
)

// TestCommands drives each command against a fake API: the requests it makes, what it prints and its exit
// code, for success and for each kind of failure.
func TestCommands(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		answers map[string]answer
		// want
		code     int
		requests []request // nil: none at all
		stdout   []string  // each must appear
		stderr   []string
		noStdout bool
	}{
		// get
		{name: "get prints the output, then a summary", args: []string{"get", "c_1"},
			answers:  map[string]answer{"GET /v1/calls/c_1": {200, okResult}},
			requests: []request{{Method: "GET", Path: "/v1/calls/c_1"}},
			code:     0, stdout: []string{"hi\n"}, stderr: []string{"[ok · exit 0 · 12 ms · c_1]"}},
		{name: "get --wait long-polls", args: []string{"get", "c_1", "--wait", "30s"},
			answers:  map[string]answer{"GET /v1/calls/c_1": {200, okResult}},
			requests: []request{{Method: "GET", Path: "/v1/calls/c_1", Query: "wait=30s"}}, code: 0},
		{name: "get --json prints the envelope", args: []string{"get", "--json", "c_1"},
			answers: map[string]answer{"GET /v1/calls/c_1": {200, okResult}},
			code:    0, stdout: []string{"{\n  \"id\": \"c_1\",", "\"status\": \"ok\""}},
		{name: "get of a command that failed exits with its code", args: []string{"get", "c_1"},
			answers: map[string]answer{"GET /v1/calls/c_1": {200, exitResult}},
			code:    3, stdout: []string{"boom\n"}, stderr: []string{"[error · exit 3 · exit_code: the command exited with 3 · c_1]"}},
		{name: "get of a denied call exits 1 and says why", args: []string{"get", "c_1"},
			answers: map[string]answer{"GET /v1/calls/c_1": {403, deniedResult}},
			code:    1, stdout: []string{"denied by rule forbidden-commands: no"}, stderr: []string{"[denied · policy_denied · policy deny (forbidden-commands) · c_1]"}},
		{name: "get of a queued call exits 0", args: []string{"get", "c_1"},
			answers: map[string]answer{"GET /v1/calls/c_1": {202, queuedResult}}, code: 0, stderr: []string{"[queued · c_1]"}},
		{name: "get of an unknown call exits 1 with the API's message", args: []string{"get", "c_1"},
			answers: map[string]answer{"GET /v1/calls/c_1": {404, notFound}},
			code:    1, stderr: []string{"toolpool: no call c_1 for tenant acme (HTTP 404 not_found)"}, noStdout: true},
		{name: "an unknown token exits 1 saying what to check", args: []string{"get", "c_1"},
			answers: map[string]answer{"GET /v1/calls/c_1": {401, unauthorized}},
			code:    1, stderr: []string{"check TOOLPOOL_TOKEN (HTTP 401 unauthorized)"}},
		{name: "an answer that is not the API's is shown as it is", args: []string{"get", "c_1"},
			answers: map[string]answer{"GET /v1/calls/c_1": {502, "bad gateway\n"}},
			code:    1, stderr: []string{"toolpool: HTTP 502: bad gateway"}},
		{name: "get without an id is a usage error", args: []string{"get"}, code: 2, stderr: []string{"toolpool get ID"}},

		// cancel
		{name: "cancel deletes the call and prints its final state", args: []string{"cancel", "c_1"},
			answers:  map[string]answer{"DELETE /v1/calls/c_1": {200, cancelledResult}},
			requests: []request{{Method: "DELETE", Path: "/v1/calls/c_1"}},
			code:     0, stdout: []string{"the call was cancelled before it ran"}, stderr: []string{"[cancelled · cancelled · c_1]"}},
		{name: "cancel of a call that had already ended exits 1 and says so", args: []string{"cancel", "c_1"},
			answers: map[string]answer{"DELETE /v1/calls/c_1": {200, `{"id":"c_1","tool":"run_shell","status":"ok","exit_code":0,"output":"done"}`}},
			code:    1, stdout: []string{"done"}, stderr: []string{"call c_1 had already ended ok: nothing was cancelled"}},
		{name: "cancel of a running call that is still stopping exits 0", args: []string{"cancel", "c_1"},
			answers: map[string]answer{"DELETE /v1/calls/c_1": {200, `{"id":"c_1","tool":"run_shell","status":"running","cancel_requested":true}`}},
			code:    0, stderr: []string{"[running · c_1]"}},
		{name: "an unknown flag is a usage error for every command", args: []string{"tools", "--nope"},
			code: 2, stderr: []string{"flag provided but not defined: -nope"}},
		{name: "an unknown flag of ws is a usage error too", args: []string{"ws", "ls", "--nope"},
			code: 2, stderr: []string{"flag provided but not defined: -nope"}},
		{name: "a command's -h prints its flags and exits 0", args: []string{"tools", "-h"}, code: 0},
		{name: "cancel of another tenant's call exits 1", args: []string{"cancel", "c_1"},
			answers: map[string]answer{"DELETE /v1/calls/c_1": {404, notFound}}, code: 1, stderr: []string{"HTTP 404 not_found"}},

		// tools
		{name: "tools prints a table", args: []string{"tools"},
			answers: map[string]answer{"GET /v1/tools": {200, `{"tools":[{"name":"read_file","kind":"read","description":"Read a file.\nMore."},` +
				`{"name":"run_shell","kind":"execute","description":"` + strings.Repeat("d", 100) + `"}]}`}},
			requests: []request{{Method: "GET", Path: "/v1/tools"}},
			code:     0, stdout: []string{"read_file    read     Read a file.\n", "run_shell    execute  " + strings.Repeat("d", 87) + "...\n"}},
		{name: "tools --format prints the API's JSON", args: []string{"tools", "--format", "openai"},
			answers:  map[string]answer{"GET /v1/tools": {200, `{"tools":[{"type":"function","function":{"name":"read_file"}}]}`}},
			requests: []request{{Method: "GET", Path: "/v1/tools", Query: "format=openai"}},
			code:     0, stdout: []string{"{\n  \"tools\": [\n    {\n      \"type\": \"function\""}},
		{name: "tools with an unknown format exits 1", args: []string{"tools", "--format", "yaml"},
			answers: map[string]answer{"GET /v1/tools": {400, `{"error":{"type":"invalid_request","message":"unknown format \"yaml\""}}`}},
			code:    1, stderr: []string{`unknown format "yaml" (HTTP 400 invalid_request)`}},

		// approvals
		{name: "approvals lists the calls waiting", args: []string{"approvals"},
			answers: map[string]answer{"GET /v1/approvals": {200, `{"approvals":[{"id":"c_1","tool":"run_shell","workspace":"ws",` +
				`"args":{"command":"mkdir x"},"args_digest":"sha256:ab","rule":"mutating-commands","reason":"needs approval: mkdir","expires_at":"2030-01-01T00:00:00Z"}]}`}},
			requests: []request{{Method: "GET", Path: "/v1/approvals"}},
			code:     0, stdout: []string{"c_1  run_shell  workspace ws  expires 2030-01-01T00:00:00Z\n", `args: {"command":"mkdir x"}`, "why:  needs approval: mkdir"}},
		{name: "approvals list says when none waits", args: []string{"approvals", "list"},
			answers: map[string]answer{"GET /v1/approvals": {200, `{"approvals":[]}`}}, code: 0, stdout: []string{"no calls wait for approval\n"}},
		{name: "approvals with a caller's token exits 1 saying why", args: []string{"approvals"},
			answers: map[string]answer{"GET /v1/approvals": {403, notApprover}},
			code:    1, stderr: []string{"this token may not approve calls", "(HTTP 403 permission_denied)"}, noStdout: true},
		{name: "approve sends the decision", args: []string{"approvals", "approve", "c_1"},
			answers:  map[string]answer{"POST /v1/approvals/c_1": {202, queuedResult}},
			requests: []request{{Method: "POST", Path: "/v1/approvals/c_1", Body: map[string]any{"decision": "approve", "always": false}}},
			code:     0, stdout: []string{"c_1: queued\n"}},
		{name: "approve --always --prefix sends the rule", args: []string{"approvals", "approve", "c_1", "--always", "--prefix", "git push"},
			answers: map[string]answer{"POST /v1/approvals/c_1": {202, queuedResult}},
			requests: []request{{Method: "POST", Path: "/v1/approvals/c_1",
				Body: map[string]any{"decision": "approve", "always": true, "argv_prefix": []any{"git", "push"}}}},
			code: 0, stdout: []string{"c_1: queued\n"}},
		{name: "approve --digest binds the approval", args: []string{"approvals", "approve", "c_1", "--digest", "sha256:ab"},
			answers: map[string]answer{"POST /v1/approvals/c_1": {202, queuedResult}},
			requests: []request{{Method: "POST", Path: "/v1/approvals/c_1",
				Body: map[string]any{"decision": "approve", "always": false, "args_digest": "sha256:ab"}}},
			code: 0},
		{name: "deny prints the denied call", args: []string{"approvals", "deny", "c_1"},
			answers:  map[string]answer{"POST /v1/approvals/c_1": {403, deniedResult}},
			requests: []request{{Method: "POST", Path: "/v1/approvals/c_1", Body: map[string]any{"decision": "deny", "always": false}}},
			code:     0, stdout: []string{"c_1: denied\n"}},
		{name: "deny --reason sends the reason", args: []string{"approvals", "deny", "c_1", "--reason", "use staging"},
			answers:  map[string]answer{"POST /v1/approvals/c_1": {403, deniedResult}},
			requests: []request{{Method: "POST", Path: "/v1/approvals/c_1", Body: map[string]any{"decision": "deny", "always": false, "reason": "use staging"}}},
			code:     0, stdout: []string{"c_1: denied\n"}},
		{name: "approve of a call no longer waiting exits 1", args: []string{"approvals", "approve", "c_1"},
			answers: map[string]answer{"POST /v1/approvals/c_1": {409, `{"error":{"type":"not_pending","message":"call c_1 is expired, no longer waiting for approval"}}`}},
			code:    1, stderr: []string{"call c_1 is expired, no longer waiting for approval (HTTP 409 not_pending)"}, noStdout: true},
		{name: "approve with a caller's token exits 1 saying why", args: []string{"approvals", "approve", "c_1"},
			answers: map[string]answer{"POST /v1/approvals/c_1": {403, notApprover}},
			code:    1, stderr: []string{"this token may not approve calls"}, noStdout: true},
		{name: "approvals with an unknown verb is a usage error", args: []string{"approvals", "allow", "c_1"},
			code: 2, stderr: []string{"toolpool approvals [list | approve ID"}},
		{name: "approve without an id is a usage error", args: []string{"approvals", "approve"}, code: 2},

		// policy check
		{name: "policy check prints the decision", args: []string{"policy", "check", "run_shell", "command=rm -rf /"},
			answers: map[string]answer{"POST /v1/policy/check": {200, `{"tool":"run_shell","decision":{"action":"deny","rule":"forbidden-commands",` +
				`"reason":"denied by rule forbidden-commands: rm -rf /"},"would_run":false}`}},
			requests: []request{{Method: "POST", Path: "/v1/policy/check",
				Body: map[string]any{"tool": "run_shell", "args": map[string]any{"command": "rm -rf /"}, "workspace": "default"}}},
			code: 0, stdout: []string{"deny (rule forbidden-commands): denied by rule forbidden-commands: rm -rf /\n"}},
		{name: "policy check with a workspace and JSON values", args: []string{"policy", "check", "read_file", "path=a.txt", "limit:=20", "--workspace", "ws2"},
			answers: map[string]answer{"POST /v1/policy/check": {200, `{"decision":{"action":"allow","rule":"tool-action","reason":"allowed"}}`}},
			requests: []request{{Method: "POST", Path: "/v1/policy/check",
				Body: map[string]any{"tool": "read_file", "args": map[string]any{"path": "a.txt", "limit": float64(20)}, "workspace": "ws2"}}},
			code: 0, stdout: []string{"allow (rule tool-action): allowed\n"}},
		{name: "policy check of an unknown tool exits 1", args: []string{"policy", "check", "nope"},
			answers: map[string]answer{"POST /v1/policy/check": {422, `{"error":{"type":"invalid_params","message":"unknown tool \"nope\""}}`}},
			code:    1, stderr: []string{`unknown tool "nope" (HTTP 422 invalid_params)`}},
		{name: "policy check with a bad JSON value is a usage error", args: []string{"policy", "check", "read_file", "limit:=twenty"},
			code: 2, stderr: []string{"must be JSON"}},
		{name: "policy without check is a usage error", args: []string{"policy", "run_shell"}, code: 2, stderr: []string{"toolpool policy check TOOL"}},

		// ws create --git
		{name: "ws create --git sends the source as JSON", args: []string{"ws", "create", "repo", "--git", "https://git.example.com/o/r.git", "--ref", "main"},
			answers:  map[string]answer{"PUT /v1/workspaces/repo": {201, `{"workspace":{"name":"repo","files":3},"call_id":"c_1"}`}},
			requests: []request{{Method: "PUT", Path: "/v1/workspaces/repo", Body: map[string]any{"git": map[string]any{"url": "https://git.example.com/o/r.git", "ref": "main"}}}},
			code:     0, stdout: []string{`"name": "repo"`}},
		{name: "ws create --image sends the workspace's default image", args: []string{"ws", "create", "py", "--image", "registry.example.com/tools/python:3.12"},
			answers:  map[string]answer{"PUT /v1/workspaces/py": {201, `{"workspace":{"name":"py","image":"registry.example.com/tools/python:3.12"},"call_id":"c_1"}`}},
			requests: []request{{Method: "PUT", Path: "/v1/workspaces/py", Query: "image=registry.example.com%2Ftools%2Fpython%3A3.12"}},
			code:     0, stdout: []string{`"image": "registry.example.com/tools/python:3.12"`}},
		{name: "ws create --git --image sends both", args: []string{"ws", "create", "repo", "--git", "https://git.example.com/o/r.git", "--image", "registry.example.com/tools/go:1"},
			answers: map[string]answer{"PUT /v1/workspaces/repo": {201, `{"workspace":{"name":"repo"},"call_id":"c_1"}`}},
			requests: []request{{Method: "PUT", Path: "/v1/workspaces/repo", Query: "image=registry.example.com%2Ftools%2Fgo%3A1",
				Body: map[string]any{"git": map[string]any{"url": "https://git.example.com/o/r.git"}}}},
			code: 0},
		{name: "ws create with an image policy refuses exits 1 saying why", args: []string{"ws", "create", "py", "--image", "docker.io/library/node:22"},
			answers: map[string]answer{"PUT /v1/workspaces/py": {403, `{"error":{"type":"policy_denied","message":"image \"docker.io/library/node:22\" refused by rule images (allowed: registry.example.com/tools/)"}}`}},
			code:    1, stderr: []string{"refused by rule images (allowed: registry.example.com/tools/)", "HTTP 403 policy_denied"}, noStdout: true},
		{name: "ws image changes the workspace's default image", args: []string{"ws", "image", "py", "registry.example.com/tools/node:22"},
			answers:  map[string]answer{"PATCH /v1/workspaces/py": {200, `{"workspace":{"name":"py","image":"registry.example.com/tools/node:22"},"call_id":"c_1"}`}},
			requests: []request{{Method: "PATCH", Path: "/v1/workspaces/py", Body: map[string]any{"image": "registry.example.com/tools/node:22"}}},
			code:     0, stdout: []string{`"image": "registry.example.com/tools/node:22"`}},
		{name: "ws image --none removes it", args: []string{"ws", "image", "py", "--none"},
			answers:  map[string]answer{"PATCH /v1/workspaces/py": {200, `{"workspace":{"name":"py"},"call_id":"c_1"}`}},
			requests: []request{{Method: "PATCH", Path: "/v1/workspaces/py", Body: map[string]any{"image": ""}}},
			code:     0},
		{name: "ws image without a reference is a usage error", args: []string{"ws", "image", "py"},
			code: 2, stderr: []string{"toolpool ws image NAME REF|--none"}},
		{name: "ws create --ref without --git is a usage error", args: []string{"ws", "create", "repo", "--ref", "main"},
			code: 2, stderr: []string{"give --git URL too"}},
		{name: "ws create --git with credentials is refused before sending", args: []string{"ws", "create", "repo", "--git", "https://u:tok@h/r.git"},
			code: 2, stderr: []string{"carries credentials"}},
		{name: "a denied clone exits 1 saying why", args: []string{"ws", "create", "repo", "--git", "https://evil.example/r.git"},
			answers: map[string]answer{"PUT /v1/workspaces/repo": {403, `{"id":"c_1","tool":"workspace_clone","status":"denied",` +
				`"error":{"type":"policy_denied","message":"denied by rule domain-not-allowed: evil.example is not on the domain allowlist"}}`}},
			code: 1, stderr: []string{"workspace_clone was denied: denied by rule domain-not-allowed", "call c_1"}, noStdout: true},
		{name: "an operation that waits for approval says how to approve it", args: []string{"ws", "restore", "repo", "s1"},
			answers: map[string]answer{"POST /v1/workspaces/repo/restore": {202, `{"id":"c_2","tool":"workspace_restore","status":"pending_approval",` +
				`"decision":{"action":"ask","rule":"kind-action","reason":"needs approval by rule kind-action"}}`}},
			code: 0, stdout: []string{"workspace_restore waits for a person's approval (needs approval by rule kind-action)",
				"toolpool approvals approve c_2", "toolpool get c_2 --wait 1m"}},
		{name: "an operation no worker took in time exits 1 saying so", args: []string{"ws", "rm", "repo"},
			answers: map[string]answer{"DELETE /v1/workspaces/repo": {200, `{"id":"c_3","tool":"workspace_delete","status":"expired",` +
				`"error":{"type":"timeout","message":"no worker took the call before its deadline"}}`}},
			code: 1, stderr: []string{"workspace_delete ended expired: no worker took the call before its deadline (call c_3)"}, noStdout: true},

		// audit
		{name: "audit prints the events of the last hour", args: []string{"audit"},
			answers: map[string]answer{"GET /v1/audit": {200, `{"events":[{"time":"2030-01-02T03:04:05Z","event":"finished","tenant":"acme",` +
				`"call_id":"c_1","tool":"run_shell","action":"allow","rule":"read-only-commands","status":"ok","actor":""}]}`}},
			requests: []request{{Method: "GET", Path: "/v1/audit", Query: "limit=100&since=1h"}},
			code:     0, stdout: []string{"2030-01-02T03:04:05Z  finished  ok               run_shell  allow  read-only-commands c_1"}},
		{name: "audit passes a since time with a zone offset intact", args: []string{"audit", "--since", "2030-01-02T03:04:05+01:00", "--limit", "5"},
			answers:  map[string]answer{"GET /v1/audit": {200, `{"events":[]}`}},
			requests: []request{{Method: "GET", Path: "/v1/audit", Query: "limit=5&since=2030-01-02T03%3A04%3A05%2B01%3A00"}},
			code:     0},
		{name: "audit --json prints the API's JSON", args: []string{"audit", "--json"},
			answers: map[string]answer{"GET /v1/audit": {200, `{"events":[]}`}}, code: 0, stdout: []string{`{"events":[]}`}},
		{name: "audit with a bad since exits 1", args: []string{"audit", "--since", "yesterday"},
			answers: map[string]answer{"GET /v1/audit": {400, `{"error":{"type":"invalid_request","message":"since=\"yesterday\" is neither a duration (1h) nor an RFC 3339 time"}}`}},
			code:    1, stderr: []string{"is neither a duration (1h) nor an RFC 3339 time (HTTP 400 invalid_request)"}},

		// the command line itself
		{name: "no command prints the usage", args: nil, code: 2, stderr: []string{"usage:"}},
		{name: "an unknown command prints the usage", args: []string{"run"}, code: 2, stderr: []string{`unknown command "run"`, "usage:"}},
		{name: "help prints the usage", args: []string{"help"}, code: 0, stdout: []string{"toolpool call TOOL"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := &fakeAPI{t: t, answers: tt.answers}
			serve(t, api)
			code, stdout, stderr := cli(tt.args...)
			if code != tt.code {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout, stderr)
			}
			for _, want := range tt.stdout {
				if !strings.Contains(stdout, want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout)
				}
			}
			for _, want := range tt.stderr {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr)
				}
			}
			if tt.noStdout && stdout != "" {
				t.Errorf("a failed command printed to stdout: %q", stdout)
			}
			got := api.requests()
			if tt.requests != nil && mustJSON(t, got) != mustJSON(t, tt.requests) {
				t.Errorf("requests\n%s\nwant\n%s", mustJSON(t, got), mustJSON(t, tt.requests))
			}
			if tt.answers == nil && len(got) != 0 {
				t.Errorf("a usage error sent %d requests", len(got))
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCall covers `toolpool call`: the request it builds, and that it follows a call that is not final to
// its end.
func TestCall(t *testing.T) {
	var mu sync.Mutex
	var posted map[string]any
	polls := 0
	serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v1/calls":
			json.NewDecoder(r.Body).Decode(&posted)
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, strings.Replace(queuedResult, `"queued"`, `"running"`, 1))
		case r.Method == http.MethodGet && r.URL.Path == "/v1/calls/c_1" && r.URL.Query().Get("wait") == "60s":
			polls++
			if polls < 2 {
				w.WriteHeader(http.StatusAccepted)
				io.WriteString(w, queuedResult)
				return
			}
			io.WriteString(w, okResult)
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL)
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	// Flags go after TOOL or before it, to the same request.
	for _, args := range [][]string{
		{"call", "run_shell", "command=echo hi", "env:={\"A\":\"1\"}", "--workspace", "ws1", "--timeout", "2s", "--idempotency-key", "k1"},
		{"call", "--workspace", "ws1", "--timeout=2s", "--idempotency-key", "k1", "run_shell", "command=echo hi", "env:={\"A\":\"1\"}"},
	} {
		posted, polls = nil, 0
		code, stdout, stderr := cli(args...)
		if code != 0 || stdout != "hi\n" || !strings.Contains(stderr, "[ok · exit 0 · 12 ms · c_1]") {
			t.Errorf("%q: exit %d stdout %q stderr %q", args, code, stdout, stderr)
		}
		want := map[string]any{"tool": "run_shell", "workspace": "ws1", "timeout_ms": float64(2000), "idempotency_key": "k1",
			"args": map[string]any{"command": "echo hi", "env": map[string]any{"A": "1"}}}
		if mustJSON(t, posted) != mustJSON(t, want) || polls != 2 {
			t.Errorf("%q: posted %s after %d polls, want %s after 2", args, mustJSON(t, posted), polls, mustJSON(t, want))
		}
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"no tool", []string{"call"}},
		{"a flag for a tool", []string{"call", "--json"}},
		{"--args and pairs both", []string{"call", "run_shell", "--args", `{"command":"ls"}`, "command=ls"}},
		{"a pair without =", []string{"call", "run_shell", "command"}},
	} {
		if code, _, _ := cli(tc.args...); code != 2 {
			t.Errorf("%s: exit %d, want 2", tc.name, code)
		}
	}
}

// TestUnreachableDispatcher: a dispatcher that does not answer is named, with what to check.
func TestUnreachableDispatcher(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there now
	t.Setenv("TOOLPOOL_URL", url)
	code, _, stderr := cli("tools")
	if code != 1 || !strings.Contains(stderr, "reach dispatcher at "+url+" (is it running? set TOOLPOOL_URL)") {
		t.Errorf("exit %d stderr %q", code, stderr)
	}
}
