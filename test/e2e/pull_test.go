package e2e

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// TestCallsOnPulledImages: calls name images in a private registry; the worker pulls them with the
// credentials of its config, each call sees its image's toolchain and the shared workspace, the result
// names the image by digest, a workspace created with an image runs its calls on it unless they ask for
// another, policy refuses an image it does not list (403), and a pull that fails or an
// image with a hostile layer ends the call with image_pull_failed or image_refused. The worker pulls its
// pinned image (from a second registry) when it starts, before any call names it, and keeps a container
// of it warm: the first call on it runs warm, with that registry gone.
func TestCallsOnPulledImages(t *testing.T) {
	ctrtest.Require(t)
	const password = "pull-s3cret-e2e"
	reg := ctrtest.StartPrivateRegistry(t, "puller", password)
	shellImage := ctrtest.PushShellImage(t, reg, "tools/shell:1")
	pythonImage := ctrtest.PushPythonImage(t, reg, "tools/python:3.11")
	hostile := ctrtest.PushImage(t, reg, "tools/hostile:1", v1.Config{}, ctrtest.BaseLayer(t),
		ctrtest.LayerTar(t, ctrtest.TarEntry{Name: "dev/kmem", Type: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 2}))
	pinReg := ctrtest.StartRegistry(t)
	pinned := ctrtest.PushShellImage(t, pinReg, "tools/pinned:1")
	s := startStackWith(t, stackOptions{
		policy: permissivePolicy + "builtin_asks: {redirect-write: allow, unresolved: allow}\nimages:\n  allow: [" + reg.Host + "/tools/, " + pinReg.Host + "/tools/]\n",
		workerConfig: fmt.Sprintf("images:\n  pinned: [%q]\n  registries:\n    - {host: %q, username: puller, password: %s, plain_http: true}\n    - {host: %q, plain_http: true}\n",
			pinned, reg.Host, password, pinReg.Host),
	})
	run := func(image, command string) (*call.Result, string) {
		t.Helper()
		r := s.shell(t, "dev-token", "img", command, map[string]any{"image": image})
		if strings.Contains(string(r.body), password) {
			t.Errorf("a result shows the registry password: %s", r.body)
		}
		return r.result(t), string(r.body)
	}

	// The pinned image, pulled when the worker started: its first call runs warm without its registry.
	pulled := s.worker.WaitLog(t, "image pulled ahead", 2*time.Minute)
	t.Logf("the worker pulled its pinned image ahead: %v", pulled)
	runc := ctrtest.Runtime() == containerd.RuncRuntime // the pool holds runc containers only
	if pulled["image"] != pinned || runc && pulled["warm"] != true {
		t.Fatalf("pulled ahead: %v; want %s, warm", pulled, pinned)
	}
	pinReg.Close()
	onPinned := s.shell(t, "dev-token", "pinned", `echo "$TOOLPOOL_IMAGE_MARK"`, map[string]any{"image": pinned}).result(t)
	if onPinned.Status != call.StatusOK || onPinned.Stdout != "shell\n" || !strings.HasPrefix(onPinned.Image, pinReg.Host+"/tools/pinned@sha256:") {
		t.Fatalf("first call on the pinned image: %s %q %q image %q %+v", onPinned.Status, onPinned.Stdout, onPinned.Stderr, onPinned.Image, onPinned.Error)
	}
	if runc && !onPinned.Timing.Warm {
		t.Errorf("the first call on the pinned image ran cold: timing %+v", onPinned.Timing)
	}

	// The first call pulls its image: its event stream shows the pull's progress as status events.
	var sh *call.Result
	var pulls []call.PullProgress
	body := map[string]any{"tool": "run_shell", "workspace": "img", "image": shellImage,
		"args": map[string]any{"command": `echo "$TOOLPOOL_IMAGE_MARK $(id -u)" > from-shell; cat from-shell; command -v python3 || echo no python`}}
	events(t, s.request(t, http.MethodPost, "/v1/calls", "dev-token", body), func(ev sseEvent) bool {
		switch ev.name {
		case "status":
			var st struct {
				Pull *call.PullProgress `json:"pull"`
			}
			if err := json.Unmarshal(ev.data, &st); err != nil {
				t.Fatalf("status event %s: %v", ev.data, err)
			}
			if st.Pull != nil {
				pulls = append(pulls, *st.Pull)
			}
		case "result":
			sh = new(call.Result)
			if err := json.Unmarshal(ev.data, sh); err != nil {
				t.Fatalf("result event %s: %v", ev.data, err)
			}
			return false
		}
		return true
	})
	t.Logf("pull reports on the event stream: %+v", pulls)
	if sh == nil {
		t.Fatal("the event stream ended without the result")
	}
	if len(pulls) == 0 {
		t.Fatal("the first call on an image showed no pull on its event stream")
	}
	if last := pulls[len(pulls)-1]; last.Phase != "done" || last.BytesTotal == 0 || last.BytesDone != last.BytesTotal || !strings.HasPrefix(last.Image, reg.Host+"/tools/shell:") {
		t.Errorf("last pull report %+v: want done, with the image's bytes", last)
	}
	if sh.Status != call.StatusOK || sh.Stdout != "shell 65532\nno python\n" || !strings.HasPrefix(sh.Image, reg.Host+"/tools/shell@sha256:") {
		t.Fatalf("shell image: %s %q %q image %q %+v", sh.Status, sh.Stdout, sh.Stderr, sh.Image, sh.Error)
	}
	py, _ := run(pythonImage, `python3 -c 'import sys; print(open("from-shell").read().split()[0], sys.version_info.major)'`)
	if py.Status != call.StatusOK || py.Stdout != "shell 3\n" || !strings.HasPrefix(py.Image, reg.Host+"/tools/python@sha256:") {
		t.Fatalf("python image: %s %q %q image %q %+v", py.Status, py.Stdout, py.Stderr, py.Image, py.Error)
	}
	host := s.shell(t, "dev-token", "img", "cat from-shell", nil).result(t)
	if host.Status != call.StatusOK || host.Image != "" || host.Stdout != "shell 65532\n" {
		t.Fatalf("host view: %s %q image %q", host.Status, host.Stdout, host.Image)
	}

	// A workspace's default image: its calls run on it unless they ask for another; the workspace is
	// still shared with calls on other images.
	put, _ := s.send(t, http.MethodPut, "/v1/workspaces/pyws", "dev-token", map[string]any{"image": pythonImage}, map[string]string{"Content-Type": "application/json"})
	if inf := wsInfo(t, put); put.code != http.StatusCreated || inf.Image != pythonImage {
		t.Fatalf("create a workspace with an image: HTTP %d %s", put.code, put.body)
	}
	onDefault := s.shell(t, "dev-token", "pyws", `python3 -c 'open("out", "w").write("py %d\n" % (6*7)); print(open("out").read(), end="")'`, nil).result(t)
	if onDefault.Status != call.StatusOK || onDefault.Stdout != "py 42\n" || !strings.HasPrefix(onDefault.Image, reg.Host+"/tools/python@sha256:") {
		t.Fatalf("a call in the workspace without an image: %s %q %q image %q %+v", onDefault.Status, onDefault.Stdout, onDefault.Stderr, onDefault.Image, onDefault.Error)
	}
	if own := s.shell(t, "dev-token", "pyws", "cat out; command -v python3 || echo no python", map[string]any{"image": shellImage}).result(t); own.Status != call.StatusOK ||
		own.Stdout != "py 42\nno python\n" || !strings.HasPrefix(own.Image, reg.Host+"/tools/shell@sha256:") {
		t.Fatalf("a call's own image over its workspace's: %s %q image %q", own.Status, own.Stdout, own.Image)
	}
	// Changing the workspace's image: its next calls run on the new one, with its files; "" removes it.
	patchImage := func(image string) response {
		r, _ := s.send(t, http.MethodPatch, "/v1/workspaces/pyws", "dev-token", map[string]any{"image": image}, map[string]string{"Content-Type": "application/json"})
		return r
	}
	if r := patchImage(shellImage); r.code != http.StatusOK || wsInfo(t, r).Image != shellImage {
		t.Fatalf("change the workspace's image: HTTP %d %s", r.code, r.body)
	}
	if got, _ := s.send(t, http.MethodGet, "/v1/workspaces/pyws", "dev-token", nil, nil); wsInfo(t, got).Image != shellImage {
		t.Errorf("the workspace after the change: %s", got.body)
	}
	onNew := s.shell(t, "dev-token", "pyws", "cat out; command -v python3 || echo no python", nil).result(t)
	if onNew.Status != call.StatusOK || onNew.Stdout != "py 42\nno python\n" || !strings.HasPrefix(onNew.Image, reg.Host+"/tools/shell@sha256:") {
		t.Fatalf("a call after the image changed: %s %q image %q", onNew.Status, onNew.Stdout, onNew.Image)
	}
	if r := patchImage("docker.io/library/node:22"); r.code != http.StatusForbidden || r.errorInfo(t).Type != call.ErrPolicyDenied {
		t.Errorf("change to an image policy does not list: HTTP %d %s", r.code, r.body)
	}
	if r := patchImage(""); r.code != http.StatusOK || wsInfo(t, r).Image != "" {
		t.Fatalf("remove the workspace's image: HTTP %d %s", r.code, r.body)
	}
	if onHost := s.shell(t, "dev-token", "pyws", "cat out", nil).result(t); onHost.Status != call.StatusOK || onHost.Image != "" || onHost.Stdout != "py 42\n" {
		t.Fatalf("a call after the image was removed: %s %q image %q", onHost.Status, onHost.Stdout, onHost.Image)
	}
	refusedWS, _ := s.send(t, http.MethodPut, "/v1/workspaces/nodews", "dev-token", map[string]any{"image": "docker.io/library/node:22"}, map[string]string{"Content-Type": "application/json"})
	if e := refusedWS.errorInfo(t); refusedWS.code != http.StatusForbidden || e.Type != call.ErrPolicyDenied || !strings.Contains(e.Message, reg.Host+"/tools/") {
		t.Errorf("a workspace image policy does not list: HTTP %d %+v", refusedWS.code, e)
	}

	denied := s.shell(t, "dev-token", "img", "true", map[string]any{"image": "docker.io/library/python:3.12"})
	if e := denied.errorInfo(t); denied.code != http.StatusForbidden || e.Type != call.ErrPolicyDenied || !strings.Contains(e.Message, reg.Host+"/tools/") {
		t.Errorf("an image policy does not list: HTTP %d %+v", denied.code, e)
	}
	bad := s.shell(t, "dev-token", "img", "true", map[string]any{"image": "Not::A/ref"})
	if e := bad.errorInfo(t); bad.code != http.StatusUnprocessableEntity || e.Type != call.ErrInvalidParams {
		t.Errorf("an unparsable image: HTTP %d %+v", bad.code, e)
	}

	missing, _ := run(reg.Host+"/tools/missing:1", "true")
	if missing.Status != call.StatusError || missing.Error == nil || missing.Error.Type != call.ErrImagePullFailed || !strings.Contains(missing.Error.Message, "no such image") {
		t.Errorf("a missing image: %s %+v", missing.Status, missing.Error)
	}
	refused, _ := run(hostile, "true")
	if refused.Status != call.StatusError || refused.Error == nil || refused.Error.Type != call.ErrImageRefused || !strings.Contains(refused.Error.Message, "device node") {
		t.Errorf("a hostile image: %s %+v", refused.Status, refused.Error)
	}
}
