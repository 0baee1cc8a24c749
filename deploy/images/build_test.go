package main

import (
	"archive/tar"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// tree writes files (path -> content; a content starting with "->" is a symlink) under a new directory,
// in the order given, and sets every time to mtime.
func tree(t *testing.T, mtime time.Time, files [][2]string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range files {
		p := filepath.Join(dir, f[0])
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(f[1], "->"); ok {
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(f[1]), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func sum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}

func opts(out string, layers ...string) options {
	return options{name: "toolpool.local/test:dev", out: out, layers: layers, user: "65532:65532",
		entrypoint: []string{"/usr/local/bin/x"}, cmd: []string{"--flag"}, env: []string{"PATH=/usr/bin"},
		labels: map[string]string{"org.opencontainers.image.title": "x"}, expose: []string{"8080/tcp"}}
}

// The same tree gives the same digest and the same archive bytes, whatever the files' times and the order in
// which they were created; any change of content gives another digest.
func TestReproducible(t *testing.T) {
	files := [][2]string{{"usr/local/bin/x", "binary"}, {"etc/passwd", "root:x:0:0::/:/bin/sh\n"}, {"bin", "->usr/bin"}, {"usr/bin/sh", "shell"}}
	reversed := [][2]string{files[3], files[2], files[1], files[0]}
	a := tree(t, time.Unix(1_000_000, 0), files)
	b := tree(t, time.Now(), reversed)
	out := t.TempDir()

	d1 := mustBuild(t, opts(filepath.Join(out, "a.tar"), a))
	if d2 := mustBuild(t, opts(filepath.Join(out, "b.tar"), b)); d1 != d2 {
		t.Errorf("same tree, different digests: %s and %s", d1, d2)
	}
	if s1, s2 := sum(t, filepath.Join(out, "a.tar")), sum(t, filepath.Join(out, "b.tar")); s1 != s2 {
		t.Errorf("same tree, different archives: sha256 %s and %s", s1, s2)
	}

	if err := os.WriteFile(filepath.Join(b, "usr/local/bin/x"), []byte("binarY"), 0o755); err != nil {
		t.Fatal(err)
	}
	if d3 := mustBuild(t, opts(filepath.Join(out, "c.tar"), b)); d3 == d1 {
		t.Errorf("a changed file kept the digest %s", d1)
	}
	if err := os.Chmod(filepath.Join(a, "usr/local/bin/x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if d4 := mustBuild(t, opts(filepath.Join(out, "d.tar"), a)); d4 == d1 {
		t.Errorf("a changed mode kept the digest %s", d1)
	}
}

func mustBuild(t *testing.T, o options) string {
	t.Helper()
	digest, err := build(o)
	if err != nil {
		t.Fatal(err)
	}
	return digest
}

// The archive is an OCI layout whose one image has the digest build returned, the name given, the config
// given and the files given, as one layer per directory.
func TestArchiveIsAnOCILayout(t *testing.T) {
	base := tree(t, time.Now(), [][2]string{{"etc/passwd", "root"}, {"bin", "->usr/bin"}})
	top := tree(t, time.Now(), [][2]string{{"usr/local/bin/x", "binary"}})
	archive := filepath.Join(t.TempDir(), "img.tar")
	digest := mustBuild(t, opts(archive, base, top))
	dir := t.TempDir()
	untar(t, archive, dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest.String() != digest {
		t.Fatalf("index %+v, want one manifest %s", im.Manifests, digest)
	}
	if got := im.Manifests[0].Annotations["io.containerd.image.name"]; got != "toolpool.local/test:dev" {
		t.Errorf("io.containerd.image.name %q", got)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || cf.Config.Entrypoint[0] != "/usr/local/bin/x" || cf.Config.Cmd[0] != "--flag" ||
		cf.Config.Labels["org.opencontainers.image.title"] != "x" || !cf.Created.Time.Equal(time.Unix(0, 0)) || cf.OS != "linux" {
		t.Errorf("config %+v, created %v", cf.Config, cf.Created)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 2 {
		t.Fatalf("%d layers, want 2", len(layers))
	}
	rc, err := layers[1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s: mtime %v, want the epoch", h.Name, h.ModTime)
		}
	}
	if want := "usr/ usr/local/ usr/local/bin/ usr/local/bin/x"; strings.Join(names, " ") != want {
		t.Errorf("layer 2 holds %q, want %q", names, want)
	}
}

func TestBadInput(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		o    options
		want string
	}{
		{options{out: "x.tar", layers: []string{t.TempDir()}}, "-name is required"},
		{options{name: "n", layers: []string{t.TempDir()}}, "-o is required"},
		{options{name: "n", out: "x.tar"}, "at least one -layer"},
		{options{name: "n", out: "x.tar", layers: []string{"/nonexistent"}}, "-layer /nonexistent: stat"},
		{options{name: "n", out: "x.tar", layers: []string{file}}, "not a directory"},
		{options{name: "n", out: "x.tar", layers: []string{t.TempDir()}, env: []string{"NOVALUE"}}, `-env "NOVALUE": want KEY=VALUE`},
	} {
		_, err := build(c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.o, err, c.want)
		}
	}
	if _, err := keyValues("label", []string{"=v"}); err == nil || !strings.Contains(err.Error(), "want KEY=VALUE") {
		t.Errorf("label =v: %v", err)
	}
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
