package ctrtest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The toolchain images the tests push: both are the base layer (a root with /bin/sh, the C library and
// the mount points the runtime uses) and one layer of this host's own programs, copied with the libraries
// ldd names. Nothing is pulled from a public registry and no Docker engine is involved.
var (
	// ShellPrograms are the programs of the shell image's second layer; it has no python.
	ShellPrograms = []string{"/usr/bin/cat", "/usr/bin/ls", "/usr/bin/id", "/usr/bin/env", "/usr/bin/touch", "/usr/bin/stat"}
)

// EscapePrograms are the programs of the escape image's second layer: everything the escape suite
// (TestEscape) runs besides /bin/sh and its probe, which the suite mounts in.
var EscapePrograms = []string{
	"/usr/bin/awk", "/usr/bin/cat", "/usr/bin/cut", "/usr/bin/date", "/usr/bin/env", "/usr/bin/grep",
	"/usr/bin/head", "/usr/bin/id", "/usr/bin/ln", "/usr/bin/ls", "/usr/bin/mkdir", "/usr/bin/nohup",
	"/usr/bin/readlink", "/usr/bin/rm", "/usr/bin/setsid", "/usr/bin/sleep", "/usr/bin/sort", "/usr/bin/stat",
	"/usr/bin/tail", "/usr/bin/touch", "/usr/bin/tr", "/usr/bin/wc",
}

// ImageMarkEnv is a variable each toolchain image's config sets to the image's name ("shell", "python"),
// so that a test can tell that the image's ENV reached the call.
const ImageMarkEnv = "TOOLPOOL_IMAGE_MARK"

// hostileConfig is the config both toolchain images carry: every field the runtime must ignore is set to
// something that would hurt (root user, an entrypoint that fails, a working directory outside the
// workspace, a volume, a stop signal), and the environment marks the image.
func hostileConfig(mark string) v1.Config {
	return v1.Config{
		User:       "0:0",
		Entrypoint: []string{"/bin/false"},
		Cmd:        []string{"--never"},
		WorkingDir: "/etc",
		Volumes:    map[string]struct{}{"/data": {}},
		StopSignal: "SIGKILL",
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			ImageMarkEnv + "=" + mark,
			"HOME=/root",
			"HTTPS_PROXY=http://attacker.invalid:1",
		},
	}
}

var layers struct {
	once                sync.Once
	base, shell, python []byte
	err                 error
}

// toolchainLayers builds the three layers once per test binary: reading the host's files takes about a
// second, and every test after the first gets them from memory.
func toolchainLayers(t testing.TB) (base, shell, python []byte) {
	t.Helper()
	layers.once.Do(func() {
		layers.base, layers.err = buildLayer(func(b *layerBuilder) error {
			for _, d := range []string{"tmp", "workspace", ".toolpool", "proc", "dev", "sys", "etc", "root"} {
				b.dir(d, 0o755)
			}
			b.dir("tmp", 0o1777)
			b.dir("var/scratch", 0o777) // writable by all in the image: a test finds the root read-only there
			return b.programs("/bin/sh")
		})
		if layers.err != nil {
			return
		}
		layers.shell, layers.err = buildLayer(func(b *layerBuilder) error { return b.programs(ShellPrograms...) })
		if layers.err != nil {
			return
		}
		layers.python, layers.err = buildLayer(func(b *layerBuilder) error {
			// Debian's python3 is a link to python3.X, whose standard library is /usr/lib/python3.X.
			real, err := filepath.EvalSymlinks("/usr/bin/python3")
			if err != nil {
				return fmt.Errorf("find python3 (apt-get install python3): %w", err)
			}
			if err := b.programs(real); err != nil {
				return err
			}
			if err := b.symlink("/usr/bin/python3", filepath.Base(real)); err != nil {
				return err
			}
			return b.tree(filepath.Join("/usr/lib", filepath.Base(real)), pythonSkip)
		})
	})
	if layers.err != nil {
		t.Fatalf("build test image layers from this host's files: %v", layers.err)
	}
	return layers.base, layers.shell, layers.python
}

// pythonSkip leaves out the parts of the standard library no test uses, to keep the layer small.
func pythonSkip(rel string) bool {
	switch path.Base(rel) {
	case "test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "__pycache__",
		"site-packages", "dist-packages":
		return true
	}
	return strings.HasPrefix(path.Base(rel), "config-3")
}

