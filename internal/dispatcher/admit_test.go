package dispatcher

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/tools"
)

// unused fails the test if admission touches the store, the queue or the approvals: POST
// /v1/policy/check only admits.
type unused struct{ t *testing.T }

func (u unused) Create(context.Context, *call.Result) (uint64, error) {
	u.t.Fatal("the dry run recorded a call")
	return 0, nil
}
func (u unused) Get(context.Context, string) (queue.Record, error) {
	u.t.Fatal("the dry run read a call")
	return queue.Record{}, nil
}
func (u unused) Update(context.Context, *call.Result, uint64) (uint64, error) {
	u.t.Fatal("the dry run updated a call")
	return 0, nil
}
func (u unused) Wait(context.Context, string, func(*call.Result) bool) (*call.Result, error) {
	u.t.Fatal("the dry run waited")
	return nil, nil
}
func (u unused) Publish(context.Context, *call.Call) error {
	u.t.Fatal("the dry run published")
	return nil
}
func (u unused) PutPending(context.Context, *call.Pending) error { return nil }
func (u unused) GetPending(context.Context, string, string) (*call.Pending, error) {
	return nil, nil
}
func (u unused) ListPending(context.Context, string) ([]*call.Pending, error) { return nil, nil }
func (u unused) DeletePending(context.Context, string, string) error          { return nil }

// checkServer is a dispatcher with three tenants, one per posture, and the default policy.
func checkServer(t *testing.T) *httptest.Server {
	t.Helper()
	reg, err := tools.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.MaxTimeout = 10 * time.Minute
	cfg.Ceilings = Ceilings{MemoryBytes: 1 << 30, CPUMillis: 2000, PIDs: 512, TmpBytes: 512 << 20}
	cfg.Tenants = []Tenant{
		{Name: "people", Tokens: []Token{{Token: "people-token"}}},
		{Name: "ci", Tokens: []Token{{Token: "ci-token"}}, Posture: "autonomous"},
		{Name: "audit", Tokens: []Token{{Token: "audit-token"}}, Posture: "read-only"},
	}
	u := unused{t}
	s, err := New(cfg, Deps{Store: u, Publisher: u, Tools: reg, Policy: policy.NewStore(policy.Default()), Approvals: u,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv
}

type checkAnswer struct {
	Code     int
	Decision call.Decision `json:"decision"`
	Limits   call.Limits   `json:"limits"`
	Error    struct {
		Message string `json:"message"`
	} `json:"error"`
	Message string `json:"message"`
	Raw     string
}

func check(t *testing.T, srv *httptest.Server, token, body string) checkAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/policy/check", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var a checkAnswer
	_ = json.Unmarshal(b, &a)
	a.Code, a.Raw = resp.StatusCode, string(b)
	return a
}

// TestCeilings: a request above a resource ceiling is a 422 that says how much it may ask; timeouts
// and output above the server's or the policy's most are lowered, and the decision says so.
func TestCeilings(t *testing.T) {
	srv := checkServer(t)
	tests := []struct {
		name     string
		body     string
		code     int
		contains []string
		clamped  string
	}{
		{name: "memory above the ceiling", body: `{"tool":"read_file","args":{"path":"a"},"memory_bytes":8589934592}`, code: 422,
			contains: []string{"memory_bytes 8589934592 is above this server's ceiling of 1073741824", "ask for at most 1073741824"}},
		{name: "cpu above the ceiling", body: `{"tool":"read_file","args":{"path":"a"},"cpu_millis":64000}`, code: 422, contains: []string{"cpu_millis"}},
		{name: "pids above the ceiling", body: `{"tool":"read_file","args":{"path":"a"},"pids":100000}`, code: 422, contains: []string{"pids"}},
		{name: "tmp above the ceiling", body: `{"tool":"read_file","args":{"path":"a"},"tmp_bytes":8589934592}`, code: 422, contains: []string{"tmp_bytes"}},
		{name: "negative memory", body: `{"tool":"read_file","args":{"path":"a"},"memory_bytes":-1}`, code: 400},
		{name: "within the ceilings", body: `{"tool":"read_file","args":{"path":"a"},"memory_bytes":536870912,"cpu_millis":1500,"pids":100,"tmp_bytes":1048576}`, code: 200},
		{name: "timeout above the server's most is lowered", body: `{"tool":"read_file","args":{"path":"a"},"timeout_ms":3600000}`, code: 200,
			clamped: "timeout_ms lowered to 600000, this server's most"},
		{name: "timeout above the policy's most is lowered", body: `{"tool":"read_file","args":{"path":"a"},"timeout_ms":500000}`, code: 200,
			clamped: "timeout_ms lowered to 300000, the policy's most for read_file"},
		{name: "output above the server's most is lowered", body: `{"tool":"read_file","args":{"path":"a"},"output_bytes":99999999}`, code: 200,
			clamped: "output_bytes lowered to 1048576"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := check(t, srv, "people-token", tt.body)
			if a.Code != tt.code {
				t.Fatalf("status %d, want %d: %s", a.Code, tt.code, a.Raw)
			}
			for _, c := range tt.contains {
				if !strings.Contains(a.Raw, c) {
					t.Errorf("answer lacks %q: %s", c, a.Raw)
				}
			}
			if tt.clamped != "" && !strings.Contains(strings.Join(a.Decision.Clamped, "; "), tt.clamped) {
				t.Errorf("decision.clamped = %v, want %q", a.Decision.Clamped, tt.clamped)
			}
			if tt.code == 200 && tt.clamped == "" && len(a.Decision.Clamped) > 0 {
				t.Errorf("decision.clamped = %v, want nothing", a.Decision.Clamped)
			}
		})
	}
	if a := check(t, srv, "people-token", `{"tool":"read_file","args":{"path":"a"},"memory_bytes":536870912,"cpu_millis":1500,"pids":100}`); a.Limits.MemoryBytes != 536870912 || a.Limits.CPUMillis != 1500 || a.Limits.PIDs != 100 {
		t.Errorf("limits %+v do not carry what was asked", a.Limits)
	}
}

