package containerd_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// importTestImage builds an OCI image tarball of files and imports it into the containerd at address
// under name.
func importTestImage(t *testing.T, address, name string, files []ctrtest.ImageFile) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "image.tar")
	ctrtest.WriteImageTar(t, path, name, files)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	names, err := containerd.ImportImage(ctx, address, "toolpool-test", path)
	if err != nil {
		t.Fatalf("import test image: %v", err)
	}
	if len(names) != 1 || names[0] != name {
		t.Fatalf("imported %v, want %s", names, name)
	}
}

// probeImage is an image holding only the probe, once plain and once setuid root, and the directories
// the runtime mounts over.
func probeImage(t *testing.T, address string) string {
	t.Helper()
	probe, err := os.ReadFile(buildProbe(t))
	if err != nil {
		t.Fatal(err)
	}
	const name = "docker.io/toolpool/probe:test"
	importTestImage(t, address, name, []ctrtest.ImageFile{
		{Path: "bin", Mode: 0o755}, {Path: "tmp", Mode: 0o1777}, {Path: "workspace", Mode: 0o755},
		{Path: ".toolpool", Mode: 0o755}, {Path: "proc", Mode: 0o755}, {Path: "dev", Mode: 0o755}, {Path: "sys", Mode: 0o755},
		{Path: "bin/probe", Mode: 0o755, Data: probe},
		{Path: "bin/probe-suid", Mode: 0o4755, Data: probe},
	})
	return name
}
