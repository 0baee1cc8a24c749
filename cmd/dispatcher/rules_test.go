package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/dispatcher"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
	"github.com/toolpool/toolpool/internal/tools"
)

// replica is a dispatcher's API on a NATS server, with the shipped default policy and its approve-always
// rules shared through shareAllowRules, as run wires them.
type replica struct {
	api  http.Handler
	stop func()
}

const approverToken = "acme-approver"

func startReplica(t *testing.T, natsURL string) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn := jstest.Connect(t, natsURL, "dispatcher", true)
	reg, err := tools.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	pstore := policy.NewStore(policy.Default(), policy.KnownTools(reg.Names()...))
	rules, err := shareAllowRules(ctx, conn, pstore, log)
	if err != nil {
		t.Fatal(err)
	}
	cfg := dispatcher.DefaultConfig()
	cfg.Tenants = []dispatcher.Tenant{{Name: "acme", Tokens: []dispatcher.Token{{Token: approverToken, Role: dispatcher.RoleApprover}}}}
	api, err := dispatcher.New(cfg, dispatcher.Deps{Store: conn.Records(), Publisher: conn.Calls(), Tools: reg, Policy: pstore, Approvals: conn.Approvals(), Log: log},
		dispatcher.WithRuleBook(rules, nil))
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{api: api.Handler(), stop: func() { cancel(); conn.Close() }}
	t.Cleanup(r.stop)
	return r
}

func (r *replica) post(t *testing.T, path, body string) (int, []byte) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+approverToken)
	rec := httptest.NewRecorder()
	r.api.ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

// decision is what the replica's policy decides for a run_shell command.
func (r *replica) decision(t *testing.T, command string) call.Decision {
	t.Helper()
	code, body := r.post(t, "/v1/policy/check", `{"tool":"run_shell","args":{"command":"`+command+`"}}`)
	var out struct{ Decision call.Decision }
	if err := json.Unmarshal(body, &out); err != nil || code != http.StatusOK {
		t.Fatalf("policy check: HTTP %d %v: %s", code, err, body)
	}
	return out.Decision
}

// waitForDecision polls the replica until command is decided by rule, failing after a deadline no slow
// machine needs.
func (r *replica) waitForDecision(t *testing.T, command, rule string) {
	t.Helper()
	var d call.Decision
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if d = r.decision(t, command); d.Rule == rule {
			return
		}
	}
	t.Fatalf("%q is decided %s by rule %s, want rule %s", command, d.Action, d.Rule, rule)
}

// TestApproveAlwaysIsShared: a rule an approver adds with "approve always" on one dispatcher reaches the
// other replicas, and survives a restart of every dispatcher and of NATS, through the state bucket.
func TestApproveAlwaysIsShared(t *testing.T) {
	storeDir := t.TempDir()
	nats := jstest.Server(t, storeDir)
	first, other := startReplica(t, nats.URL()), startReplica(t, nats.URL())
	for _, r := range []*replica{first, other} {
		if d := r.decision(t, "mkdir build"); d.Action != "ask" || d.Rule != "mutating-commands" {
			t.Fatalf("before any approval mkdir is %+v, want ask by mutating-commands", d)
		}
	}

	code, body := first.post(t, "/v1/calls", `{"tool":"run_shell","args":{"command":"mkdir build"},"wait":false}`)
	var parked call.Result
	if err := json.Unmarshal(body, &parked); err != nil || code != http.StatusAccepted || parked.Status != call.StatusPendingApproval {
		t.Fatalf("POST mkdir: HTTP %d %v: %s", code, err, body)
	}
	code, body = first.post(t, "/v1/approvals/"+parked.ID, `{"decision":"approve","always":true,"argv_prefix":["mkdir"]}`)
	if code != http.StatusAccepted {
		t.Fatalf("approve always: HTTP %d: %s", code, body)
	}
	if d := first.decision(t, "mkdir -p src/x"); d.Action != "allow" || d.Rule != policy.RuleApprovedAlways {
		t.Fatalf("after approve always, mkdir is %+v on the replica that took it", d)
	}
	other.waitForDecision(t, "mkdir -p src/x", policy.RuleApprovedAlways)
	if d := other.decision(t, "rmdir src"); d.Action != "ask" {
		t.Errorf("the rule for mkdir allowed rmdir: %+v", d)
	}

	// Restart everything on the same store.
	first.stop()
	other.stop()
	nats.Shutdown()
	nats = jstest.Server(t, storeDir)
	restarted := startReplica(t, nats.URL())
	restarted.waitForDecision(t, "mkdir -p src/y", policy.RuleApprovedAlways)
}
