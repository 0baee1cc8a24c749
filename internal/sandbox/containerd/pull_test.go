package containerd_test

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	ctdclient "github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// pullRuntime starts a private registry with basic auth, a private containerd and a runtime whose pull
// configuration holds the registry's credentials (the password in a file, with a newline).
func pullRuntime(t *testing.T, edit func(*containerd.PullConfig, *ctrtest.Registry)) (*containerd.Runtime, *containerd.Daemon, *ctrtest.Registry) {
	t.Helper()
	ctrtest.Require(t)
	reg := ctrtest.StartPrivateRegistry(t, "tenant-a", "s3cret")
	secret := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(secret, []byte("s3cret\n"), 0o600); err != nil { // as a mounted secret has it
		t.Fatal(err)
	}
	cfg := containerd.PullConfig{Registries: []containerd.RegistryConfig{{Host: reg.Host, Username: "tenant-a", PasswordFile: secret, PlainHTTP: true}}}
	if edit != nil {
		edit(&cfg, reg)
	}
	rt, d := ctrtest.NewRuntime(t, containerd.Config{Pull: cfg})
	return rt, d, reg
}

func imageCall(ref, ws string, argv ...string) sandbox.Spec {
	return sandbox.Spec{ID: newID("img"), Image: ref, Argv: argv, WorkspaceDir: ws, Limits: sandbox.Limits{Timeout: 30 * time.Second}}
}