// PushShellImage pushes the shell image (sh, cat, ls, id, env, touch, stat; no python) to reg as
// repo:tag and returns its reference.
func PushShellImage(t testing.TB, reg *Registry, repoTag string) string {
	t.Helper()
	base, shell, _ := toolchainLayers(t)
	return PushImage(t, reg, repoTag, hostileConfig("shell"), base, shell)
}

// PushEscapeImage pushes the escape image to reg as repo:tag and returns its reference: the toolchain
// images' base layer, then this host's EscapePrograms with their libraries and an /etc/passwd and
// /etc/group naming the sandbox user, with the toolchain images' hostile config. The escape suite runs in
// it with TOOLPOOL_TEST_IMAGE=1.
func PushEscapeImage(t testing.TB, reg *Registry, repoTag string) string {
	t.Helper()
	base, _, _ := toolchainLayers(t)
	tools, err := buildLayer(func(b *layerBuilder) error {
		if err := b.data("etc/passwd", 0o644, fmt.Sprintf("root:x:0:0:root:/root:/bin/sh\nsandbox:x:%d:%d:sandbox:/tmp:/bin/sh\n", SandboxUID, SandboxGID)); err != nil {
			return err
		}
		if err := b.data("etc/group", 0o644, fmt.Sprintf("root:x:0:\nsandbox:x:%d:\n", SandboxGID)); err != nil {
			return err
		}
		return b.programs(EscapePrograms...)
	})
	if err != nil {
		t.Fatalf("build the escape image's layer from this host's files: %v", err)
	}
	return PushImage(t, reg, repoTag, hostileConfig("escape"), base, tools)
}

// PushPythonImage pushes the python image (sh and this host's python3 with its standard library) to reg
// as repo:tag and returns its reference. Its first layer is the shell image's, so the two share it.
func PushPythonImage(t testing.TB, reg *Registry, repoTag string) string {
	t.Helper()
	base, _, python := toolchainLayers(t)
	return PushImage(t, reg, repoTag, hostileConfig("python"), base, python)
}

