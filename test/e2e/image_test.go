package e2e

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// imageMarkerTool is a custom tool whose program exists only in the test image: it prints the image's
// marker file.
const imageMarkerTool = `
tools:
  custom:
    - name: read_image_marker
      description: Print /etc/image-marker of the call's root.
      kind: read
      schema: {type: object, additionalProperties: false}
      command: ["/bin/imgcat", "/etc/image-marker"]
`

// TestImageRootedWorker: an OCI image imported with ` + "`worker import-image`" + ` replaces the host's read-only
// view as every call's root. The image has no shell: file tools still work (the runner is mounted in),
// run_shell fails because the image has no /bin/sh, and a custom tool reads a file only the image holds.
func TestImageRootedWorker(t *testing.T) {
	s := startStackWith(t, stackOptions{policy: permissivePolicy, extraConfig: imageMarkerTool, workerConfig: imageMarkerTool})
	imgcat := filepath.Join(t.TempDir(), "imgcat")
	build := exec.Command("go", "build", "-trimpath", "-o", imgcat, "./testdata/imgcat")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build imgcat: %v\n%s", err, out)
	}
	imgcatBin, err := os.ReadFile(imgcat)
	if err != nil {
		t.Fatal(err)
	}
	const name = "docker.io/toolpool/bare:test"
	tarball := filepath.Join(t.TempDir(), "bare.tar")
	ctrtest.WriteImageTar(t, tarball, name, []ctrtest.ImageFile{
		{Path: "tmp", Mode: 0o1777}, {Path: "workspace", Mode: 0o755}, {Path: ".toolpool", Mode: 0o755},
		{Path: "proc", Mode: 0o755}, {Path: "dev", Mode: 0o755}, {Path: "sys", Mode: 0o755}, {Path: "etc", Mode: 0o755},
		{Path: "bin", Mode: 0o755}, {Path: "bin/imgcat", Mode: 0o755, Data: imgcatBin},
		{Path: "etc/image-marker", Mode: 0o644, Data: []byte("from the image\n")},
	})
	out, err := exec.Command(filepath.Join(binaries(t), "worker"), "import-image", "--data-dir", filepath.Join(s.dataDir, "w"), "--file", tarball).CombinedOutput()
	if err != nil || !strings.Contains(string(out), name) {
		t.Fatalf("worker import-image: %v\n%s", err, out)
	}
	s.worker.Stop(t)
	s.opts.workerConfig = imageMarkerTool + "image: " + name + "\n"
	s.startWorker(t)

	m := s.do(t, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": "read_image_marker", "workspace": "img", "args": map[string]any{}}).result(t)
	if m.Status != call.StatusOK || m.Stdout != "from the image\n" {
		t.Fatalf("the call's root is not the image's: %s %q %q", m.Status, m.Stdout, m.Stderr)
	}
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
