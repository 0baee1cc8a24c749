package ctrtest

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"runtime"
	"testing"
	"time"
)

// ImageFile is one file of a test image's single layer.
type ImageFile struct {
	Path string // relative, no leading slash
	Mode int64  // tar mode bits, with 04000 for setuid
	Data []byte // nil for a directory
}

// WriteImageTar writes an OCI image layout tarball to path: one layer of files, owned by root, for this
// machine's architecture, named name.
func WriteImageTar(t testing.TB, path, name string, files []ImageFile) {
	t.Helper()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, f := range files {
		h := &tar.Header{Name: f.Path, Mode: f.Mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if f.Data == nil {
			h.Typeflag, h.Name = tar.TypeDir, f.Path+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if f.Data != nil {
			if _, err := tw.Write(f.Data); err != nil {
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
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
