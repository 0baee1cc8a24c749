package dispatcher

import (
	"net/http"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/policy"
)

// TestCallImage: a call's image is the request's when policy's images.allow admits it (403 with the rule
// and the allowed patterns otherwise, 422 for a reference that does not parse), else the tenant's
// default, else none.
func TestCallImage(t *testing.T) {
	images, err := policy.Parse([]byte("version: 1\ndefault_action: allow\nimages: {allow: [registry.example.com/tools/]}\n"), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	post := func(h *harness, image string) reply {
		body := map[string]any{"tool": "run_shell", "args": map[string]string{"command": "python3 -V"}, "wait": false}
		if image != "" {
			body["image"] = image
		}
		return h.do(http.MethodPost, "/v1/calls", acmeCaller, body)
	}
	t.Run("an allowed image is carried as asked", func(t *testing.T) {
		h := newHarness(t, setup{config: func(c *Config) { c.Tenants[0].Image = "registry.example.com/base:1" }})
		h.pol.images = images
		if r := post(h, "registry.example.com/tools/python:3.12"); r.code != http.StatusAccepted {
			t.Fatalf("HTTP %d: %s", r.code, r.body)
		}
		if got := h.pub.calls()[0].Image; got != "registry.example.com/tools/python:3.12" {
			t.Errorf("published image %q", got)
		}
	})
	t.Run("the tenant's default when the call asks for none", func(t *testing.T) {
		h := newHarness(t, setup{config: func(c *Config) { c.Tenants[0].Image = "registry.example.com/base:1" }})
		if r := post(h, ""); r.code != http.StatusAccepted {
			t.Fatalf("HTTP %d: %s", r.code, r.body)
		}
		// The worker runs it on the workspace's default image first, else on this one.
		if c := h.pub.calls()[0]; c.Image != "" || c.TenantImage != "registry.example.com/base:1" {
			t.Errorf("published image %q, tenant image %q: want none, and the tenant's default", c.Image, c.TenantImage)
		}
	})
	t.Run("no image without a default", func(t *testing.T) {
		h := newHarness(t, setup{})
		if r := post(h, ""); r.code != http.StatusAccepted || h.pub.calls()[0].Image != "" {
			t.Fatalf("HTTP %d image %q: %s", r.code, h.pub.calls()[0].Image, r.body)
		}
	})
	t.Run("another image is refused with the rule and the patterns", func(t *testing.T) {
		h := newHarness(t, setup{})
		h.pol.images = images
		post(h, "docker.io/library/python:3.12").wantError(t, http.StatusForbidden, call.ErrPolicyDenied,
			"the operator's policy: images", "registry.example.com/tools/", "docker.io/library/python:3.12")
		if len(h.pub.calls()) != 0 {
			t.Error("a refused call was published")
		}
	})
	t.Run("no images section allows none", func(t *testing.T) {
		h := newHarness(t, setup{})
		post(h, "registry.example.com/tools/python:3.12").wantError(t, http.StatusForbidden, call.ErrPolicyDenied, "images.allow")
	})
	t.Run("an unparsable reference is 422", func(t *testing.T) {
		h := newHarness(t, setup{})
		h.pol.images = images
		post(h, "Not::A/ref").wantError(t, http.StatusUnprocessableEntity, call.ErrInvalidParams, `"image"`, "does not parse")
	})
	t.Run("a tenant's default image must parse", func(t *testing.T) {
		cfg := testConfig()
		cfg.Tenants[0].Image = "Bad::Ref"
		if err := cfg.Validate(); err == nil {
			t.Fatal("a tenant image that does not parse was accepted")
		}
	})
}
