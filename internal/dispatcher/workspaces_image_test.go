package dispatcher

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
	"github.com/toolpool/toolpool/internal/workspace"
)

// imageHarness is a dispatcher whose policy admits the images of registry.example.com/tools/, with a
// worker that answers every workspace operation with the workspace's description, its image the
// operation's.
func imageHarness(t *testing.T) *harness {
	t.Helper()
	images, err := policy.Parse([]byte("version: 1\ndefault_action: allow\nimages: {allow: [registry.example.com/tools/]}\n"), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, setup{})
	h.pol.images = images
	h.answerWorkspaceOps(t, func(c *call.Call) string {
		var a workspace.Args
		json.Unmarshal(c.Args, &a)
		out, _ := json.Marshal(workspace.Output{Workspace: &workspace.Info{Name: c.Workspace, Image: a.Image}})
		return string(out)
	})
	return h
}

// TestCreateWorkspaceWithImage: PUT /v1/workspaces/{name} takes a default image in its JSON body (alone
// or with a git source) or as ?image=; policy's images sections must admit it (403 with the rule and the
// patterns, 422 for a reference that does not parse), checked before anything is stored or queued, and
// the operation carries it to the worker.
func TestCreateWorkspaceWithImage(t *testing.T) {
	const img = "registry.example.com/tools/python:3.12"
	h := imageHarness(t)
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

// TestChangeWorkspaceImage: PATCH /v1/workspaces/{name} with {"image": REF} queues workspace_set_image
// with the new image, checked against policy's images sections first (403, 422, nothing queued);
// {"image": ""} removes it; a body without "image", with another field, or not JSON is refused.
func TestChangeWorkspaceImage(t *testing.T) {
	const img = "registry.example.com/tools/node:22"
	h := imageHarness(t)
	patch := func(body any) reply {
		return h.do(http.MethodPatch, "/v1/workspaces/ws", acmeCaller, body, "Content-Type", "application/json")
	}
	changed := func(r reply, want string) {
		t.Helper()
		var answer struct {
			Workspace workspace.Info `json:"workspace"`
			CallID    string         `json:"call_id"`
		}
		if r.code != http.StatusOK || json.Unmarshal(r.body, &answer) != nil || answer.Workspace.Image != want || answer.CallID == "" {
			t.Fatalf("HTTP %d %s; want 200 with the workspace's image %q", r.code, r.body, want)
		}
		calls := h.pub.calls()
		c := calls[len(calls)-1]
		var a workspace.Args
		if err := json.Unmarshal(c.Args, &a); err != nil || c.Tool != workspace.OpSetImage || c.Workspace != "ws" || a.Image != want {
			t.Fatalf("queued %s on %s with %s; want %s with image %q", c.Tool, c.Workspace, c.Args, workspace.OpSetImage, want)
		}
	}

	patch(map[string]any{"image": "docker.io/library/node:22"}).wantError(t, http.StatusForbidden, call.ErrPolicyDenied,
		`image "docker.io/library/node:22" refused by rule the operator's policy: images`, "(allowed: registry.example.com/tools/)")
	patch(map[string]any{"image": "Not::A/ref"}).wantError(t, http.StatusUnprocessableEntity, call.ErrInvalidParams, `"image"`, "does not parse")
	patch(map[string]any{}).wantError(t, http.StatusBadRequest, call.ErrInvalidRequest, "names no image", `{"image": "registry/repository:tag"}`)
	patch(map[string]any{"image": img, "git": map[string]string{"url": "https://git.example.com/r.git"}}).
		wantError(t, http.StatusBadRequest, call.ErrInvalidRequest, `unknown field "git"`)
	h.do(http.MethodPatch, "/v1/workspaces/ws", acmeCaller, img).wantError(t, http.StatusUnsupportedMediaType, call.ErrInvalidRequest, "Content-Type: application/json")
	h.do(http.MethodPatch, "/v1/workspaces/-bad", acmeCaller, map[string]any{"image": img}, "Content-Type", "application/json").
		wantError(t, http.StatusBadRequest, call.ErrInvalidRequest, "workspace")
	if n := len(h.pub.calls()); n != 0 {
		t.Fatalf("%d refused changes were queued", n)
	}

	changed(patch(map[string]any{"image": img}), img)
	changed(patch(map[string]any{"image": ""}), "")
}
