package e2e

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
	"github.com/toolpool/toolpool/internal/testproc"
)

// checkNothingLeftAfterStop makes t check, once the stack's processes have stopped (t's cleanups run last
// first, and this one is registered before the dispatcher and the worker start), that nothing of its
// workers' private containerds outlives them: no containerd on its config and no shim on its socket
// (a shim serves a call's or a pooled container's processes, and outlives its containerd when the worker
// leaves a container behind). The tests' other leak checks run while the worker still runs.
func (s *stack) checkNothingLeftAfterStop(t testing.TB) {
	t.Helper()
	t.Cleanup(func() {
		if s.worker != nil && !s.worker.Exited() {
			s.worker.Stop(t)
		}
		// Every worker of the stack: the stack's own (w) and those a test adds with data directories of
		// their own beside it.
		dirs, _ := filepath.Glob(filepath.Join(s.dataDir, "*", "containerd"))
		var left []string
		deadline := time.Now().Add(10 * time.Second)
		for {
			left = nil
			for _, dir := range dirs {
				left = append(left, testproc.ProcessesWith("--config "+filepath.Join(dir, "config.toml"))...)
				left = append(left, testproc.ProcessesWith("-address "+filepath.Join(dir, "containerd.sock"))...)
			}
			if len(left) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(left) > 0 {
			var cmds []string
			for _, pid := range left {
				cmds = append(cmds, pid+": "+testproc.CommandLine(pid))
			}
			t.Errorf("left running 10s after the worker exited (its containerd's or its shims):\n%s", strings.Join(cmds, "\n"))
		}
	})
}

// poolContainers lists the worker's pooled containers (ready or claimed) in its private containerd.
func (s *stack) poolContainers(t *testing.T) []string {
	t.Helper()
	sock := filepath.Join(s.dataDir, "w", "containerd", "containerd.sock")
	out, err := exec.Command("ctr", "-a", sock, "-n", "toolpool", "containers", "ls", "-q").CombinedOutput()
	if err != nil {
		t.Fatalf("ctr containers ls: %v: %s", err, out)
	}
	var ids []string
	for _, id := range strings.Fields(string(out)) {
		if strings.HasPrefix(id, "pool-") { // the pool's naming (containerd's slot maker)
			ids = append(ids, id)
		}
	}
	return ids
}

// TestKilledWorkerReplacedUnderAnotherID: a worker with a warm pool is killed with kill -9 while calls run
// and replaced under another id on the same data directory (a new pod on the node's data path). The
// replacement removes what the dead one left: its calls' containers once their leases lapse, its pooled
// containers once unmarked for containerd.PoolOwnerStale, with their shims and processes; and it serves.
func TestKilledWorkerReplacedUnderAnotherID(t *testing.T) {
	ctrtest.RequirePrograms(t, "ctr")
	s := startStackWith(t, stackOptions{policy: permissivePolicy, workerConfig: "heartbeat: 300ms\nlease: 4s\npool: {max_size: 2}\n", extraConfig: faultQueueConfig})
	var dead []string
	waitFor(t, 60*time.Second, "the pool to fill", func() bool { dead = s.poolContainers(t); return len(dead) > 0 })
	ids := s.submit(t, 2, "47.25")
	s.waitRunning(t, 2)
	s.worker.Kill9(t)
	s.workerID = "replacement"
	s.startWorker(t)
	counts := s.finalStates(t, ids)
	if counts[call.StatusLost] != 2 {
		t.Errorf("final states %v, want 2 lost", counts)
	}
	waitFor(t, containerd.PoolOwnerStale+time.Minute, "the dead worker's pooled containers to be removed", func() bool {
		left := s.poolContainers(t)
		for _, id := range dead {
			if slices.Contains(left, id) {
				return false
			}
		}
		return true
	})
	for _, id := range dead {
		waitFor(t, 10*time.Second, "the shim of "+id+" to exit", func() bool { return len(testproc.ProcessesWith("-id "+id+" ")) == 0 })
	}
	waitFor(t, 30*time.Second, "the dead worker's calls' processes to end", func() bool { return len(testproc.ProcessesWith("sleep 47.25")) == 0 })
	if r := s.shell(t, "dev-token", "faults", "echo replaced", nil); r.result(t).Stdout != "replaced\n" {
		t.Fatalf("after the replacement: %s", r.body)
	}
}
