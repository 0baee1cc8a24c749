package dispatcher

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/workspace"
)

// answerWorkspaceOps makes every published call end ok with the output out gives it, as a worker that
// ran it records it.
func (h *harness) answerWorkspaceOps(t *testing.T, out func(c *call.Call) string) {
	h.pub.onPublish = func(c *call.Call) {
		output := out(c)
		go func() {
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				rec, err := h.store.Get(context.Background(), c.ID)
				if err != nil {
					continue
				}
				r := rec.Result
				r.Status, r.Output = call.StatusOK, output
				if _, err := h.store.Update(context.Background(), r, rec.Revision); err == nil {
					return
				}
			}
			t.Errorf("worker: call %s never recorded", c.ID)
		}()
	}
}

// TestCreateWorkspaceFromGit: PUT /v1/workspaces/{name} with a JSON git source becomes a workspace_clone
// call judged by policy like a command granted network, carrying the policy's egress limits and the
// tenant's runtime; a bad source is refused with 400 and a denied host with 403, neither queued.
func TestCreateWorkspaceFromGit(t *testing.T) {
	pol, err := policy.Parse([]byte(`
version: 1
default_action: allow
tools:
  workspace_clone:
    network: true
    allowed_domains: [git.example.com]
    allowed_ports: [443]
tenants:
  globex:
    tools:
      workspace_clone: {network: false}
`), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, setup{engine: policy.NewStore(pol), config: func(c *Config) { c.Tenants[0].Runtime = "gvisor" }})
	h.answerWorkspaceOps(t, func(c *call.Call) string { // a worker that clones: the workspace's description
		return `{"workspace":{"name":"` + c.Workspace + `","files":2}}`
	})
	put := func(token, name string, body any, header ...string) reply {
		return h.do(http.MethodPut, "/v1/workspaces/"+name, token, body, append([]string{"Content-Type", "application/json"}, header...)...)
	}
	git := func(url, ref string) map[string]any {
		return map[string]any{"git": map[string]string{"url": url, "ref": ref}}
	}

	for _, tc := range []struct {
		name string
		body any
		msg  string
	}{
		{"no git", map[string]any{}, "names no git source"},
		{"unknown field", map[string]any{"git": map[string]string{"url": "https://git.example.com/r.git"}, "branch": "x"}, `unknown field "branch"`},
		{"not JSON", "tar?", "is not a workspace source"},
		{"credentials", git("https://u:secret@git.example.com/r.git", ""), "egress.credentials"},
		{"ssh", git("git@git.example.com:o/r.git", ""), "ssh address"},
		{"option ref", git("https://git.example.com/r.git", "--upload-pack=x"), "read as an option"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			put(acmeCaller, "ws", tc.body).wantError(t, http.StatusBadRequest, "invalid_request", tc.msg)
		})
	}
	h.do(http.MethodPut, "/v1/workspaces/ws", acmeCaller, `{"git": {"url": "https://git.example.com/r.git"}}`).
		wantError(t, http.StatusUnsupportedMediaType, "invalid_request", "Content-Type: application/json")
	if n := len(h.pub.calls()); n != 0 {
		t.Fatalf("%d bad requests were queued", n)
	}

	denied := put(acmeCaller, "ws", git("https://evil.example/r.git", "main"))
	if res := denied.result(t); denied.code != http.StatusForbidden || res.Decision.Rule != policy.RuleDomainNotAllowed {
		t.Fatalf("a host policy does not allow: HTTP %d %s", denied.code, denied.body)
	}
	nonet := put(globexCaller, "ws", git("https://git.example.com/r.git", "main"))
	if res := nonet.result(t); nonet.code != http.StatusForbidden || res.Decision.Rule != policy.RuleNoNetwork {
		t.Fatalf("a tenant without network: HTTP %d %s", nonet.code, nonet.body)
	}
	if n := len(h.pub.calls()); n != 0 {
		t.Fatalf("%d denied clones were queued", n)
	}

	ok := put(acmeCaller, "ws", git("https://git.example.com/o/r.git", "v1.0"))
	if ok.code != http.StatusCreated {
		t.Fatalf("clone: HTTP %d %s", ok.code, ok.body)
	}
	var answer struct {
		Workspace workspace.Info `json:"workspace"`
		CallID    string         `json:"call_id"`
	}
	if err := json.Unmarshal(ok.body, &answer); err != nil || answer.Workspace.Name != "ws" || answer.CallID == "" {
		t.Fatalf("answer %s (%v)", ok.body, err)
	}
	c := h.pub.calls()[0]
	var args workspace.Args
	json.Unmarshal(c.Args, &args)
	l := c.Limits
	if c.Tool != workspace.OpClone || args.Git == nil || args.Git.URL != "https://git.example.com/o/r.git" || args.Git.Ref != "v1.0" ||
		!l.Network || !slices.Equal(l.AllowedDomains, []string{"git.example.com"}) || !slices.Equal(l.AllowedPorts, []int{443}) || l.Runtime != "gvisor" {
		t.Fatalf("queued %s with args %s and limits %+v; want workspace_clone with the source, network, the policy's hosts and ports, and the tenant's runtime", c.Tool, c.Args, l)
	}
}
