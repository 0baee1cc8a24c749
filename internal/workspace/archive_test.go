package workspace

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// tent is one entry of a test tar.
type tent struct {
	name string
	typ  byte
	mode int64
	body string
	link string
	size int64 // overrides len(body) in the header (a lying header)
}

func file(name, body string) tent { return tent{name: name, typ: tar.TypeReg, mode: 0o644, body: body} }
func dir(name string) tent        { return tent{name: name, typ: tar.TypeDir, mode: 0o755} }
func link(name, to string) tent   { return tent{name: name, typ: tar.TypeSymlink, mode: 0o777, link: to} }

func makeTar(t testing.TB, gz bool, ents ...tent) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, e := range ents {
		size := int64(len(e.body))
		if e.typ != tar.TypeReg {
			size = 0
		}
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Size: size, Linkname: e.link, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if e.typ == tar.TypeChar || e.typ == tar.TypeBlock {
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("write header %q: %v", e.name, err)
		}
		if size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

type zent struct {
	name string
	mode os.FileMode
	body string
}

func makeZip(t testing.TB, ents ...zent) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range ents {
		h := &zip.FileHeader{Name: e.name, Method: zip.Deflate}
		h.SetMode(e.mode)
		w, err := zw.CreateHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, e.body)
	}
	zw.Close()
	return buf.Bytes()
}

// gzipBomb is a tar.gz whose one file holds n zero bytes: small compressed, large extracted.
func gzipBomb(t testing.TB, n int64) []byte {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: n})
	io.CopyN(tw, zeroReader{}, n)
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func tempArchive(t testing.TB, data []byte) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "archive")
	if err != nil {
		t.Fatal(err)
	}
	f.Write(data)
	t.Cleanup(func() { f.Close() })
	return f
}

func newManager(t testing.TB, cfg Config) *Manager {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	cfg.UID, cfg.GID = 1000, 1000
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// listing is every path under dir with its type and contents, to compare trees.
func listing(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		s := rel + " " + fi.Mode().String()
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			s += " -> " + l
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			s += " " + string(b)
		}
		out = append(out, s)
		return nil
	})
	sort.Strings(out)
	return out
}