// PushImage pushes an image of the given uncompressed layer tarballs and config to reg as repo:tag (with
// the registry's credentials) and returns its reference, reg.Host/repo:tag.
func PushImage(t testing.TB, reg *Registry, repoTag string, cfg v1.Config, layerTars ...[]byte) string {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, l := range layerTars {
		var err error
		if img, err = mutate.AppendLayers(img, static.NewLayer(l, types.OCIUncompressedLayer)); err != nil {
			t.Fatal(err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config = cfg
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/" + repoTag
	tag, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	auth := authn.Anonymous
	if reg.Username != "" {
		auth = &authn.Basic{Username: reg.Username, Password: reg.Password}
	}
	if err := remote.Write(tag, img, remote.WithAuth(auth)); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

// TarEntry is one entry of a hand-made layer (LayerTar): a test writes hostile ones with it.
type TarEntry struct {
	Name     string
	Type     byte // tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeChar, ...
	Mode     int64
	Linkname string
	Data     []byte
	Devmajor int64
	Devminor int64
}

// LayerTar returns an uncompressed layer tarball of entries, written as they are (no cleaning).
func LayerTar(t testing.TB, entries ...TarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Linkname: e.Linkname, Size: int64(len(e.Data)),
			Devmajor: e.Devmajor, Devminor: e.Devminor, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.Data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// ToolchainLayerBytes returns the sizes of the toolchain images' layers (base, shell's own, python's
// own), for tests of size limits and cache budgets.
func ToolchainLayerBytes(t testing.TB) (base, shell, python int64) {
	t.Helper()
	b, s, p := toolchainLayers(t)
	return int64(len(b)), int64(len(s)), int64(len(p))
}

// BaseLayer is the toolchain images' first layer (/bin/sh, the C library, the runtime's mount points),
// for a test that builds an image of its own on it.
func BaseLayer(t testing.TB) []byte {
	t.Helper()
	base, _, _ := toolchainLayers(t)
	return base
}

// layerBuilder writes host files into a layer tarball, each directory once.
type layerBuilder struct {
	tw   *tar.Writer
	seen map[string]bool
}

func buildLayer(fill func(*layerBuilder) error) ([]byte, error) {
	var buf bytes.Buffer
	b := &layerBuilder{tw: tar.NewWriter(&buf), seen: map[string]bool{}}
	// The host's merged-/usr links (/bin -> usr/bin) come first, so that paths through them land in /usr.
	for _, d := range []string{"bin", "sbin", "lib", "lib64"} {
		if target, err := os.Readlink("/" + d); err == nil {
			if err := b.symlink("/"+d, target); err != nil {
				return nil, err
			}
		}
	}
	if err := fill(b); err != nil {
		return nil, err
	}
	if err := b.tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (b *layerBuilder) header(h *tar.Header) error {
	h.ModTime, h.Format = time.Unix(0, 0), tar.FormatPAX
	return b.tw.WriteHeader(h)
}

// dir adds directory rel (and its parents) with mode; a directory already added keeps its first mode,
// except that an explicit second call rewrites it.
func (b *layerBuilder) dir(rel string, mode int64) {
	rel = strings.Trim(rel, "/")
	if rel == "" {
		return
	}
	if parent := path.Dir(rel); parent != "." {
		b.parents(parent)
	}
	b.seen[rel] = true
	_ = b.header(&tar.Header{Name: rel + "/", Typeflag: tar.TypeDir, Mode: mode})
}

func (b *layerBuilder) parents(rel string) {
	if rel == "." || rel == "" || b.seen[rel] {
		return
	}
	b.parents(path.Dir(rel))
	b.seen[rel] = true
	_ = b.header(&tar.Header{Name: rel + "/", Typeflag: tar.TypeDir, Mode: 0o755})
}

// data adds a regular file rel holding text.
func (b *layerBuilder) data(rel string, mode int64, text string) error {
	b.parents(path.Dir(rel))
	b.seen[rel] = true
	if err := b.header(&tar.Header{Name: rel, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(text))}); err != nil {
		return err
	}
	_, err := io.WriteString(b.tw, text)
	return err
}

func (b *layerBuilder) symlink(abs, target string) error {
	rel := strings.TrimPrefix(abs, "/")
	if b.seen[rel] {
		return nil
	}
	b.parents(path.Dir(rel))
	b.seen[rel] = true
	return b.header(&tar.Header{Name: rel, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777})
}

// file adds the host file at abs as a regular file at its real path, and a link at abs when abs is a
// symlink, so that both names work in the image.
func (b *layerBuilder) file(abs string) error {
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return err
	}
	if err := b.regular(real); err != nil {
		return err
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return err
	}
	if link := filepath.Join(dir, filepath.Base(abs)); link != real {
		return b.symlink(link, real)
	}
	return nil
}

func (b *layerBuilder) regular(abs string) error {
	rel := strings.TrimPrefix(abs, "/")
	if b.seen[rel] {
		return nil
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return err
	}
	b.parents(path.Dir(rel))
	b.seen[rel] = true
	f, err := os.Open(abs)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := b.header(&tar.Header{Name: rel, Typeflag: tar.TypeReg, Mode: int64(fi.Mode().Perm()), Size: fi.Size()}); err != nil {
		return err
	}
	_, err = io.Copy(b.tw, f)
	return err
}

var lddPath = regexp.MustCompile(`(?m)(?:=> )?(/\S+) \(0x`)

// programs adds each program and the shared libraries ldd says it loads.
func (b *layerBuilder) programs(progs ...string) error {
	for _, p := range progs {
		if err := b.file(p); err != nil {
			return err
		}
		out, err := exec.Command("ldd", p).Output()
		if err != nil {
			continue // static
		}
		for _, m := range lddPath.FindAllStringSubmatch(string(out), -1) {
			if err := b.file(m[1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// tree adds the host directory root and everything beneath it that skip does not leave out.
func (b *layerBuilder) tree(root string, skip func(rel string) bool) error {
	return filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if p != root && skip(p) {
			if fi.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case fi.IsDir():
			b.dir(p, int64(fi.Mode().Perm()))
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return b.symlink(p, target)
		case fi.Mode().IsRegular():
			return b.regular(p)
		}
		return nil
	})
}

func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }
