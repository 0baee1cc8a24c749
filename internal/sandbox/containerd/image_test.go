package containerd_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox/containerd"
)

// imageFile is one file of a test image's single layer.
type imageFile struct {
	path string // relative, no leading slash
	mode int64  // tar mode bits, with 04000 for setuid
	data []byte // nil for a directory
}

// importTestImage builds an OCI image tarball of files (one layer, owned by root) and imports it into the
// containerd at address under name.
func importTestImage(t *testing.T, address, name string, files []imageFile) {
	t.Helper()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, f := range files {
		h := &tar.Header{Name: f.path, Mode: f.mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if f.data == nil {
			h.Typeflag, h.Name = tar.TypeDir, f.path+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if f.data != nil {
			if _, err := tw.Write(f.data); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	ow := tar.NewWriter(&out)
	add := func(name string, b []byte) {
		if err := ow.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := ow.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	blob := func(b []byte) map[string]any {
		sum := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(sum[:])
		add("blobs/sha256/"+hex.EncodeToString(sum[:]), b)
		return map[string]any{"digest": d, "size": len(b)}
	}
	mustJSON := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	layerDesc := blob(layer.Bytes())
	layerDesc["mediaType"] = "application/vnd.oci.image.layer.v1.tar"
	config := blob(mustJSON(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"rootfs": map[string]any{"type": "layers", "diff_ids": []any{layerDesc["digest"]}},
		"config": map[string]any{},
	}))
	config["mediaType"] = "application/vnd.oci.image.config.v1+json"
	manifest := blob(mustJSON(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": config, "layers": []any{layerDesc},
	}))
	manifest["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
	manifest["platform"] = map[string]any{"architecture": runtime.GOARCH, "os": "linux"}
	manifest["annotations"] = map[string]any{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": "latest"}
	add("index.json", mustJSON(map[string]any{"schemaVersion": 2, "manifests": []any{manifest}}))
	if err := ow.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
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
	importTestImage(t, address, name, []imageFile{
		{path: "bin", mode: 0o755}, {path: "tmp", mode: 0o1777}, {path: "workspace", mode: 0o755},
		{path: ".toolpool", mode: 0o755}, {path: "proc", mode: 0o755}, {path: "dev", mode: 0o755}, {path: "sys", mode: 0o755},
		{path: "bin/probe", mode: 0o755, data: probe},
		{path: "bin/probe-suid", mode: 0o4755, data: probe},
	})
	return name
}