// TestHostileArchives: every hostile archive is refused with a message naming the problem, and leaves
// both an existing workspace (upload) and the tenant (create) exactly as they were.
func TestHostileArchives(t *testing.T) {
	bomb := gzipBomb(t, 64<<20)
	cases := []struct {
		name    string
		data    []byte
		typ     string
		message string
	}{
		{"absolute path", makeTar(t, false, file("ok", "x"), file("/etc/cron.d/evil", "x")), call.ErrInvalidParams, "absolute path"},
		{"dot-dot", makeTar(t, false, file("../escape", "x")), call.ErrInvalidParams, `".." component`},
		{"dot-dot inside", makeTar(t, true, file("a/../../escape", "x")), call.ErrInvalidParams, `".." component`},
		{"symlink to absolute", makeTar(t, false, link("etc", "/etc")), call.ErrInvalidParams, "absolute path"},
		{"symlink outside", makeTar(t, false, dir("a"), link("a/up", "../../..")), call.ErrInvalidParams, "outside the workspace"},
		{"written through symlink", makeTar(t, false, dir("real"), link("l", "real"), file("l/x", "x")), call.ErrInvalidParams, "written through the symlink"},
		{"written through symlink to outside dir", makeTar(t, false, link("l", "."), file("l/../x", "x")), call.ErrInvalidParams, `".." component`},
		{"symlink replaced by file", makeTar(t, false, link("l", "a"), file("l", "x")), call.ErrInvalidParams, "names \"l\" twice"},
		{"hard link", makeTar(t, false, file("a", "x"), tent{name: "b", typ: tar.TypeLink, link: "a"}), call.ErrInvalidParams, "hard link"},
		{"hard link outside", makeTar(t, false, tent{name: "shadow", typ: tar.TypeLink, link: "/etc/shadow"}), call.ErrInvalidParams, "hard link"},
		{"character device", makeTar(t, false, tent{name: "null", typ: tar.TypeChar, mode: 0o666}), call.ErrInvalidParams, "character device"},
		{"block device", makeTar(t, false, tent{name: "sda", typ: tar.TypeBlock, mode: 0o660}), call.ErrInvalidParams, "block device"},
		{"fifo", makeTar(t, false, tent{name: "pipe", typ: tar.TypeFifo, mode: 0o644}), call.ErrInvalidParams, "FIFO"},
		{"setuid", makeTar(t, false, tent{name: "sh", typ: tar.TypeReg, mode: 0o4755, body: "x"}), call.ErrInvalidParams, "setuid or setgid"},
		{"setgid dir", makeTar(t, false, tent{name: "d", typ: tar.TypeDir, mode: 0o2755}), call.ErrInvalidParams, "setuid or setgid"},
		{"invalid utf-8", makeTar(t, false, file("bad\xff", "x")), call.ErrInvalidParams, "not valid UTF-8"},
		{"control character", makeTar(t, false, file("bad\nname", "x")), call.ErrInvalidParams, "character"},
		{"backslash", makeTar(t, false, file(`..\..\evil`, "x")), call.ErrInvalidParams, "character"},
		{"empty component", makeTar(t, false, file("a//b", "x")), call.ErrInvalidParams, "not a clean path"},
		{"case collision", makeTar(t, false, file("README", "a"), file("readme", "b")), call.ErrInvalidParams, "differ only in case"},
		{"case collision of directories", makeTar(t, false, file("Src/a", "a"), file("src/b", "b")), call.ErrInvalidParams, "differ only in case"},
		{"duplicate", makeTar(t, false, file("a", "1"), file("a", "2")), call.ErrInvalidParams, "twice"},
		{"file under file", makeTar(t, false, file("a", "1"), file("a/b", "2")), call.ErrInvalidParams, "makes a file"},
		{"too many files", makeTar(t, false, file("1", ""), file("2", ""), file("3", ""), file("4", ""), file("5", "")), TypeTooLarge, "more than 4 entries"},
		{"too many bytes", makeTar(t, false, file("big", strings.Repeat("x", 2048))), TypeTooLarge, "more than 1.0 KiB"},
		{"gzip bomb", bomb, TypeTooLarge, "more than 1.0 KiB"},
		{"not an archive", []byte("just some text, not an archive at all"), call.ErrInvalidParams, "not a tar, tar.gz or zip"},
		{"truncated gzip", makeTar(t, true, file("a", strings.Repeat("x", 100)))[:40], call.ErrInvalidParams, "malformed"},
		{"zip dot-dot", makeZip(t, zent{"../../evil", 0o644, "x"}), call.ErrInvalidParams, `".." component`},
		{"zip absolute", makeZip(t, zent{"/abs", 0o644, "x"}), call.ErrInvalidParams, "absolute path"},
		{"zip symlink outside", makeZip(t, zent{"l", os.ModeSymlink | 0o777, "../../outside"}), call.ErrInvalidParams, "outside the workspace"},
		{"zip symlink written through", makeZip(t, zent{"d/", os.ModeDir | 0o755, ""}, zent{"l", os.ModeSymlink | 0o777, "d"}, zent{"l/x", 0o644, "x"}), call.ErrInvalidParams, "written through"},
		{"zip setuid", makeZip(t, zent{"sh", os.ModeSetuid | 0o755, "x"}), call.ErrInvalidParams, "setuid"},
		{"zip fifo", makeZip(t, zent{"p", os.ModeNamedPipe | 0o644, ""}), call.ErrInvalidParams, "FIFO"},
		{"zip case collision", makeZip(t, zent{"A.txt", 0o644, "x"}, zent{"a.TXT", 0o644, "y"}), call.ErrInvalidParams, "differ only in case"},
	}
	ctx := context.Background()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := newManager(t, Config{Archive: Limits{Files: 4, Bytes: 1024}})
			if _, err := m.Create(ctx, "t1", "ws", tempArchive(t, makeTar(t, false, file("keep", "kept"), link("inside", "keep")))); err != nil {
				t.Fatal(err)
			}
			before := listing(t, m.cfg.Dir)
			for _, op := range []string{"upload", "create"} {
				var err error
				if op == "upload" {
					_, err = m.Upload(ctx, "t1", "ws", "sub", tempArchive(t, tc.data))
				} else {
					_, err = m.Create(ctx, "t1", "fresh", tempArchive(t, tc.data))
				}
				var we *Error
				if !errors.As(err, &we) || we.Type != tc.typ || !strings.Contains(we.Msg, tc.message) {
					t.Fatalf("%s: got %v (%T), want a %s refusal saying %q", op, err, err, tc.typ, tc.message)
				}
				if after := listing(t, m.cfg.Dir); strings.Join(after, "\n") != strings.Join(before, "\n") {
					t.Fatalf("%s: a refused archive changed the workspaces dir:\nbefore %q\nafter  %q", op, before, after)
				}
			}
		})
	}
}