// TestPulledImagesRunTheirOwnToolchain pulls two images from a private registry and runs a call in each:
// each sees its own toolchain, both share the workspace, the result names the image by digest, and the
// image's config (root user, entrypoint, working directory, HOME, a proxy) grants nothing.
func TestPulledImagesRunTheirOwnToolchain(t *testing.T) {
	rt, d, reg := pullRuntime(t, nil)
	shellRef := ctrtest.PushShellImage(t, reg, "tools/shell:1")
	pyRef := ctrtest.PushPythonImage(t, reg, "tools/python:3.11")
	ws := workspace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	out, err := rt.Run(ctx, imageCall(shellRef, ws, "/bin/sh", "-c",
		`echo "mark=$TOOLPOOL_IMAGE_MARK uid=$(id -u) pwd=$(pwd) home=$HOME proxy=${HTTPS_PROXY:-none}"; `+
			`test -e /usr/bin/python3 && echo has-python; touch /var/scratch/x 2>/dev/null && echo root-writable; echo shell > /workspace/from-shell`))
	if err != nil {
		t.Fatalf("run in shell image: %v", err)
	}
	if got, want := out.Stdout.String(), "mark=shell uid=65532 pwd=/workspace home=/tmp proxy=none\n"; got != want || out.ExitCode != 0 {
		t.Errorf("shell image: stdout %q (want %q), exit %d, stderr %q", got, want, out.ExitCode, out.Stderr.String())
	}
	if !strings.HasPrefix(out.Image, reg.Host+"/tools/shell@sha256:") {
		t.Errorf("outcome image %q, want %s/tools/shell@sha256:...", out.Image, reg.Host)
	}
	if len(out.Steps) < 2 || out.Steps[0].Name != "image" || out.Steps[1].Name != "create_container" {
		t.Errorf("steps %v: want the image's (its pull) first, then the cold call's", out.Steps)
	}

	out, err = rt.Run(ctx, imageCall(pyRef, ws, "/usr/bin/python3", "-c",
		`import os,sys; print(os.environ["TOOLPOOL_IMAGE_MARK"], sys.version_info[:2] >= (3, 0), os.getuid(), os.getcwd(), open("/workspace/from-shell").read().strip())`))
	if err != nil {
		t.Fatalf("run in python image: %v", err)
	}
	if got, want := out.Stdout.String(), "python True 65532 /workspace shell\n"; got != want {
		t.Errorf("python image: stdout %q (want %q), exit %d, stderr %q", got, want, out.ExitCode, out.Stderr.String())
	}

	// The shell image has no python.
	out, err = rt.Run(ctx, imageCall(shellRef, ws, "/usr/bin/python3", "-c", "print(1)"))
	if !errors.Is(err, sandbox.ErrNoProgram) {
		t.Errorf("python in the shell image: err %v, exit %d; want ErrNoProgram", err, out.ExitCode)
	}

	// The two images share their first layer: three committed snapshots (base, base+shell, base+python), not four.
	client, err := ctdclient.New(d.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	nctx := namespaces.WithNamespace(ctx, "toolpool-test")
	committed := 0
	if err := client.SnapshotService("overlayfs").Walk(nctx, func(_ context.Context, info snapshots.Info) error {
		if info.Kind == snapshots.KindCommitted {
			committed++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if committed != 3 {
		t.Errorf("%d committed snapshots, want 3: the images' common layer is stored once", committed)
	}
}

// TestConcurrentPullsOfOneImageAreCoalesced runs four calls in an image the worker lacks, at once: the
// image is pulled once (one resolve at the registry, one pull heard by the hooks) and every call runs,
// each told of the shared pull's progress (bytes never going back, ending done with the image's size); a
// fifth call finds it in the store and hears of no pull.
func TestConcurrentPullsOfOneImageAreCoalesced(t *testing.T) {
	var hooks struct {
		sync.Mutex
		pulls, hits, misses int
		bytes, cache        int64
	}
	rt, _, reg := pullRuntime(t, func(c *containerd.PullConfig, _ *ctrtest.Registry) {
		c.OnPull = func(bytes int64, _ time.Duration, err error) {
			hooks.Lock()
			defer hooks.Unlock()
			if err == nil {
				hooks.pulls++
				hooks.bytes += bytes
			}
		}
		c.OnLookup = func(hit bool) {
			hooks.Lock()
			defer hooks.Unlock()
			if hit {
				hooks.hits++
			} else {
				hooks.misses++
			}
		}
		c.OnCacheBytes = func(b int64) { hooks.Lock(); hooks.cache = b; hooks.Unlock() }
	})
	ref := ctrtest.PushShellImage(t, reg, "tools/shell:coalesced")
	before := reg.ManifestResolves()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	progress := make([][]sandbox.PullProgress, len(errs))
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := imageCall(ref, workspace(t), "/usr/bin/id", "-u")
			spec.OnPull = func(pp sandbox.PullProgress) { progress[i] = append(progress[i], pp) }
			out, err := rt.Run(ctx, spec)
			if err == nil && out.ExitCode != 0 {
				err = errors.New("exit " + out.Stderr.String())
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if n := reg.ManifestResolves() - before; n != 1 {
		t.Errorf("the image was resolved %d times for 4 concurrent calls, want once: one pull serves them all", n)
	}
	cached := imageCall(ref, workspace(t), "/usr/bin/id", "-u")
	cached.OnPull = func(pp sandbox.PullProgress) { t.Errorf("a call on a stored image heard of a pull: %+v", pp) }
	if _, err := rt.Run(ctx, cached); err != nil {
		t.Fatal(err)
	}
	base, shellOwn, _ := ctrtest.ToolchainLayerBytes(t)
	for i, pps := range progress {
		if len(pps) == 0 {
			t.Errorf("call %d heard nothing of the pull it waited for", i)
			continue
		}
		for j, pp := range pps {
			if pp.Done > pp.Total || (j > 0 && pp.Done < pps[j-1].Done) || !strings.HasPrefix(pp.Image, reg.Host+"/tools/shell:") {
				t.Errorf("call %d: report %d %+v after %+v: bytes must stay within the total and never go back", i, j, pp, pps[max(j-1, 0)])
			}
		}
		t.Logf("call %d heard %v", i, pps)
		if last := pps[len(pps)-1]; last.Phase != sandbox.PullDone || last.Done != last.Total || last.Total < base+shellOwn {
			t.Errorf("call %d: last report %+v, want done with the image's config and layers (at least %d bytes)", i, last, base+shellOwn)
		}
	}
	hooks.Lock()
	defer hooks.Unlock()
	if hooks.pulls != 1 || hooks.bytes < base+shellOwn || hooks.cache != hooks.bytes || hooks.hits+hooks.misses != 5 || hooks.hits < 1 {
		t.Errorf("hooks heard %d pulls of %d bytes (cache %d), %d hits and %d misses; want one pull of the image's size (at least %d), the cache that size, 5 look-ups with the last a hit",
			hooks.pulls, hooks.bytes, hooks.cache, hooks.hits, hooks.misses, base+shellOwn)
	}
}

// anonymousHost names reg as localhost:PORT, a host the worker has no credentials for.
func anonymousHost(reg *ctrtest.Registry) string {
	return "localhost:" + reg.Host[strings.LastIndex(reg.Host, ":")+1:]
}

// randomLayer is a layer of its own (one file of random bytes), so that no earlier pull has its content.
func randomLayer(t *testing.T) []byte {
	data := make([]byte, 64<<10)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	return ctrtest.LayerTar(t, ctrtest.TarEntry{Name: "data", Type: tar.TypeReg, Mode: 0o644, Data: data})
}

// TestPullFaults ends each broken pull with ErrImagePull or ErrImageRefused (and ErrNotStarted: nothing
// ran), a message that says what to fix, and nothing of the image in the store.
func TestPullFaults(t *testing.T) {
	// The private registry is also reachable as localhost:PORT, for which the worker has no credentials.
	rt, d, reg := pullRuntime(t, func(c *containerd.PullConfig, reg *ctrtest.Registry) {
		c.MaxBytes = 64 << 20
		c.Registries = append(c.Registries, containerd.RegistryConfig{Host: anonymousHost(reg), PlainHTTP: true})
	})
	down := ctrtest.StartRegistry(t)
	downRef := ctrtest.PushImage(t, down, "gone/image:1", v1.Config{}, randomLayer(t))
	down.Close()
	base := ctrtest.BaseLayer(t)
	hostile := func(e ...ctrtest.TarEntry) string {
		return ctrtest.PushImage(t, reg, "hostile/image:"+newID("h"), v1.Config{}, base, ctrtest.LayerTar(t, e...))
	}
	tests := []struct {
		name    string
		ref     func(t *testing.T) string
		fault   ctrtest.Fault
		want    error
		message string
	}{
		{name: "registry down", ref: func(*testing.T) string { return downRef }, want: sandbox.ErrImagePull, message: "cannot be reached"},
		{name: "401 without credentials", ref: func(t *testing.T) string {
			return strings.Replace(ctrtest.PushImage(t, reg, "private/image:1", v1.Config{}, randomLayer(t)), reg.Host, anonymousHost(reg), 1)
		}, want: sandbox.ErrImagePull, message: "credentials"},
		{name: "404", ref: func(*testing.T) string { return reg.Host + "/no/such:image" }, want: sandbox.ErrImagePull, message: "no such image"},
		{name: "pull cut midway", ref: func(t *testing.T) string {
			return ctrtest.PushImage(t, reg, "cut/image:1", v1.Config{}, randomLayer(t))
		}, fault: ctrtest.CutBlobs, want: sandbox.ErrImagePull, message: "registry " + reg.Host},
		{name: "digest mismatch", ref: func(t *testing.T) string {
			return ctrtest.PushImage(t, reg, "corrupt/image:1", v1.Config{}, randomLayer(t))
		}, fault: ctrtest.CorruptBlobs, want: sandbox.ErrImagePull, message: "digest"},
		{name: "over the size limit", ref: func(t *testing.T) string {
			big := make([]byte, 65<<20)
			return ctrtest.PushImage(t, reg, "big/image:1", v1.Config{}, ctrtest.LayerTar(t, ctrtest.TarEntry{Name: "big", Type: tar.TypeReg, Mode: 0o644, Data: big}))
		}, want: sandbox.ErrImageRefused, message: "images.max_bytes"},
		{name: "device node", ref: func(*testing.T) string {
			return hostile(ctrtest.TarEntry{Name: "dev/sda", Type: tar.TypeBlock, Mode: 0o666, Devmajor: 8})
		}, want: sandbox.ErrImageRefused, message: "device node"},
		{name: "absolute path", ref: func(*testing.T) string {
			return hostile(ctrtest.TarEntry{Name: "/etc/cron.d/x", Type: tar.TypeReg, Mode: 0o644, Data: []byte("x")})
		}, want: sandbox.ErrImageRefused, message: "absolute path"},
		{name: "dot-dot path", ref: func(*testing.T) string {
			return hostile(ctrtest.TarEntry{Name: "a/../../../tmp/x", Type: tar.TypeReg, Mode: 0o644, Data: []byte("x")})
		}, want: sandbox.ErrImageRefused, message: `".."`},
		{name: "hard link out of the root", ref: func(*testing.T) string {
			return hostile(ctrtest.TarEntry{Name: "shadow", Type: tar.TypeLink, Linkname: "../../../etc/shadow"})
		}, want: sandbox.ErrImageRefused, message: "hard link"},
		{name: "symbolic link out of the root", ref: func(*testing.T) string {
			return hostile(ctrtest.TarEntry{Name: "usr/escape", Type: tar.TypeSymlink, Linkname: "../../../etc"})
		}, want: sandbox.ErrImageRefused, message: "out of the image's root"},
		{name: "unparsable reference", ref: func(*testing.T) string { return "Not A/Reference::" }, want: sandbox.ErrImageRefused, message: "does not parse"},
	}
	client, err := ctdclient.New(d.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ref := tt.ref(t)
			reg.SetFault(tt.fault)
			defer reg.SetFault(ctrtest.NoFault)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			out, err := rt.Run(ctx, imageCall(ref, workspace(t), "/bin/sh", "-c", "echo ran"))
			if !errors.Is(err, tt.want) || !errors.Is(err, sandbox.ErrNotStarted) {
				t.Fatalf("err %v; want %v and ErrNotStarted (stdout %q)", err, tt.want, out.Stdout.String())
			}
			t.Logf("error: %v", err)
			if !strings.Contains(err.Error(), tt.message) {
				t.Errorf("error %q does not say %q", err, tt.message)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error %q shows the registry password", err)
			}
			name, perr := containerd.ParseImageRef(ref)
			if perr != nil {
				return
			}
			if _, err := client.ImageService().Get(namespaces.WithNamespace(ctx, "toolpool-test"), name); !errdefs.IsNotFound(err) {
				t.Errorf("after a failed pull the store has image %s (err %v): it must keep nothing half-pulled", name, err)
			}
		})
	}
}

// TestImageWithoutMountPoints runs a call on an image of one static program and nothing else: no
// /workspace, /tmp, /proc or /.toolpool. The runtime's mounts land all the same, the workspace is
// writable, and a file the image made writable by all is not: the root is read-only.
func TestImageWithoutMountPoints(t *testing.T) {
	rt, _, reg := pullRuntime(t, nil)
	probe, err := os.ReadFile(buildProbe(t))
	if err != nil {
		t.Fatal(err)
	}
	ref := ctrtest.PushImage(t, reg, "bare/probe:1", v1.Config{}, ctrtest.LayerTar(t,
		ctrtest.TarEntry{Name: "probe", Type: tar.TypeReg, Mode: 0o755, Data: probe},
		ctrtest.TarEntry{Name: "writable", Type: tar.TypeReg, Mode: 0o666, Data: []byte("x")}))
	ws := workspace(t)
	if err := os.WriteFile(filepath.Join(ws, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(ws, "f"), ctrtest.SandboxUID, ctrtest.SandboxGID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"/probe", "whoami"}, "uid=65532 euid=65532 gid=65532 egid=65532 capeff=0000000000000000\n"},
		{[]string{"/probe", "open_write", "/workspace/f"}, "OK\n"},
		{[]string{"/probe", "open_write", "/writable"}, "EROFS\n"}, // mode 0666 in the image, on a read-only root
	} {
		out, err := rt.Run(ctx, imageCall(ref, ws, tc.argv...))
		if err != nil || !strings.Contains(out.Stdout.String(), tc.want) {
			t.Errorf("%v: err %v stdout %q stderr %q; want %q", tc.argv, err, out.Stdout.String(), out.Stderr.String(), tc.want)
		}
	}
}

// TestPullTimeLimit: a registry that stops sending ends the pull at the worker's time limit, with an error
// that names the setting, and a call cancelled while it waits for a pull ends with its context's error,
// not as a failed pull.
func TestPullTimeLimit(t *testing.T) {
	rt, _, reg := pullRuntime(t, func(c *containerd.PullConfig, _ *ctrtest.Registry) { c.Timeout = 3 * time.Second })
	ref := ctrtest.PushImage(t, reg, "slow/image:1", v1.Config{}, randomLayer(t))
	reg.SetFault(ctrtest.StallBlobs)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	_, err := rt.Run(ctx, imageCall(ref, workspace(t), "/bin/sh", "-c", "true"))
	if !errors.Is(err, sandbox.ErrImagePull) || !strings.Contains(err.Error(), "images.pull_timeout") || time.Since(began) > 30*time.Second {
		t.Fatalf("after %s: err %v; want ErrImagePull naming images.pull_timeout after about 3s", time.Since(began), err)
	}

	ref = ctrtest.PushImage(t, reg, "slow/image:2", v1.Config{}, randomLayer(t))
	cctx, ccancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer ccancel()
	_, err = rt.Run(cctx, imageCall(ref, workspace(t), "/bin/sh", "-c", "true"))
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, sandbox.ErrImagePull) || !errors.Is(err, sandbox.ErrNotStarted) {
		t.Fatalf("a call that ended while waiting: err %v; want its context's error, not ErrImagePull", err)
	}
}

// TestWarmCallOnPulledImage: once an image is pulled, the warm pool keeps containers of it, found by the
// image's full name however a call writes it (here without its :latest), and a warm call on it gets the
// image's environment and names the image by digest, as a cold one does.
func TestWarmCallOnPulledImage(t *testing.T) {
	ctrtest.Require(t)
	reg := ctrtest.StartRegistry(t)
	ref := strings.TrimSuffix(ctrtest.PushShellImage(t, reg, "tools/shell:latest"), ":latest") // the pool must match it as :latest
	rt, _, probe := newPooledRuntime(t, containerd.Config{Pull: containerd.PullConfig{Registries: []containerd.RegistryConfig{{Host: reg.Host, PlainHTTP: true}}}})
	ws := workspace(t)
	spec := warmSpec(probe, ws, `echo "$TOOLPOOL_IMAGE_MARK $HOME"`)
	spec.Image = ref
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cold, err := rt.Run(ctx, spec)
	if err != nil || cold.Warm || cold.Stdout.String() != "shell /tmp\n" {
		t.Fatalf("first call: err %v warm %v stdout %q stderr %q", err, cold.Warm, cold.Stdout.String(), cold.Stderr.String())
	}
	spec.ID = newID("w")
	warm := runWarm(t, rt, spec)
	if warm.Stdout.String() != "shell /tmp\n" || warm.Image != cold.Image || !strings.Contains(warm.Image, "@sha256:") {
		t.Errorf("warm call: stdout %q image %q; want the image's mark and %q", warm.Stdout.String(), warm.Image, cold.Image)
	}
}

// TestImageCacheBudget: with a budget that holds the python image but not the shell image besides, a
// pull evicts the least recently used image, never one a call is running on and never a pinned one
// (then the worker hears that the cache stays over its budget).
func TestImageCacheBudget(t *testing.T) {
	base, shellOwn, pythonOwn := ctrtest.ToolchainLayerBytes(t)
	budget := base + pythonOwn + shellOwn/2 // the python image and its config fit; the shell layer besides does not
	var warnings struct {
		sync.Mutex
		list []string
	}
	start := func(t *testing.T, pin func(reg *ctrtest.Registry) []string) (*containerd.Runtime, *ctrtest.Registry, func(ref string) bool) {
		rt, d, reg := pullRuntime(t, func(c *containerd.PullConfig, reg *ctrtest.Registry) {
			c.CacheBytes = budget
			if pin != nil {
				c.Pinned = pin(reg)
			}
			c.OnWarning = func(msg string) { warnings.Lock(); warnings.list = append(warnings.list, msg); warnings.Unlock() }
		})
		client, err := ctdclient.New(d.Address())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		stored := func(ref string) bool {
			name, err := containerd.ParseImageRef(ref)
			if err != nil {
				t.Fatal(err)
			}
			_, err = client.ImageService().Get(namespaces.WithNamespace(context.Background(), "toolpool-test"), name)
			return err == nil
		}
		return rt, reg, stored
	}
	run := func(t *testing.T, rt *containerd.Runtime, ref, ws string, argv ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if out, err := rt.Run(ctx, imageCall(ref, ws, argv...)); err != nil || out.ExitCode != 0 {
			t.Fatalf("%s %v: err %v exit %d stderr %q", ref, argv, err, out.ExitCode, out.Stderr.String())
		}
	}

	t.Run("least recently used goes, never one in use", func(t *testing.T) {
		rt, reg, stored := start(t, nil)
		shell := ctrtest.PushShellImage(t, reg, "tools/shell:1")
		python := ctrtest.PushPythonImage(t, reg, "tools/python:1")
		ws := workspace(t)
		run(t, rt, shell, ws, "/bin/sh", "-c", ":")
		run(t, rt, python, ws, "/usr/bin/python3", "-c", "pass")
		if stored(shell) || !stored(python) {
			t.Fatalf("after the python pull: shell stored %v, python stored %v; want the shell image evicted", stored(shell), stored(python))
		}
		// A long python call holds its image while the shell image comes back: nothing may be evicted.
		done := make(chan error, 1)
		go func() {
			out, err := rt.Run(context.Background(), imageCall(python, ws, "/usr/bin/python3", "-c",
				"import os,time\nopen('started','w').close()\nwhile not os.path.exists('release'): time.sleep(0.02)"))
			if err == nil && out.ExitCode != 0 {
				err = fmt.Errorf("exit %d: %s", out.ExitCode, out.Stderr.String())
			}
			done <- err
		}()
		waitFile(t, filepath.Join(ws, "started"))
		run(t, rt, shell, ws, "/bin/sh", "-c", ":")
		if !stored(python) || !stored(shell) {
			t.Errorf("python in use stored %v, shell just pulled stored %v: both must stay", stored(python), stored(shell))
		}
		if err := os.WriteFile(filepath.Join(ws, "release"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		warnings.Lock()
		defer warnings.Unlock()
		if len(warnings.list) != 1 || !strings.Contains(warnings.list[0], "images.cache_bytes") {
			t.Errorf("warnings %q, want one saying the cache stays over images.cache_bytes", warnings.list)
		}
		warnings.list = nil
	})
	t.Run("a pinned image stays", func(t *testing.T) {
		rt, reg, stored := start(t, func(reg *ctrtest.Registry) []string { return []string{reg.Host + "/tools/shell:1"} })
		shell := ctrtest.PushShellImage(t, reg, "tools/shell:1")
		python := ctrtest.PushPythonImage(t, reg, "tools/python:1")
		ws := workspace(t)
		run(t, rt, shell, ws, "/bin/sh", "-c", ":")
		run(t, rt, python, ws, "/usr/bin/python3", "-c", "pass")
		if !stored(shell) || !stored(python) {
			t.Errorf("pinned shell stored %v, python just pulled stored %v: both must stay", stored(shell), stored(python))
		}
		warnings.Lock()
		defer warnings.Unlock()
		if len(warnings.list) != 1 || !strings.Contains(warnings.list[0], "pinned or in use") {
			t.Errorf("warnings %q, want one saying every image is pinned or in use", warnings.list)
		}
	})
}

// waitFile waits until path exists, failing the test after a minute.
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within a minute", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFailedPullKeepsAnImportedImage: an image imported by hand but never unpacked is pulled again from
// its registry when a call needs it; when that pull fails, the imported record stays (only what a pull
// created is deleted).
func TestFailedPullKeepsAnImportedImage(t *testing.T) {
	_, d, reg := pullRuntime(t, nil)
	rt := ctrtest.NewRuntimeOn(t, containerd.Config{Address: d.Address(), Pull: containerd.PullConfig{
		Registries: []containerd.RegistryConfig{{Host: reg.Host, Username: reg.Username, Password: reg.Password, PlainHTTP: true}}}})
	name := reg.Host + "/imported/only:1" // the registry has no such image
	tarball := filepath.Join(t.TempDir(), "img.tar")
	ctrtest.WriteImageTar(t, tarball, name, []ctrtest.ImageFile{{Path: "marker", Mode: 0o644, Data: []byte("x")}})
	client, err := ctdclient.New(d.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := namespaces.WithNamespace(context.Background(), "toolpool-test")
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := client.Import(ctx, f); err != nil { // not unpacked
		t.Fatal(err)
	}
	_, err = rt.Run(ctx, imageCall(name, workspace(t), "/marker"))
	if !errors.Is(err, sandbox.ErrImagePull) || !strings.Contains(err.Error(), "no such image") {
		t.Fatalf("err %v, want ErrImagePull: the registry has no such image", err)
	}
	if _, err := client.ImageService().Get(ctx, name); err != nil {
		t.Errorf("the imported image is gone after a failed pull: %v", err)
	}
}

// TestPullAheadPinnedImages: PullAhead (what a worker does at start with its pinned images) pulls a
// pinned image before any call, says which image it could not have without giving up on the others, and
// makes the pool keep a container of it ready: the first call on it runs warm, with no registry left to
// ask. Under a cache budget that does not hold it besides another image, the pinned image is never evicted.
func TestPullAheadPinnedImages(t *testing.T) {
	ctrtest.Require(t)
	reg := ctrtest.StartRegistry(t)
	shell := ctrtest.PushShellImage(t, reg, "tools/shell:1")
	python := ctrtest.PushPythonImage(t, reg, "tools/python:1")
	missing := reg.Host + "/tools/missing:1"
	base, shellOwn, pythonOwn := ctrtest.ToolchainLayerBytes(t)
	// runc whatever the suite's runtime: the pool holds runc containers only.
	rt, d, probe := newPooledRuntime(t, containerd.Config{RuntimeName: containerd.RuncRuntime, Pull: containerd.PullConfig{
		Registries: []containerd.RegistryConfig{{Host: reg.Host, PlainHTTP: true}},
		CacheBytes: base + pythonOwn + shellOwn/2, // the python image fits; the shell image besides does not
		Pinned:     []string{shell},
	}})
	client, err := ctdclient.New(d.Address())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	stored := func(ref string) bool {
		_, err := client.ImageService().Get(namespaces.WithNamespace(context.Background(), "toolpool-test"), ref)
		return err == nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	err = rt.PullAhead(ctx, missing, shell)
	if !errors.Is(err, sandbox.ErrImagePull) || !strings.Contains(err.Error(), "pull image "+missing+" ahead") || strings.Contains(err.Error(), "tools/shell") {
		t.Errorf("PullAhead: %v; want an error naming %s only", err, missing)
	}
	if !stored(shell) {
		t.Fatalf("the pinned image %s was not pulled ahead", shell)
	}
	deadline := time.Now().Add(time.Minute)
	for rt.PoolStats().Ready < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no pooled container of the pinned image within a minute of PullAhead: %+v", rt.PoolStats())
		}
		time.Sleep(20 * time.Millisecond)
	}

	ws := workspace(t)
	if out, err := rt.Run(ctx, imageCall(python, ws, "/usr/bin/python3", "-c", "pass")); err != nil || out.ExitCode != 0 {
		t.Fatalf("python call: err %v exit %d stderr %q", err, out.ExitCode, out.Stderr.String())
	}
	if !stored(shell) || !stored(python) {
		t.Errorf("pinned shell stored %v, python just pulled stored %v: both must stay", stored(shell), stored(python))
	}

	reg.Close() // the first call on the pinned image needs nothing of the registry
	spec := warmSpec(probe, ws, `echo "$TOOLPOOL_IMAGE_MARK"`)
	spec.Image = shell
	out, err := rt.Run(ctx, spec)
	if err != nil || !out.Warm || out.Stdout.String() != "shell\n" {
		t.Errorf("first call on the pinned image: err %v warm %v (cold: %q) stdout %q stderr %q; want it warm",
			err, out.Warm, out.ColdReason, out.Stdout.String(), out.Stderr.String())
	}
}

// TestFailedPullKeepsAnImageAnotherProcessStored: on a containerd shared by two worker processes, a pull
// that fails on its own (its transfer cut) while the other process's pull of the same image stored the
// image record leaves that record alone: its failure says nothing of the image the other one has.
func TestFailedPullKeepsAnImageAnotherProcessStored(t *testing.T) {
	_, d, reg := pullRuntime(t, nil)
	rt := ctrtest.NewRuntimeOn(t, containerd.Config{Address: d.Address(), Pull: containerd.PullConfig{
		Registries: []containerd.RegistryConfig{{Host: reg.Host, Username: reg.Username, Password: reg.Password, PlainHTTP: true}}}})
	ref := ctrtest.PushImage(t, reg, "shared/image:1", v1.Config{}, randomLayer(t))
	name, err := containerd.ParseImageRef(ref)
	if err != nil {
		t.Fatal(err)
	}
	target := manifestDescriptor(t, reg, "shared/image", "1")
	client, err := ctdclient.New(d.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), "toolpool-test"), 2*time.Minute)
	defer cancel()

	release := reg.HoldBlobs()
	defer release()
	failed := make(chan error, 1)
	go func() {
		_, err := rt.Run(ctx, imageCall(ref, workspace(t), "/bin/sh", "-c", "echo ran"))
		failed <- err
	}()
	for deadline := time.Now().Add(time.Minute); reg.Waiting() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the pull never fetched a blob")
		}
	}
	// Meanwhile the other process's pull of the image stored its record.
	if _, err := client.ImageService().Create(ctx, images.Image{Name: name, Target: target}); err != nil {
		t.Fatal(err)
	}
	reg.SetFault(ctrtest.CutBlobs)
	release()
	if err := <-failed; !errors.Is(err, sandbox.ErrImagePull) {
		t.Fatalf("err %v, want ErrImagePull (the transfer was cut)", err)
	}
	if img, err := client.ImageService().Get(ctx, name); err != nil || img.Target.Digest != target.Digest {
		t.Errorf("the image record the other process stored is gone after this pull failed: %+v %v", img, err)
	}
}

// manifestDescriptor asks reg for the descriptor of repo:tag's manifest, as a pull resolves it.
func manifestDescriptor(t *testing.T, reg *ctrtest.Registry, repo, tag string) ocispec.Descriptor {
	t.Helper()
	req, err := http.NewRequest(http.MethodHead, "http://"+reg.Host+"/v2/"+repo+"/manifests/"+tag, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(reg.Username, reg.Password)
	req.Header.Set("Accept", ocispec.MediaTypeImageManifest+", application/vnd.docker.distribution.manifest.v2+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HEAD manifest %s:%s: %s", repo, tag, resp.Status)
	}
	return ocispec.Descriptor{MediaType: resp.Header.Get("Content-Type"), Digest: digest.Digest(resp.Header.Get("Docker-Content-Digest")), Size: resp.ContentLength}
}
