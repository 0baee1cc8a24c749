package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// TestPolicyApprovalsAudit runs the shipped default policy: read-only commands run, forbidden ones are
// denied, mutating ones wait for a person, whose approval binds to the exact arguments; every decision and
// outcome lands in the audit log.
func TestPolicyApprovalsAudit(t *testing.T) {
	s := startStackWith(t, stackOptions{})
	post := func(token string, body map[string]any) response {
		return s.do(t, http.MethodPost, "/v1/calls", token, body)
	}
	shellCall := func(cmd string) map[string]any {
		return map[string]any{"tool": "run_shell", "workspace": "pol", "args": map[string]any{"command": cmd}}
	}

	t.Run("read-only command runs", func(t *testing.T) {
		r := post("dev-token", shellCall("ls -la && pwd"))
		if res := r.result(t); r.code != 200 || res.Status != call.StatusOK || res.Decision.Action != "allow" {
			t.Fatalf("HTTP %d %s", r.code, r.body)
		}
	})

	t.Run("forbidden command is denied with the rule and a reason", func(t *testing.T) {
		for _, cmd := range []string{"sudo reboot", "ls; sudo reboot", "bash -c 'curl x | sh'", "echo ok > /etc/passwd"} {
			r := post("dev-token", shellCall(cmd))
			res := r.result(t)
			if r.code != http.StatusForbidden || res.Status != call.StatusDenied || res.Decision.Action != "deny" || res.Decision.Rule == "" || res.Error.Type != call.ErrPolicyDenied || res.Output == "" {
				t.Fatalf("%q: HTTP %d %s", cmd, r.code, r.body)
			}
			// A denied call still has one durable final state.
			if g := s.do(t, http.MethodGet, "/v1/calls/"+res.ID, "dev-token", nil); g.result(t).Status != call.StatusDenied {
				t.Fatalf("%q: GET %s", cmd, g.body)
			}
		}
	})

	t.Run("dry run decides without running", func(t *testing.T) {
		r := s.do(t, http.MethodPost, "/v1/policy/check", "dev-token", shellCall("rm -rf /"))
		var out struct {
			Decision call.Decision `json:"decision"`
			WouldRun bool          `json:"would_run"`
		}
		if err := json.Unmarshal(r.body, &out); err != nil || r.code != 200 || out.Decision.Action != "deny" || out.WouldRun {
			t.Fatalf("HTTP %d %s", r.code, r.body)
		}
	})

	var pendingID string
	t.Run("mutating command waits for approval", func(t *testing.T) {
		r := post("dev-token", shellCall("mkdir approved-dir"))
		res := r.result(t)
		if r.code != http.StatusAccepted || res.Status != call.StatusPendingApproval || res.Decision.Action != "ask" {
			t.Fatalf("HTTP %d %s", r.code, r.body)
		}
		pendingID = res.ID
	})

	var digest string
	t.Run("approvals list shows it to approvers only", func(t *testing.T) {
		if r := s.do(t, http.MethodGet, "/v1/approvals", "alpha-token", nil); r.code != http.StatusForbidden {
			t.Fatalf("a caller token listed approvals: HTTP %d", r.code)
		}
		r := s.do(t, http.MethodGet, "/v1/approvals", "dev-token", nil)
		var out struct {
			Approvals []struct {
				ID         string `json:"id"`
				ArgsDigest string `json:"args_digest"`
			} `json:"approvals"`
		}
		json.Unmarshal(r.body, &out)
		for _, a := range out.Approvals {
			if a.ID == pendingID {
				digest = a.ArgsDigest
			}
		}
		if !strings.HasPrefix(digest, "sha256:") {
			t.Fatalf("pending call not listed with a digest: %s", r.body)
		}
	})

	t.Run("an approval binds to the arguments the approver saw", func(t *testing.T) {
		r := s.do(t, http.MethodPost, "/v1/approvals/"+pendingID, "dev-token", map[string]any{"decision": "approve", "args_digest": "sha256:00"})
		if r.code != http.StatusConflict {
			t.Fatalf("wrong digest: HTTP %d %s", r.code, r.body)
		}
		r = s.do(t, http.MethodPost, "/v1/approvals/"+pendingID, "dev-token", map[string]any{"decision": "approve", "args_digest": digest})
		if r.code != http.StatusAccepted {
			t.Fatalf("approve: HTTP %d %s", r.code, r.body)
		}
		g := s.do(t, http.MethodGet, "/v1/calls/"+pendingID+"?wait=30s", "dev-token", nil)
		if res := g.result(t); res.Status != call.StatusOK {
			t.Fatalf("approved call: %s", g.body)
		}
		if r := s.do(t, http.MethodPost, "/v1/approvals/"+pendingID, "dev-token", map[string]any{"decision": "approve"}); r.code != http.StatusNotFound {
			t.Fatalf("second approval: HTTP %d %s", r.code, r.body)
		}
	})

	t.Run("a denied approval ends the call denied, unrun", func(t *testing.T) {
		res := post("dev-token", shellCall("mkdir never-made")).result(t)
		r := s.do(t, http.MethodPost, "/v1/approvals/"+res.ID, "dev-token", map[string]any{"decision": "deny"})
		if got := r.result(t); r.code != http.StatusForbidden || got.Status != call.StatusDenied {
			t.Fatalf("deny: HTTP %d %s", r.code, r.body)
		}
		if ls := post("dev-token", shellCall("ls")).result(t); strings.Contains(ls.Output, "never-made") {
			t.Fatalf("the denied call ran: %s", ls.Output)
		}
	})

	t.Run("approve always adds a tenant rule for that prefix", func(t *testing.T) {
		res := post("dev-token", shellCall("mkdir -p a/b")).result(t)
		r := s.do(t, http.MethodPost, "/v1/approvals/"+res.ID, "dev-token", map[string]any{"decision": "approve", "always": true, "argv_prefix": []string{"mkdir"}})
		if r.code != http.StatusAccepted {
			t.Fatalf("approve always: HTTP %d %s", r.code, r.body)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			next := post("dev-token", shellCall("mkdir -p c/d"))
			got := next.result(t)
			if got.Status == call.StatusOK && got.Decision.Action == "allow" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the rule did not take: %s", next.body)
			}
		}
		if other := post("dev-token", shellCall("rm -r a")).result(t); other.Status != call.StatusPendingApproval {
			t.Fatalf("the rule allowed more than its prefix: %s %s", other.Status, other.Decision.Rule)
		}
	})

	t.Run("audit log has decisions and outcomes", func(t *testing.T) {
		r := s.do(t, http.MethodGet, "/v1/audit?since=1h", "dev-token", nil)
		var out struct {
			Events []call.AuditEvent `json:"events"`
		}
		if err := json.Unmarshal(r.body, &out); err != nil || r.code != 200 {
			t.Fatalf("HTTP %d %s", r.code, r.body)
		}
		seen := map[string]bool{}
		for _, e := range out.Events {
			if e.CallID == pendingID {
				seen[e.Event] = true
				if e.ArgsDigest != digest {
					t.Errorf("event %s has digest %s", e.Event, e.ArgsDigest)
				}
			}
			if strings.Contains(string(r.body), `"command"`) {
				t.Fatal("the audit log holds arguments")
			}
		}
		for _, want := range []string{"accepted", "approved", "finished"} {
			if !seen[want] {
				t.Errorf("no %q event for the approved call in %d events", want, len(out.Events))
			}
		}
	})
}

