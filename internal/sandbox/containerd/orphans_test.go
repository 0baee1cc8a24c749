package containerd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	ctdclient "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// The crash helper is this test binary run again as a worker that starts one call and is then SIGKILLed.
const (
	envCrashHelper = "TOOLPOOL_CRASH_HELPER"
	envAddress     = "TOOLPOOL_CRASH_ADDRESS"
	envStateDir    = "TOOLPOOL_CRASH_STATE"
	envWorkspace   = "TOOLPOOL_CRASH_WS"
	envCallID      = "TOOLPOOL_CRASH_ID"
	envImage       = "TOOLPOOL_CRASH_IMAGE"
	// envPoolInit, when set, gives the crash helper a warm pool of one container whose init is this file.
	envPoolInit = "TOOLPOOL_CRASH_POOL_INIT"
)

// TestMain runs this test binary as the crash helper when TestRemoveOrphansAfterCrash asks for one, and
// as the pull helper (a second worker process) when TestTwoWorkerProcessesPullOneImage does.
func TestMain(m *testing.M) {
	if os.Getenv(envCrashHelper) == "1" {
		crashHelper()
		os.Exit(1)
	}
	if os.Getenv(envPullHelper) == "1" {
		os.Exit(pullHelper())
	}
	code := m.Run()
	removeProbes()
	os.Exit(code)
}

// crashHelper is a worker that starts a call that never ends; TestRemoveOrphansAfterCrash kills it mid-call.
func crashHelper() {
	cfg := containerd.Config{
		Address: os.Getenv(envAddress), Namespace: "toolpool-test", StateDir: os.Getenv(envStateDir),
		UID: ctrtest.SandboxUID, GID: ctrtest.SandboxGID, WorkerID: "crash-worker",
	}
	if init := os.Getenv(envPoolInit); init != "" {
		cfg.Pool = containerd.PoolConfig{MaxSize: 1, InitBinary: init, InitPath: probePath}
	}
	rt, err := containerd.New(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash helper:", err)
		return
	}
	rt.Prewarm(sandbox.Spec{})
	spec := sandbox.Spec{ID: os.Getenv(envCallID), WorkspaceDir: os.Getenv(envWorkspace), Limits: sandbox.Limits{Timeout: 10 * time.Minute}}
	if img := os.Getenv(envImage); img != "" {
		spec.Image = img
		spec.Argv = []string{"/bin/probe", "mark_sleep", "/workspace/started", "4711"}
	} else {
		spec.Argv = []string{"/bin/sh", "-c", "echo started > /workspace/started; sleep 4711"}
	}
	_, err = rt.Run(context.Background(), spec)
	fmt.Fprintf(os.Stderr, "crash helper: Run returned (%v); it should have been killed\n", err)
}

