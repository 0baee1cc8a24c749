package containerd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ctdclient "github.com/containerd/containerd"
	"github.com/containerd/containerd/images"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/platforms"
	"github.com/containerd/containerd/snapshots"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// The pull helper is this test binary run as a second worker process (TestMain): it runs one call on an
// image with a Runtime of its own on the containerd at envPullAddress, and prints what came of it as JSON.
const (
	envPullHelper    = "TOOLPOOL_PULL_HELPER"
	envPullAddress   = "TOOLPOOL_PULL_ADDRESS"
	envPullState     = "TOOLPOOL_PULL_STATE"
	envPullWorker    = "TOOLPOOL_PULL_WORKER"
	envPullImage     = "TOOLPOOL_PULL_IMAGE"
	envPullRegistry  = "TOOLPOOL_PULL_REGISTRY"
	envPullWorkspace = "TOOLPOOL_PULL_WS"
)

// pullHelperResult is what the pull helper prints.
type pullHelperResult struct {
	Stdout, Stderr, Image, Err string
	Exit                       int
}

// pullHelper runs the pull helper's call and returns its exit status: 0 when the call ran, 1 otherwise.
func pullHelper() int {
	cfg := containerd.Config{
		Address: os.Getenv(envPullAddress), Namespace: "toolpool-test", StateDir: os.Getenv(envPullState),
		UID: ctrtest.SandboxUID, GID: ctrtest.SandboxGID, WorkerID: os.Getenv(envPullWorker), RuntimeName: ctrtest.Runtime(),
		Pull: containerd.PullConfig{Registries: []containerd.RegistryConfig{{Host: os.Getenv(envPullRegistry), PlainHTTP: true}}},
	}
	if cfg.RuntimeName == containerd.GVisorRuntime {
		cfg.GVisor = &containerd.GVisorConfig{}
	}
	var res pullHelperResult
	defer func() { _ = json.NewEncoder(os.Stdout).Encode(res) }()
	rt, err := containerd.New(context.Background(), cfg)
	if err != nil {
		res.Err = err.Error()
		return 1
	}
	defer rt.Close() // waits for the call's container to be removed
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := rt.Run(ctx, sandbox.Spec{ID: os.Getenv(envPullWorker) + "-call", Image: os.Getenv(envPullImage),
		Argv: []string{"/bin/sh", "-c", `echo "$TOOLPOOL_IMAGE_MARK"; ls /workspace`}, WorkspaceDir: os.Getenv(envPullWorkspace),
		Limits: sandbox.Limits{Timeout: time.Minute}})
	res.Stdout, res.Stderr, res.Image, res.Exit = out.Stdout.String(), out.Stderr.String(), out.Image, out.ExitCode
	if err != nil {
		res.Err = err.Error()
		return 1
	}
	return 0
}

// TestTwoWorkerProcessesPullOneImage: two worker processes get a call each on an image neither has, at
// the same moment (the registry holds every blob until both pulls are under way), sharing one containerd
// or each with its own: both calls run on it, every blob of the image is fetched from the registry once
// per containerd, and nothing is left half-pulled or half-unpacked in any: no ingest in the content store,
// the image's layers committed once each and no other snapshot once the calls' containers are gone.
func TestTwoWorkerProcessesPullOneImage(t *testing.T) {
	ctrtest.Require(t)
	for _, tt := range []struct {
		name   string
		shared bool
	}{{"sharing a containerd", true}, {"each with its own containerd", false}} {
		t.Run(tt.name, func(t *testing.T) {
			reg := ctrtest.StartRegistry(t)
			ref := ctrtest.PushShellImage(t, reg, "tools/shared:1")
			daemons := []*containerd.Daemon{ctrtest.StartDaemon(t)}
			if !tt.shared {
				daemons = append(daemons, ctrtest.StartDaemon(t))
			}
			digest := pullFromTwoProcesses(t, reg, ref, daemons)
			if !strings.HasPrefix(digest, reg.Host+"/tools/shared@sha256:") {
				t.Errorf("the workers ran on %q", digest)
			}
			var fetches map[string]string
			for _, d := range daemons {
				fetches = checkPulledWhole(t, d, ref)
			}
			for blob, what := range fetches {
				if n := reg.BlobGets(blob); n != len(daemons) {
					t.Errorf("blob %s (%s) was fetched %d times from the registry; want once per containerd, %d", blob, what, n, len(daemons))
				}
			}
		})
	}
}