// TestPolicyHotReload: a changed policy file takes effect without a restart; an invalid one is rejected
// and the previous policy stays.
func TestPolicyHotReload(t *testing.T) {
	s := startStackWith(t, stackOptions{policy: permissivePolicy})
	hasTool := func(name string) bool {
		r := s.do(t, http.MethodGet, "/v1/tools", "dev-token", nil)
		return strings.Contains(string(r.body), `"name":"`+name+`"`)
	}
	if !hasTool("run_shell") {
		t.Fatal("run_shell not listed at start")
	}
	write := func(content string) {
		if err := os.WriteFile(s.policyPath+".tmp", []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(s.policyPath+".tmp", s.policyPath); err != nil {
			t.Fatal(err)
		}
	}
	write(permissivePolicy + "tools:\n  run_shell:\n    enabled: false\n")
	waitFor(t, 30*time.Second, "run_shell disabled", func() bool { return !hasTool("run_shell") })
	if r := s.shell(t, "dev-token", "ws", "true", nil); r.code != http.StatusUnprocessableEntity {
		t.Fatalf("disabled tool ran: HTTP %d %s", r.code, r.body)
	}
	write("version: 1\ndefault_action: allow\ntools:\n  run_shell:\n    enabled: maybe\n")
	s.dispatcher.WaitLog(t, "reload policy: keeping the previous one", 30*time.Second)
	if hasTool("run_shell") {
		t.Fatal("an invalid policy file changed the policy")
	}
	write(permissivePolicy)
	waitFor(t, 30*time.Second, "run_shell enabled again", func() bool { return hasTool("run_shell") })
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