// TestRemoveOrphansAfterCrash kills a worker in the middle of a call (and, in some cases, its containerd
// too), then starts a new Runtime on the same state and checks that RemoveOrphans leaves nothing of the
// earlier call: no container, task, shim, process, cgroup, snapshot, mount or FIFO.
func TestRemoveOrphansAfterCrash(t *testing.T) {
	ctrtest.Require(t)
	tests := []struct {
		name         string
		killDaemon   bool // the host lost containerd too (a private daemon dies with its worker)
		image        bool // the call ran on an image root: a snapshot and a rootfs mount to clean up
		concurrently bool // another worker's call in the same namespace must survive the cleanup
		// early kills the worker as soon as the call's first process exists, while containerd may still be
		// creating the task: the container record may be gone before the task is, or never get one.
		early bool
	}{
		{name: "worker crash", concurrently: true},
		{name: "worker crash while the task is created", early: true},
		{name: "worker and containerd crash", killDaemon: true},
		{name: "worker crash during an image call", image: true},
		{name: "worker and containerd crash during an image call", killDaemon: true, image: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dataDir := ctrtest.ShortTempDir(t)
			ctdDir := filepath.Join(dataDir, "ctd")
			stateDir := filepath.Join(dataDir, "sandbox")
			d := ctrtest.StartDaemonIn(t, ctdDir)
			ws := workspace(t)
			id := newID("crash")
			var image string
			if tt.image {
				image = probeImage(t, d.Address())
			}

			var other *containerd.Runtime
			otherDone := make(chan sandbox.Outcome, 1)
			if tt.concurrently {
				other = ctrtest.NewRuntimeOn(t, containerd.Config{Address: d.Address(), WorkerID: "other-worker"})
				// The other call runs until the host tells it to end, after the cleanup: it is still running
				// while RemoveOrphans works, whatever the host's speed.
				go func() {
					out, _ := other.Run(context.Background(), shell(ws, "echo other > /workspace/other-started; "+
						"while [ ! -e /workspace/other-may-end ]; do sleep 0.05; done; echo survived", 120*time.Second))
					otherDone <- out
				}()
				t.Cleanup(func() { os.WriteFile(filepath.Join(ws, "other-may-end"), nil, 0o644) }) // should the test end early
				waitFor(t, 30*time.Second, "the other worker's call to start", func() bool {
					_, err := os.Stat(filepath.Join(ws, "other-started"))
					return err == nil
				})
			}

			helper := exec.Command(os.Args[0])
			helper.Env = append(os.Environ(), envCrashHelper+"=1", envAddress+"="+d.Address(), envStateDir+"="+stateDir,
				envWorkspace+"="+ws, envCallID+"="+id, envImage+"="+image)
			helper.Stdout, helper.Stderr = os.Stderr, os.Stderr
			if err := helper.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { helper.Process.Kill(); helper.Wait() })
			waitFor(t, 30*time.Second, "the crash helper's call to start", func() bool {
				if tt.early {
					cg, err := ctrtest.ContainerCgroup("toolpool-test", id)
					return err == nil && len(cg.PIDs) > 0
				}
				_, err := os.Stat(filepath.Join(ws, "started"))
				return err == nil
			})
			if err := helper.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			helper.Wait()

			address := d.Address()
			if tt.killDaemon {
				ctx, cancel := context.WithCancel(context.Background())
				cancel() // no grace: SIGTERM then SIGKILL at once
				d.Stop(ctx)
				d = ctrtest.StartDaemonIn(t, ctdDir)
				address = d.Address()
			}
			rt := ctrtest.NewRuntimeOn(t, containerd.Config{Address: address, StateDir: stateDir, WorkerID: "crash-worker"})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			n, err := rt.RemoveOrphans(ctx)
			if err != nil {
				t.Fatalf("RemoveOrphans: %v", err)
			}
			// The container record exists before its task has a process, so even the early crash leaves one.
			if n != 1 {
				t.Errorf("removed %d containers, want 1", n)
			}
			if ids, err := rt.Containers(ctx); err != nil || len(ids) != 0 {
				t.Errorf("containers left: %v %v", ids, err)
			}
			if cg, err := ctrtest.ContainerCgroup("toolpool-test", id); err != nil || !cg.Empty() {
				t.Errorf("left behind (%v): %s", err, cg)
			}
			if entries, _ := os.ReadDir(filepath.Join(stateDir, "fifo")); len(entries) > 0 {
				t.Errorf("fifo dirs left: %d", len(entries))
			}
			if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), "/"+id+"/") {
				t.Errorf("mounts of %s left", id)
			}
			if snaps := snapshotNames(t, address); slices.Contains(snaps, id) {
				t.Errorf("the call's snapshot is left: %v", snaps)
			}
			t.Cleanup(func() {
				if t.Failed() {
					b, _ := os.ReadFile(filepath.Join(ctdDir, "containerd.log"))
					t.Logf("containerd log:\n%s", b)
				}
			})
			waitFor(t, 10*time.Second, "the shim of "+id+" to exit", func() bool { return !processWith("containerd-shim", "-id "+id+" ") })
			if tt.concurrently {
				if err := os.WriteFile(filepath.Join(ws, "other-may-end"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
				if out := <-otherDone; out.Stdout.String() != "survived\n" || out.ExitCode != 0 {
					t.Errorf("another worker's call was disturbed: exit %d stdout %q stderr %q", out.ExitCode, out.Stdout.String(), out.Stderr.String())
				}
			}
		})
	}
}

// snapshotNames lists the overlayfs snapshots in the test namespace of the containerd at address.
func snapshotNames(t *testing.T, address string) []string {
	t.Helper()
	client, err := ctdclient.New(address)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := namespaces.WithNamespace(context.Background(), "toolpool-test")
	var names []string
	err = client.SnapshotService("overlayfs").Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		names = append(names, info.Name)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// processWith reports whether a process on the host has every one of words in its command line.
func processWith(words ...string) bool {
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if st, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stat")); err == nil && strings.Contains(string(st), ") Z ") {
			continue // a zombie holds nothing but its pid
		}
		all := true
		for _, w := range words {
			all = all && strings.Contains(cmd, w)
		}
		if all {
			return true
		}
	}
	return false
}

// waitFor polls cond until it holds, and fails the test if it does not within the deadline.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !eventually(within, cond) {
		t.Fatalf("timed out after %s waiting for %s", within, what)
	}
}