// pullFromTwoProcesses runs two pull helpers at once, the first on daemons[0] and the second on the last
// of daemons, each with a call on image ref that the registry's held blobs keep waiting until both pulls
// are under way. Both calls must run on it; it returns the image they ran on, by digest.
func pullFromTwoProcesses(t *testing.T, reg *ctrtest.Registry, ref string, daemons []*containerd.Daemon) string {
	t.Helper()
	ws := workspace(t)
	if err := os.WriteFile(filepath.Join(ws, "shared.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	release := reg.HoldBlobs()
	defer release()
	type helper struct {
		cmd            *exec.Cmd
		stdout, stderr bytes.Buffer
	}
	helpers := make([]*helper, 2)
	for i := range helpers {
		h := &helper{cmd: exec.Command(os.Args[0], "-test.run=^$")}
		h.cmd.Env = append(os.Environ(), envPullHelper+"=1", envPullAddress+"="+daemons[min(i, len(daemons)-1)].Address(), envPullImage+"="+ref,
			envPullState+"="+filepath.Join(ctrtest.ShortTempDir(t), "state"), envPullWorker+"="+fmt.Sprintf("pull-worker-%d-%d", os.Getpid(), i),
			envPullRegistry+"="+reg.Host, envPullWorkspace+"="+ws)
		h.cmd.Stdout, h.cmd.Stderr = &h.stdout, &h.stderr
		if err := h.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if h.cmd.ProcessState == nil {
				h.cmd.Process.Kill()
				h.cmd.Wait()
			}
		})
		helpers[i] = h
	}
	// Both resolve the image (a HEAD each) and one asks for a blob before any blob is given: both pulls
	// are under way.
	deadline := time.Now().Add(2 * time.Minute)
	for reg.ManifestResolves() < 2 || reg.Waiting() < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the two pulls did not start within two minutes: %d resolves, %d blob requests waiting", reg.ManifestResolves(), reg.Waiting())
		}
		time.Sleep(10 * time.Millisecond)
	}
	release()
	var digest string
	for i, h := range helpers {
		err := h.cmd.Wait()
		var res pullHelperResult
		if jerr := json.Unmarshal(h.stdout.Bytes(), &res); jerr != nil || err != nil || res.Err != "" || res.Exit != 0 || res.Stdout != "shell\nshared.txt\n" {
			t.Fatalf("worker %d: %v %+v (stdout %q, stderr %s)", i, err, res, h.stdout.String(), h.stderr.String())
		}
		if digest != "" && res.Image != digest {
			t.Errorf("the workers ran on %s and %s", digest, res.Image)
		}
		digest = res.Image
	}
	return digest
}

// checkPulledWhole checks that containerd d holds image ref whole and unpacked, with no ingest and no
// snapshot but the image's committed layers, and returns the image's blobs (config and layers) by
// digest, with their media types.
func checkPulledWhole(t *testing.T, d *containerd.Daemon, ref string) map[string]string {
	t.Helper()
	client, err := ctdclient.New(d.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := namespaces.WithNamespace(context.Background(), "toolpool-test")
	img, err := client.GetImage(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := img.IsUnpacked(ctx, "overlayfs"); !ok || err != nil {
		t.Errorf("the image is not unpacked: %v", err)
	}
	m, err := images.Manifest(ctx, client.ContentStore(), img.Target(), platforms.Default())
	if err != nil {
		t.Fatal(err)
	}
	blobs := map[string]string{}
	for _, b := range append([]ocispec.Descriptor{m.Config}, m.Layers...) {
		blobs[b.Digest.String()] = b.MediaType
	}
	statuses, err := client.ContentStore().ListStatuses(ctx)
	if err != nil || len(statuses) != 0 {
		t.Errorf("ingests left in the content store: %+v (%v)", statuses, err)
	}
	kinds := map[snapshots.Kind]int{}
	if err := client.SnapshotService("overlayfs").Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		kinds[info.Kind]++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if kinds[snapshots.KindCommitted] != len(m.Layers) || len(kinds) != 1 {
		t.Errorf("snapshots by kind %v; want only the image's %d layers, committed", kinds, len(m.Layers))
	}
	return blobs
}
