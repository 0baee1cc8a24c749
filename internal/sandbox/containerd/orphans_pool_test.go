package containerd_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	ctdclient "github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// poolContainersOf lists the pooled containers of worker on the containerd at address (test namespace).
func poolContainersOf(t *testing.T, address, worker string) []string {
	t.Helper()
	client, err := ctdclient.New(address)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	list, err := client.Containers(namespaces.WithNamespace(context.Background(), "toolpool-test"),
		`labels."toolpool.worker"==`+worker+`,labels."toolpool.pool"`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range list {
		ids = append(ids, c.ID())
	}
	slices.Sort(ids)
	return ids
}

// TestRemoveOrphansOfKilledWorkersPool: a worker with a warm pool is killed (kill -9) and replaced under
// another id on the same containerd. The replacement removes the dead worker's pooled containers (ready
// and claimed) with their processes once their owner has not marked them alive for PoolOwnerStale, and
// never those of a live worker on the same containerd, which keeps marking its own (by sweeping, as a
// worker does) and serves warm calls throughout.
func TestRemoveOrphansOfKilledWorkersPool(t *testing.T) {
	ctrtest.Require(t)
	const stale = 3 * time.Second
	t.Cleanup(containerd.SetPoolOwnerStale(stale))
	dataDir := ctrtest.ShortTempDir(t)
	d := ctrtest.StartDaemonIn(t, filepath.Join(dataDir, "ctd"))
	probe := buildProbe(t)

	live := ctrtest.NewRuntimeOn(t, containerd.Config{Address: d.Address(), WorkerID: "live-worker",
		Pool: containerd.PoolConfig{MaxSize: 1, InitBinary: probe, InitPath: probePath}})
	ws := workspace(t)
	runWarm(t, live, warmSpec(probe, ws, "true")) // the pool is up; it refills behind the call
	waitFor(t, time.Minute, "the live worker's pool to refill", func() bool { return live.PoolStats().Ready == 1 })
	// The warm call's own container is removed in the background: the live pool is what stays after.
	live.WaitCleanups()
	livePool := poolContainersOf(t, d.Address(), "live-worker")
	if len(livePool) == 0 {
		t.Fatal("the live worker has no pooled container")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sweeping := make(chan struct{})
	go func() { // the live worker sweeps (and so marks its pool alive) every half second, as a worker does once per lease
		defer close(sweeping)
		for ctx.Err() == nil {
			_, _ = live.RemoveOrphans(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	defer func() { cancel(); <-sweeping }()

	crashWS, id := workspace(t), newID("crashpool")
	helper := exec.Command(os.Args[0])
	helper.Env = append(os.Environ(), envCrashHelper+"=1", envAddress+"="+d.Address(), envStateDir+"="+filepath.Join(dataDir, "crash"),
		envWorkspace+"="+crashWS, envCallID+"="+id, envPoolInit+"="+probe)
	helper.Stdout, helper.Stderr = os.Stderr, os.Stderr
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { helper.Process.Kill(); helper.Wait() })
	waitFor(t, time.Minute, "the crashing worker's call and pool", func() bool {
		_, err := os.Stat(filepath.Join(crashWS, "started"))
		return err == nil && len(poolContainersOf(t, d.Address(), "crash-worker")) > 0
	})
	deadPool := poolContainersOf(t, d.Address(), "crash-worker")
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	helper.Wait()
	killed := time.Now()

	replacement := ctrtest.NewRuntimeOn(t, containerd.Config{Address: d.Address(), WorkerID: "replacement"})
	leaseGone := func(context.Context, string) (bool, error) { return true, nil } // no call holds a lease
	if _, err := replacement.RemoveOrphansOf(ctx, leaseGone); err != nil {
		t.Fatalf("RemoveOrphansOf: %v", err)
	}
	if got := poolContainersOf(t, d.Address(), "live-worker"); !slices.Equal(got, livePool) {
		t.Fatalf("the replacement removed the live worker's pooled containers: %v, want %v", got, livePool)
	}
	if left := poolContainersOf(t, d.Address(), "crash-worker"); time.Since(killed) < stale && len(left) == 0 {
		t.Fatal("the dead worker's pooled containers were removed before PoolOwnerStale: an owner that is only slow would lose them")
	}
	waitFor(t, stale+30*time.Second, "the replacement to remove the dead worker's pooled containers", func() bool {
		if _, err := replacement.RemoveOrphansOf(ctx, leaseGone); err != nil {
			t.Logf("RemoveOrphansOf: %v", err)
		}
		return len(poolContainersOf(t, d.Address(), "crash-worker")) == 0
	})
	for _, c := range deadPool {
		waitFor(t, 10*time.Second, "the processes of "+c+" to end", func() bool {
			cg, err := ctrtest.ContainerCgroup("toolpool-test", c)
			return err == nil && cg.Empty()
		})
	}
	waitFor(t, 10*time.Second, "the crashed call's processes to end", func() bool { return !processWith("sleep 4711") })
	if got := poolContainersOf(t, d.Address(), "live-worker"); len(got) == 0 {
		t.Fatal("the live worker lost its pool")
	}
	if out := runWarm(t, live, warmSpec(probe, ws, "echo still-warm")); !strings.Contains(out.Stdout.String(), "still-warm") {
		t.Errorf("the live worker's warm call: %q", out.Stdout.String())
	}
}
