package dispatcher

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/workspace"
)

// TestCreateWorkspaceWithImage: PUT /v1/workspaces/{name} takes a default image in its JSON body (alone
// or with a git source) or as ?image=; policy's images sections must admit it (403 with the rule and the
// patterns, 422 for a reference that does not parse), checked before anything is stored or queued, and
// the operation carries it to the worker.
func TestCreateWorkspaceWithImage(t *testing.T) {
	images, err := policy.Parse([]byte("version: 1\ndefault_action: allow\nimages: {allow: [registry.example.com/tools/]}\n"), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const img = "registry.example.com/tools/python:3.12"
	h := newHarness(t, setup{})
	h.pol.images = images
	h.answerWorkspaceOps(t, func(c *call.Call) string { // a worker that creates: the workspace's description
		var a workspace.Args
		json.Unmarshal(c.Args, &a)
		out, _ := json.Marshal(workspace.Output{Workspace: &workspace.Info{Name: c.Workspace, Image: a.Image}})
		return string(out)
	})
	putJSON := func(path string, body any) reply {
		return h.do(http.MethodPut, path, acmeCaller, body, "Content-Type", "application/json")
	}
	created := func(r reply, tool string) {
		t.Helper()
		var answer struct {
			Workspace workspace.Info `json:"workspace"`
		}
		if r.code != http.StatusCreated || json.Unmarshal(r.body, &answer) != nil || answer.Workspace.Image != img {
			t.Fatalf("HTTP %d %s; want 201 with the workspace's image", r.code, r.body)
		}
		calls := h.pub.calls()
		c := calls[len(calls)-1]
		var a workspace.Args
		if err := json.Unmarshal(c.Args, &a); err != nil || c.Tool != tool || a.Image != img {
			t.Fatalf("queued %s with %s; want %s with image %s", c.Tool, c.Args, tool, img)
		}
	}

	// Refusals first: none of them is queued.
	putJSON("/v1/workspaces/ws", map[string]any{"image": "docker.io/library/node:22"}).wantError(t, http.StatusForbidden, call.ErrPolicyDenied,
		`image "docker.io/library/node:22" refused by rule the operator's policy: images`, "(allowed: registry.example.com/tools/)")
	putJSON("/v1/workspaces/ws", map[string]any{"image": "Not::A/ref"}).wantError(t, http.StatusUnprocessableEntity, call.ErrInvalidParams, `"image"`, "does not parse")
	h.do(http.MethodPut, "/v1/workspaces/ws?image=docker.io/library/node:22", acmeCaller, nil).wantError(t, http.StatusForbidden, call.ErrPolicyDenied, "images")
	// Checked before an archive is stored (this harness has no transfer store: it would answer 503).
	h.do(http.MethodPut, "/v1/workspaces/ws?image=Not::A/ref", acmeCaller, "PK\x03\x04 not really a zip", "Content-Type", "application/zip").
		wantError(t, http.StatusUnprocessableEntity, call.ErrInvalidParams, "does not parse")
	putJSON("/v1/workspaces/ws?image="+img, map[string]any{"image": img}).wantError(t, http.StatusBadRequest, call.ErrInvalidRequest, "given twice")
	putJSON("/v1/workspaces/ws", map[string]any{}).wantError(t, http.StatusBadRequest, call.ErrInvalidRequest, "no git source and no image")
	putJSON("/v1/workspaces/ws", map[string]any{"image": img, "tag": "x"}).wantError(t, http.StatusBadRequest, call.ErrInvalidRequest, `unknown field "tag"`)
	if n := len(h.pub.calls()); n != 0 {
		t.Fatalf("%d refused creates were queued", n)
	}

	created(putJSON("/v1/workspaces/ws", map[string]any{"image": img}), workspace.OpCreate)
	created(h.do(http.MethodPut, "/v1/workspaces/ws2?image="+img, acmeCaller, nil), workspace.OpCreate)
	created(putJSON("/v1/workspaces/ws3", map[string]any{"image": img, "git": map[string]string{"url": "https://git.example.com/r.git"}}), workspace.OpClone)
}