// TestUploadRefusesWorkspaceLinks: an archive that would write through a symlink already in the workspace
// (which a call could have planted) is refused with nothing written.
func TestUploadRefusesWorkspaceLinks(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Config{})
	outside := t.TempDir()
	if _, err := m.Create(ctx, "t1", "ws", nil); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(m.cfg.Dir, "t1", "ws")
	os.Symlink(outside, filepath.Join(ws, "planted"))
	os.WriteFile(filepath.Join(ws, "afile"), []byte("x"), 0o644)
	before := listing(t, m.cfg.Dir)
	for name, c := range map[string]struct {
		dest string
		data []byte
	}{
		"entry through planted link":   {"", makeTar(t, false, file("ok", "x"), file("planted/evil", "x"))},
		"directory over planted link":  {"", makeTar(t, false, dir("planted"))},
		"destination is a link":        {"planted", makeTar(t, false, file("evil", "x"))},
		"destination under a link":     {"planted/deeper", makeTar(t, false, file("evil", "x"))},
		"entry under a workspace file": {"", makeTar(t, false, file("afile/x", "x"))},
		"destination with dot-dot":     {"../t2", makeTar(t, false, file("evil", "x"))},
	} {
		_, err := m.Upload(ctx, "t1", "ws", c.dest, tempArchive(t, c.data))
		var we *Error
		if !errors.As(err, &we) || we.Type != call.ErrInvalidParams {
			t.Errorf("%s: got %v, want a refusal", name, err)
		}
	}
	if after := listing(t, m.cfg.Dir); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatalf("a refused archive changed the workspace:\nbefore %q\nafter  %q", before, after)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("something was written outside the workspace: %v", ents)
	}
	// A file entry over the planted link replaces the link, never writes through it.
	if _, err := m.Upload(ctx, "t1", "ws", "", tempArchive(t, makeTar(t, false, file("planted", "now a file")))); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "planted")); err != nil || string(b) != "now a file" {
		t.Fatalf("planted = %q, %v", b, err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("something was written outside the workspace: %v", ents)
	}
}

// TestEmptyTar: an empty tar (tar -cf x.tar -T /dev/null: only its zero end blocks, no "ustar" magic to
// sniff) seeds an empty workspace rather than being refused as "not a tar".
func TestEmptyTar(t *testing.T) {
	m := newManager(t, Config{})
	inf, err := m.Create(context.Background(), "t1", "ws", tempArchive(t, make([]byte, 10240)))
	if err != nil || inf.Files != 0 {
		t.Fatalf("Create from an empty tar: %+v, %v", inf, err)
	}
	_, err = m.Create(context.Background(), "t1", "ws2", tempArchive(t, make([]byte, 100)))
	wantErr(t, err, call.ErrInvalidParams, "not a tar, tar.gz or zip")
}

// TestExtract: a good archive lands whole, owned by the sandbox user, with modes, links and the archive's
// own "./" prefix handled; zip too.
func TestExtract(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Config{})
	data := makeTar(t, true, dir("./"), dir("./src"), file("./src/main.go", "package main\n"),
		tent{name: "./run.sh", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\n"}, link("./main", "src/main.go"), file("deep/er/x", "x"))
	inf, err := m.Create(ctx, "t1", "ws", tempArchive(t, data))
	if err != nil {
		t.Fatal(err)
	}
	if inf.Files != 4 || inf.Name != "ws" || inf.CreatedAt.IsZero() {
		t.Fatalf("info = %+v", inf)
	}
	ws := filepath.Join(m.cfg.Dir, "t1", "ws")
	want := []string{". drwxr-xr-x", "deep drwxr-xr-x", "deep/er drwxr-xr-x", "deep/er/x -rw-r--r-- x", "main Lrwxrwxrwx -> src/main.go",
		"run.sh -rwxr-xr-x #!/bin/sh\n", "src drwxr-xr-x", "src/main.go -rw-r--r-- package main\n"}
	if got := listing(t, ws); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("tree:\n%q\nwant\n%q", got, want)
	}
	if os.Geteuid() == 0 {
		filepath.Walk(ws, func(p string, fi os.FileInfo, err error) error {
			var st os.FileInfo
			st, _ = os.Lstat(p)
			if uid := st.Sys().(interface{}).(*syscallStat); uid != nil && (uid.Uid != 1000 || uid.Gid != 1000) {
				t.Errorf("%s is owned by %d:%d, not the sandbox user 1000:1000", p, uid.Uid, uid.Gid)
			}
			return nil
		})
	}
	z := makeZip(t, zent{"docs/", os.ModeDir | 0o755, ""}, zent{"docs/a.md", 0o644, "# a"}, zent{"l", os.ModeSymlink | 0o777, "docs/a.md"})
	if _, err := m.Upload(ctx, "t1", "ws", "/workspace/up", tempArchive(t, z)); err != nil {
		t.Fatal(err)
	}
	if l, err := os.Readlink(filepath.Join(ws, "up/l")); err != nil || l != "docs/a.md" {
		t.Fatalf("zip link = %q, %v", l, err)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "up/docs/a.md")); string(b) != "# a" {
		t.Fatalf("zip file = %q", b)
	}
}
