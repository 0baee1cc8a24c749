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
// restarted on its old, stale copy brings it up to date before its first call. A snapshot taken on the
// second worker is restored and forked on the first, and listed by it.
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
	// A snapshot taken on the second worker: a head in NATS, restored and forked below on the first.
	if r := s.do(t, http.MethodPost, "/v1/workspaces/shared/snapshot", "dev-token", map[string]any{"snapshot": "at20"}); r.code != http.StatusCreated {
		t.Fatalf("snapshot on the second worker: HTTP %d %s", r.code, r.body)
	}

	// The first worker comes back on its stale copy, with nothing in memory of it; the second stops.
	s.startWorker(t)
	second.Stop(t)
	appendLine("e2e-worker")
	// The snapshot the second worker took, restored and forked on the first: its 20 lines, not the 21st.
	if r := s.do(t, http.MethodPost, "/v1/workspaces/shared/restore", "dev-token", map[string]any{"snapshot": "at20"}); r.code != http.StatusOK {
		t.Fatalf("restore on the first worker of the second's snapshot: HTTP %d %s", r.code, r.body)
	}
	lines = 20
	appendLine("e2e-worker")
	if r := s.do(t, http.MethodPost, "/v1/workspaces/shared/fork", "dev-token", map[string]any{"to": "branch", "snapshot": "at20"}); r.code != http.StatusCreated {
		t.Fatalf("fork on the first worker of the second's snapshot: HTTP %d %s", r.code, r.body)
	}
	if r := s.shell(t, "dev-token", "branch", "wc -l < log.txt", nil).result(t); r.Status != call.StatusOK || strings.TrimSpace(r.Stdout) != "20" {
		t.Fatalf("the fork: %s %q %+v; want the snapshot's 20 lines", r.Status, r.Stdout, r.Error)
	}
	if r := s.do(t, http.MethodGet, "/v1/workspaces", "dev-token", nil); r.code != http.StatusOK ||
		!strings.Contains(string(r.body), `"name":"branch"`) || !strings.Contains(string(r.body), `"name":"at20"`) {
		t.Fatalf("GET /v1/workspaces: HTTP %d %s; want branch, and shared with its snapshot at20", r.code, r.body)
	}
	slices.Sort(checkpointMS)
	t.Logf("checkpoint_ms of %d calls that each changed one file: p50 %d, max %d", len(checkpointMS), checkpointMS[len(checkpointMS)/2], checkpointMS[len(checkpointMS)-1])
}

// TestWorkspaceFailover: two workers with their own workspaces directories, checkpoints in JetStream, and
// a short lease (heartbeat 1s, lease 3s). kill -9 of the worker running a call in a workspace, after the
// call wrote its line: the next call into the workspace runs on the other worker once the dead worker's
// home lapses, and sees the line of the call that completed before, not the killed call's (it never
// completed, and was never checkpointed). The time from the kill to the next call's start is logged:
// issue 27's goal is under 5 s.
func TestWorkspaceFailover(t *testing.T) {
	s := startStackWith(t, stackOptions{policy: permissivePolicy + "builtin_asks: {redirect-write: allow}\n",
		workerConfig: "checkpoints: {store: jetstream}\nheartbeat: 1s\nlease: 3s\n"})
	secondArgs := []string{"--data-dir", filepath.Join(s.dataDir, "w2"), "--nats-url", s.natsURL, "--listen", "127.0.0.1:0",
		"--id", "e2e-worker-2", "--slots", "4", "--runtime", ctrtest.Runtime(), "--config", filepath.Join(s.dataDir, "worker.yaml")}
	second := start(t, "worker", secondArgs...)
	second.WaitLog(t, "worker ready", 60*time.Second)

	if r := s.shell(t, "dev-token", "fo", "echo done >> log.txt && wc -l < log.txt", nil).result(t); r.Status != call.StatusOK || r.Stdout != "1\n" {
		t.Fatalf("first call: %s %q %+v", r.Status, r.Stdout, r.Error)
	}
	id := s.shell(t, "dev-token", "fo", "echo killed >> log.txt && sleep 30", map[string]any{"wait": false}).result(t).ID
	dirs := map[string]string{"e2e-worker": "w", "e2e-worker-2": "w2"}
	var victim string
	deadline := time.Now().Add(time.Minute)
	for {
		r := s.do(t, http.MethodGet, "/v1/calls/"+id, "dev-token", nil).result(t)
		if r.Status == call.StatusRunning {
			b, _ := os.ReadFile(filepath.Join(s.dataDir, dirs[r.Worker], "workspaces", "dev", "fo", "log.txt"))
			if strings.Contains(string(b), "killed") {
				victim = r.Worker
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the call to kill did not write its line within a minute: %s on %q", r.Status, r.Worker)
		}
		time.Sleep(20 * time.Millisecond)
	}
	killed := time.Now()
	if victim == "e2e-worker" {
		s.worker.Kill9(t)
	} else {
		second.Kill9(t)
	}
	r := s.shell(t, "dev-token", "fo", "echo after >> log.txt && wc -l < log.txt", nil).result(t)
	if r.Status != call.StatusOK || r.Stdout != "2\n" || r.Worker == victim {
		t.Fatalf("the call after the kill of %s: %s on %s, %q %+v; want ok on the other worker with 2 lines", victim, r.Status, r.Worker, r.Stdout, r.Error)
	}
	t.Logf("kill -9 of %s: the next call started on %s %s after the kill (its result %s after it; lease 3s)", victim, r.Worker,
		r.StartedAt.Sub(killed).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	// The killed worker comes back on its data dir, clears what the kill left, and catches up.
	if victim == "e2e-worker" {
		s.startWorker(t)
	} else {
		second = start(t, "worker", secondArgs...)
		second.WaitLog(t, "worker ready", 60*time.Second)
	}
	if r := s.shell(t, "dev-token", "fo", "echo last >> log.txt && wc -l < log.txt", nil).result(t); r.Status != call.StatusOK || r.Stdout != "3\n" {
		t.Fatalf("call after the restart: %s on %s, %q %+v", r.Status, r.Worker, r.Stdout, r.Error)
	}
}
