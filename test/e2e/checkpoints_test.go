package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/checkpoint/s3store/s3test"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
)

// TestWorkspacesWithoutSharedDir: two workers, each with its own workspaces directory and no shared
// filesystem, keep one workspace through checkpoints in object storage (JetStream's object store, then a
// real S3 server). Each call appends a line and counts the lines: with both workers taking calls, then
// with the first stopped, every call sees every line written before it, wherever that call ran. A worker
// restarted on its old, stale copy brings it up to date before its first call.
func TestWorkspacesWithoutSharedDir(t *testing.T) {
	t.Run("jetstream", func(t *testing.T) { workspacesWithoutSharedDir(t, "checkpoints: {store: jetstream}\n") })
	t.Run("s3", func(t *testing.T) {
		ctrtest.Require(t)
		c := s3test.Server(t)
		workspacesWithoutSharedDir(t, fmt.Sprintf("checkpoints:\n  store: s3\n  s3: {endpoint: %q, bucket: %q, access_key_id: %q, secret_access_key: %q}\n",
			c.Endpoint, c.Bucket, c.AccessKeyID, c.SecretAccessKey))
	})
}

func workspacesWithoutSharedDir(t *testing.T, workerConfig string) {
	s := startStackWith(t, stackOptions{policy: permissivePolicy + "builtin_asks: {redirect-write: allow}\n", workerConfig: workerConfig})
	second := start(t, "worker", "--data-dir", filepath.Join(s.dataDir, "w2"), "--nats-url", s.natsURL,
		"--listen", "127.0.0.1:0", "--id", "e2e-worker-2", "--slots", "4", "--runtime", ctrtest.Runtime(),
		"--config", filepath.Join(s.dataDir, "worker.yaml"))
	second.WaitLog(t, "worker ready", 60*time.Second)

	lines := 0
	var checkpointMS []int64
	appendLine := func(wantWorker string) *call.Result {
		t.Helper()
		lines++
		r := s.shell(t, "dev-token", "shared", fmt.Sprintf("echo line%d >> log.txt && wc -l < log.txt", lines), nil).result(t)
		if r.Status != call.StatusOK {
			t.Fatalf("call %d on %s: %s %+v %s", lines, r.Worker, r.Status, r.Error, r.Output)
		}
		if got, _ := strconv.Atoi(strings.TrimSpace(r.Stdout)); got != lines {
			t.Fatalf("call %d on %s counted %q lines: it did not see every line written before it", lines, r.Worker, r.Stdout)
		}
		if wantWorker != "" && r.Worker != wantWorker {
			t.Fatalf("call %d ran on %s, want %s", lines, r.Worker, wantWorker)
		}
		checkpointMS = append(checkpointMS, r.Timing.CheckpointMS)
		return r
	}
	ran := map[string]int{}
	for range 10 {
		ran[appendLine("").Worker]++
	}
	t.Logf("with both workers up, the calls ran on %v", ran)
	s.worker.Stop(t)
	for range 10 {
		appendLine("e2e-worker-2")
	}
	// The second worker's own directory holds the whole file; the workspace API (on that worker) agrees.
	b, err := os.ReadFile(filepath.Join(s.dataDir, "w2", "workspaces", "dev", "shared", "log.txt"))
	if err != nil || strings.Count(string(b), "\n") != lines {
		t.Fatalf("the second worker's copy: %d lines, %v; want %d", strings.Count(string(b), "\n"), err, lines)
	}
	if r := s.do(t, http.MethodGet, "/v1/workspaces/shared/files/log.txt", "dev-token", nil); r.code != http.StatusOK || string(r.body) != string(b) {
		t.Fatalf("GET the file: HTTP %d, %d bytes; want the second worker's %d", r.code, len(r.body), len(b))
	}

	// The first worker comes back on its stale copy, with nothing in memory of it; the second stops.
	s.startWorker(t)
	second.Stop(t)
	appendLine("e2e-worker")
	slices.Sort(checkpointMS)
	t.Logf("checkpoint_ms of %d calls that each changed one file: p50 %d, max %d", len(checkpointMS), checkpointMS[len(checkpointMS)/2], checkpointMS[len(checkpointMS)-1])
}
