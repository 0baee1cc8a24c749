package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestTarDirFileGrownAfterTheWalk: a file that grew between the walk's stat and its archiving (a log
// being written, as `toolpool ws create repo --from .` met in a running checkout) goes in whole as it was
// when opened; the header took the walk's size and the copy failed with "archive/tar: write too long".
func TestTarDirFileGrownAfterTheWalk(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "app.log")
	if err := os.WriteFile(p, []byte("line 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	h, err := tar.FileInfoHeader(info, "")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("line 2\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := addFile(tw, p, h); err != nil {
		t.Fatalf("addFile of a grown file: %v", err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	got, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(tr)
	if err != nil || string(data) != "line 1\nline 2\n" || got.Size != int64(len(data)) {
		t.Fatalf("entry %d bytes %q (%v), want both lines", got.Size, data, err)
	}
}

// TestTarDirTree: a directory goes in with its directories, files and symlinks, relative, owned by
// nobody in particular; symlinks out of the directory are left out and said so (the workspace API
// refuses the whole archive for one: a checkout's containerd state under `make run` has them).
func TestTarDirTree(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "src", "pkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "src", "pkg", "a.go"), []byte("package pkg\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"link": "src/pkg/a.go", "src/pkg/up": "../../link",
		"abs": "/etc/passwd", "src/out": "../../x", "src/pkg/out": "../../../x",
	} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	var left []string
	if err := tarDir(dir, &buf, func(rel, why string) { left = append(left, rel) }); err != nil {
		t.Fatal(err)
	}
	slices.Sort(left)
	if want := []string{"abs", "src/out", "src/pkg/out"}; !slices.Equal(left, want) {
		t.Errorf("left out %v, want the links out of the directory %v", left, want)
	}
	zr, err := gzip.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		got[h.Name] = string(rune(h.Typeflag)) + ":" + h.Linkname + string(data)
		if h.Uid != 0 || h.Uname != "" {
			t.Errorf("%s owned by %d %q, want nobody in particular", h.Name, h.Uid, h.Uname)
		}
	}
	want := map[string]string{
		"link": "2:src/pkg/a.go", "src/pkg/up": "2:../../link", "src/": "5:", "src/pkg/": "5:", "src/pkg/a.go": "0:package pkg\n",
	}
	if len(got) != len(want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: %q, want %q", name, got[name], w)
		}
	}
}