// eventually polls cond until it holds (true) or the deadline passes (false).
func eventually(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// TestRemoveOrphansSparesRunningCalls runs RemoveOrphans (as a worker does when its containerd comes back)
// while calls of the same Runtime run, on the host root and on an image: they must finish untouched.
func TestRemoveOrphansSparesRunningCalls(t *testing.T) {
	rt, d := ctrtest.NewRuntime(t, containerd.Config{})
	image := probeImage(t, d.Address())
	specs := map[string]sandbox.Spec{
		// Each call runs until the host releases it, after RemoveOrphans: they are running while it works.
		"host root": shell(workspace(t), "echo started > /workspace/started; while [ ! -e /workspace/release ]; do sleep 0.05; done; echo survived", 120*time.Second),
		"image": {ID: newID("img"), Image: image, WorkspaceDir: workspace(t), Argv: []string{"/bin/probe", "mark_wait", "/workspace/started", "/workspace/release"},
			Limits: sandbox.Limits{Timeout: 120 * time.Second}},
	}
	release := func() {
		for _, spec := range specs {
			os.WriteFile(filepath.Join(spec.WorkspaceDir, "release"), nil, 0o644)
		}
	}
	t.Cleanup(release) // should the test end early
	type result struct {
		name string
		out  sandbox.Outcome
		err  error
	}
	results := make(chan result, len(specs))
	for name, spec := range specs {
		go func() {
			out, err := rt.Run(context.Background(), spec)
			results <- result{name, out, err}
		}()
	}
	for name, spec := range specs {
		waitFor(t, 30*time.Second, name+" to start", func() bool {
			_, err := os.Stat(filepath.Join(spec.WorkspaceDir, "started"))
			return err == nil
		})
	}
	n, err := rt.RemoveOrphans(context.Background())
	if err != nil || n != 0 {
		t.Errorf("RemoveOrphans = %d, %v; want 0 and no error", n, err)
	}
	release()
	for range specs {
		r := <-results
		if r.err != nil || r.out.ExitCode != 0 || r.out.TimedOut {
			t.Errorf("%s: %v, exit %d, stderr %q", r.name, r.err, r.out.ExitCode, r.out.Stderr.String())
		}
		if r.name == "host root" && r.out.Stdout.String() != "survived\n" {
			t.Errorf("%s: stdout %q", r.name, r.out.Stdout.String())
		}
	}
	rt.WaitCleanups()
	if ids, _ := rt.Containers(context.Background()); len(ids) != 0 {
		t.Errorf("containers left: %v", ids)
	}
}

// TestRemoveOrphansOfAnotherWorker: a worker killed mid-call and replaced under another id (same node,
// same containerd) leaves a container that the replacement removes once the call's owner is gone, and
// only then; a live worker's call on the same containerd is never touched.
func TestRemoveOrphansOfAnotherWorker(t *testing.T) {
	ctrtest.Require(t)
	dataDir := ctrtest.ShortTempDir(t)
	stateDir := filepath.Join(dataDir, "sandbox")
	d := ctrtest.StartDaemonIn(t, filepath.Join(dataDir, "ctd"))
	ws, id := workspace(t), newID("crash")

	other := ctrtest.NewRuntimeOn(t, containerd.Config{Address: d.Address(), WorkerID: "other-worker"})
	otherWS := workspace(t)
	otherSpec := shell(otherWS, "echo other > /workspace/other-started; sleep 3; echo survived", 20*time.Second)
	otherDone := make(chan sandbox.Outcome, 1)
	go func() {
		out, _ := other.Run(context.Background(), otherSpec)
		otherDone <- out
	}()

	helper := exec.Command(os.Args[0])
	helper.Env = append(os.Environ(), envCrashHelper+"=1", envAddress+"="+d.Address(), envStateDir+"="+stateDir,
		envWorkspace+"="+ws, envCallID+"="+id)
	helper.Stdout, helper.Stderr = os.Stderr, os.Stderr
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { helper.Process.Kill(); helper.Wait() })
	waitFor(t, 30*time.Second, "both calls to start", func() bool {
		_, err1 := os.Stat(filepath.Join(ws, "started"))
		_, err2 := os.Stat(filepath.Join(otherWS, "other-started"))
		return err1 == nil && err2 == nil
	})
	if err := helper.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	helper.Wait()

	replacement := ctrtest.NewRuntimeOn(t, containerd.Config{Address: d.Address(), StateDir: stateDir, WorkerID: "replacement"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	alive := func(context.Context, string) (bool, error) { return false, nil }
	if n, err := replacement.RemoveOrphansOf(ctx, alive); err != nil || n != 0 {
		t.Fatalf("with every owner alive: removed %d, %v", n, err)
	}
	if !slices.Contains(containerIDs(t, d.Address()), id) {
		t.Fatal("the crashed worker's container was removed while its owner's lease lived")
	}
	var asked []string
	gone := func(_ context.Context, callID string) (bool, error) {
		asked = append(asked, callID)
		return callID == id, nil
	}
	if n, err := replacement.RemoveOrphansOf(ctx, gone); err != nil || n != 1 {
		t.Fatalf("with the crashed call's owner gone: removed %d, %v (asked about %v)", n, err, asked)
	}
	if slices.Contains(containerIDs(t, d.Address()), id) {
		t.Fatal("the crashed worker's container is left")
	}
	waitFor(t, 10*time.Second, "the crashed call's processes to end", func() bool { return !processWith("sleep 4711") })
	if out := <-otherDone; !strings.Contains(out.Stdout.String(), "survived") {
		t.Errorf("the live worker's call was disturbed: %+v", out)
	}
}

// containerIDs lists every container in the test namespace of the containerd at address.
func containerIDs(t *testing.T, address string) []string {
	t.Helper()
	client, err := ctdclient.New(address)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	list, err := client.Containers(namespaces.WithNamespace(context.Background(), "toolpool-test"))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range list {
		ids = append(ids, c.ID())
	}
	return ids
}
