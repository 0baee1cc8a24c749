package e2e

import (
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// TestImageRootedWorker: an OCI image imported with `worker import-image` replaces the host's read-only
// view as every call's root. The image here has no shell at all: file tools still work (the runner is
// mounted in), and run_shell fails because the image has no /bin/sh, which proves the root is the image's.
func TestImageRootedWorker(t *testing.T) {
	s := startStackWith(t, stackOptions{policy: permissivePolicy})
	const name = "docker.io/toolpool/bare:test"
	tarball := filepath.Join(t.TempDir(), "bare.tar")
	ctrtest.WriteImageTar(t, tarball, name, []ctrtest.ImageFile{
		{Path: "tmp", Mode: 0o1777}, {Path: "workspace", Mode: 0o755}, {Path: ".toolpool", Mode: 0o755},
		{Path: "proc", Mode: 0o755}, {Path: "dev", Mode: 0o755}, {Path: "sys", Mode: 0o755}, {Path: "etc", Mode: 0o755},
		{Path: "etc/image-marker", Mode: 0o644, Data: []byte("from the image\n")},
	})
	out, err := exec.Command(filepath.Join(binaries(t), "worker"), "import-image", "--data-dir", filepath.Join(s.dataDir, "w"), "--file", tarball).CombinedOutput()
	if err != nil || !strings.Contains(string(out), name) {
		t.Fatalf("worker import-image: %v\n%s", err, out)
	}
	s.worker.stop(t)
	s.opts.workerConfig = "image: " + name + "\n"
	s.startWorker(t)

	w := s.do(t, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": "write_file", "workspace": "img",
		"args": map[string]any{"path": "a.txt", "content": "in the image\n"}}).result(t)
	l := s.do(t, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": "list_files", "workspace": "img",
		"args": map[string]any{"path": "."}}).result(t)
	if w.Status != call.StatusOK || l.Status != call.StatusOK || !strings.Contains(l.Output, "a.txt") {
		t.Fatalf("file tools in the image: %s %q / %s %q", w.Status, w.Output, l.Status, l.Output)
	}
	sh := s.shell(t, "dev-token", "img", "echo host shell", nil).result(t)
	if sh.Status != call.StatusError || sh.Error.Type != call.ErrNotFound || !strings.Contains(sh.Output, "/bin/sh") {
		t.Fatalf("run_shell found a shell in a shell-less image: %s %q", sh.Status, sh.Output)
	}
}
