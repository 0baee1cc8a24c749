package e2e

import (
	"net/http"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
)

// TestWorkspaceQuota: a call that grows its workspace past the quota is stopped and says so; calls that
// would add files are then refused with a message that says what to do, while deleting still works.
func TestWorkspaceQuota(t *testing.T) {
	s := startStackWith(t, stackOptions{policy: permissivePolicy, workerConfig: "workspace_quota: 1048576\n"})
	// Three files of 600 KB: each under the 1 MiB file-size limit, together over the quota.
	fill := `awk 'BEGIN{for(f=0;f<3;f++) for(i=0;i<6000;i++) printf "%0099d\n", i > ("big" f)}'`
	r := s.shell(t, "dev-token", "q", fill, nil)
	res := r.result(t)
	if res.Status != call.StatusError || res.Error.Type != call.ErrQuota || res.Usage.WorkspaceBytes <= 1<<20 {
		t.Fatalf("filling call: HTTP %d %s", r.code, r.body)
	}
	write := func() *call.Result {
		return s.do(t, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": "write_file", "workspace": "q",
			"args": map[string]any{"path": "note.txt", "content": "hello"}}).result(t)
	}
	if w := write(); w.Status != call.StatusError || w.Error.Type != call.ErrQuota || !strings.Contains(w.Error.Message, "over its quota") {
		t.Fatalf("write into a full workspace: %+v %+v", w.Status, w.Error)
	}
	if d := s.shell(t, "dev-token", "q", "rm -f big0 big1 big2 && ls", nil).result(t); d.Status != call.StatusOK {
		t.Fatalf("deleting in a full workspace: %s %+v %s", d.Status, d.Error, d.Output)
	}
	if w := write(); w.Status != call.StatusOK {
		t.Fatalf("write after freeing space: %+v %+v", w.Status, w.Error)
	}
}
