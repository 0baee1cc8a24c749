package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// gammaOnGVisor continues the harness's tenants list (dispatcherConfig ends inside it) with tenant gamma,
// whose calls must run under gVisor.
const gammaOnGVisor = `    - name: gamma
      runtime: gvisor
      tokens: [{token: gamma-token}]
`

// TestTenantRuntime: a tenant given gVisor in the dispatcher's config has every call run under gVisor,
// while other tenants on the same worker keep the worker's default; a worker without gVisor refuses the
// tenant's calls with a final error that names the runtime, and runs them under nothing else.
func TestTenantRuntime(t *testing.T) {
	ctrtest.RequireGVisor(t)
	s := startStackWith(t, stackOptions{policy: permissivePolicy, extraConfig: gammaOnGVisor, workerConfig: "runtime: runc\n"})
	host := ctrtest.HostRelease(t)
	kernel := func(t *testing.T, token string) *call.Result {
		t.Helper()
		r := s.shell(t, token, "rt", "uname -r; id -u", nil)
		if r.code != http.StatusOK {
			t.Fatalf("HTTP %d %s", r.code, r.body)
		}
		return r.result(t)
	}

	t.Run("the tenant's calls run under gVisor, the others' under runc", func(t *testing.T) {
		for token, underHost := range map[string]bool{"alpha-token": true, "gamma-token": false} {
			res := kernel(t, token)
			got := strings.Split(strings.TrimSpace(res.Stdout), "\n")
			if res.Status != call.StatusOK || len(got) != 2 || got[1] != "65532" {
				t.Fatalf("%s: status %s stdout %q error %+v", token, res.Status, res.Stdout, res.Error)
			}
			if (got[0] == host) != underHost {
				t.Errorf("%s: the call sees kernel %q, the host runs %q: wrong runtime", token, got[0], host)
			}
		}
	})

	t.Run("the policy check shows the runtime with the limits", func(t *testing.T) {
		r := s.do(t, http.MethodPost, "/v1/policy/check", "gamma-token",
			map[string]any{"tool": "run_shell", "workspace": "rt", "args": map[string]any{"command": "true"}})
		var out struct {
			Limits call.Limits `json:"limits"`
		}
		if err := json.Unmarshal(r.body, &out); err != nil || r.code != http.StatusOK || out.Limits.Runtime != "gvisor" {
			t.Fatalf("HTTP %d %s", r.code, r.body)
		}
	})

	t.Run("a worker without gVisor refuses the tenant's calls", func(t *testing.T) {
		s.worker.Stop(t)
		s.opts.workerConfig = "runtime: runc\ngvisor:\n  disabled: true\n"
		s.startWorker(t)
		res := kernel(t, "gamma-token")
		if res.Status != call.StatusError || res.Error == nil || res.Error.Type != call.ErrRuntimeUnavailable ||
			!strings.Contains(res.Error.Message, `"gvisor"`) || !strings.Contains(res.Error.Message, "make gvisor") || res.Stdout != "" {
			t.Fatalf("status %s error %+v stdout %q; want a final runtime_unavailable error naming gvisor", res.Status, res.Error, res.Stdout)
		}
		if res := kernel(t, "alpha-token"); res.Status != call.StatusOK {
			t.Errorf("the other tenant's call: status %s error %+v", res.Status, res.Error)
		}
	})
}