// TestPosturesByTenant: each tenant's posture from the configuration shapes its decisions, and
// run_shell's env and cwd reach policy.
func TestPosturesByTenant(t *testing.T) {
	srv := checkServer(t)
	tests := []struct {
		name, token, body, action string
	}{
		{"interactive asks for a redirect", "people-token", `{"tool":"run_shell","args":{"command":"go test ./... > out.txt"}}`, "ask"},
		{"autonomous runs it", "ci-token", `{"tool":"run_shell","args":{"command":"go test ./... > out.txt"}}`, "allow"},
		{"read-only refuses it", "audit-token", `{"tool":"run_shell","args":{"command":"go test ./... > out.txt"}}`, "deny"},
		{"interactive: write_file asks", "people-token", `{"tool":"write_file","args":{"path":"a","content":"x"}}`, "ask"},
		{"autonomous: write_file runs", "ci-token", `{"tool":"write_file","args":{"path":"a","content":"x"}}`, "allow"},
		{"read-only: write_file is refused", "audit-token", `{"tool":"write_file","args":{"path":"a","content":"x"}}`, "deny"},
		{"autonomous still denies sudo", "ci-token", `{"tool":"run_shell","args":{"command":"sudo id"}}`, "deny"},
		{"env reaches policy", "people-token", `{"tool":"run_shell","args":{"command":"git status","env":{"GIT_CONFIG_COUNT":"1"}}}`, "ask"},
		{"cwd reaches policy", "ci-token", `{"tool":"run_shell","args":{"command":"cat config.json","cwd":".docker"}}`, "deny"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := check(t, srv, tt.token, tt.body)
			if a.Code != 200 || a.Decision.Action != tt.action {
				t.Errorf("status %d, decision %+v; want %s: %s", a.Code, a.Decision, tt.action, a.Raw)
			}
			if ro := tt.token == "audit-token"; a.Limits.ReadOnlyWorkspace != ro {
				t.Errorf("limits.read_only_workspace = %v, want %v (the read-only posture's, only): %s", a.Limits.ReadOnlyWorkspace, ro, a.Raw)
			}
		})
	}
}

// TestAdmitCarriesDeniedGlobs: a file tool's call carries its denied globs to the runner; its digest is
// of the arguments as sent.
func TestAdmitCarriesDeniedGlobs(t *testing.T) {
	reg, err := tools.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Tenants = []Tenant{{Name: "t1", Tokens: []Token{{Token: "t1-token"}}}}
	u := unused{t}
	s, err := New(cfg, Deps{Store: u, Publisher: u, Tools: reg, Policy: policy.NewStore(policy.Default()), Approvals: u,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	req := &call.Request{Tool: "grep", Args: json.RawMessage(`{"pattern":"SECRET"}`)}
	c, _, rerr := s.admit(context.Background(), principal{tenant: "t1"}, req)
	if rerr != nil {
		t.Fatal(rerr)
	}
	if !slices.Contains(c.Limits.DeniedGlobs, "**/.env") {
		t.Errorf("the call's limits carry no denied globs: %v", c.Limits.DeniedGlobs)
	}
	if string(c.Args) != `{"pattern":"SECRET"}` {
		t.Errorf("args %s are not the arguments as sent", c.Args)
	}
	if c.ArgsDigest != call.ArgsDigest(json.RawMessage(`{"pattern":"SECRET"}`)) {
		t.Errorf("digest %s is not of the arguments as sent", c.ArgsDigest)
	}
	shell, _, rerr := s.admit(context.Background(), principal{tenant: "t1"}, &call.Request{Tool: "run_shell", Args: json.RawMessage(`{"command":"ls"}`)})
	if rerr != nil {
		t.Fatal(rerr)
	}
	if !slices.Contains(shell.Limits.DeniedGlobs, "**/.env") {
		t.Errorf("a run_shell call, whose container the worker hides them from, carries no denied globs: %v", shell.Limits.DeniedGlobs)
	}
	bad := DefaultConfig()
	bad.Tenants = []Tenant{{Name: "t", Tokens: []Token{{Token: "abc"}}, Posture: "reckless"}}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "not one of interactive, autonomous, read-only") {
		t.Errorf("a bad posture validates: %v", err)
	}
}
