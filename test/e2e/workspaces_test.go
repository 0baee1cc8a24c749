package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
	"github.com/toolpool/toolpool/internal/workspace"
)

func wsInfo(t testing.TB, r response) workspace.Info {
	t.Helper()
	var v struct {
		Workspace workspace.Info `json:"workspace"`
	}
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode workspace (HTTP %d): %v: %s", r.code, err, r.body)
	}
	return v.Workspace
}

// tarFiles is a tar.gz of files by name.
func tarFiles(t testing.TB, files map[string]string) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, body := range files {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
		io.WriteString(tw, body)
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// untar reads a tar.gz into files by name.
func untar(t testing.TB, data []byte) map[string]string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("not gzip (%d bytes): %v: %.200s", len(data), err, data)
	}
	tr := tar.NewReader(zr)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, _ := io.ReadAll(tr)
			out[h.Name] = string(b)
		}
	}
}

// TestWorkspaceAPI: a tarball of this repository seeded into a workspace, worked on through calls, pulled
// back as an archive and by range; snapshot, fork, restore, delete; a hostile archive refused over HTTP.
func TestWorkspaceAPI(t *testing.T) {
	s := startStackWith(t, stackOptions{policy: permissivePolicy, workerConfig: "workspaces:\n  max_per_tenant: 4\n"})
	repo, err := exec.Command("git", "-C", "../..", "archive", "--format=tar.gz", "HEAD").Output()
	if err != nil {
		t.Fatalf("git archive: %v", err)
	}
	start := time.Now()
	r := s.do(t, http.MethodPut, "/v1/workspaces/repo", "dev-token", repo)
	if r.code != http.StatusCreated {
		t.Fatalf("create from archive: HTTP %d %s", r.code, r.body)
	}
	inf := wsInfo(t, r)
	t.Logf("seeded %d-byte tar.gz: %d files, %d bytes on disk, in %s", len(repo), inf.Files, inf.Bytes, time.Since(start).Round(time.Millisecond))
	if inf.Files < 100 || inf.Name != "repo" {
		t.Fatalf("seeded workspace: %+v", inf)
	}
	if r := s.do(t, http.MethodPut, "/v1/workspaces/repo", "dev-token", nil); r.code != http.StatusConflict {
		t.Fatalf("create twice: HTTP %d %s", r.code, r.body)
	}

	res := s.do(t, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": "grep", "workspace": "repo", "args": map[string]any{"pattern": "func ValidateName", "path": "internal"}}).result(t)
	if res.Status != call.StatusOK || !strings.Contains(res.Output, "internal/call/call.go") {
		t.Fatalf("grep in seeded workspace: %s %s", res.Status, res.Output)
	}
	// go vet on the seeded tree, in a call (offline: only packages whose imports are all in the standard
	// library can be vetted without a module cache).
	res = s.shell(t, "dev-token", "repo", "HOME=/tmp GOCACHE=/tmp/gocache GOPROXY=off /usr/local/go/bin/go vet ./internal/call/ && echo vet-ok", map[string]any{"timeout_ms": 240000}).result(t)
	if res.Status == call.StatusPendingApproval { // a program outside the system's directories asks
		if r := s.do(t, http.MethodPost, "/v1/approvals/"+res.ID, "dev-token", map[string]any{"decision": "approve"}); r.code >= 300 {
			t.Fatalf("approve go vet: HTTP %d %s", r.code, r.body)
		}
		for i := 0; i < 3 && !res.Status.Terminal(); i++ { // compiling for vet is slow on a loaded host
			res = s.do(t, http.MethodGet, "/v1/calls/"+res.ID+"?wait=90s", "dev-token", nil).result(t)
		}
	}
	switch {
	case res.Status == call.StatusTimeout || !res.Status.Terminal():
		t.Logf("note: go vet through a call did not finish (a loaded host may time it out): %s", res.Status)
	case res.Status != call.StatusOK || !strings.Contains(res.Output, "vet-ok"):
		// Only the time it takes may vary: a vet that ends otherwise than ok is the seeded tree broken.
		t.Errorf("go vet through a call: %s: %.600s", res.Status, res.Output)
	}
	t.Logf("go vet through a call: status %s, run %d ms: %.300s", res.Status, res.Timing.RunMS, res.Output)
	res = s.do(t, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": "edit_file", "workspace": "repo",
		"args": map[string]any{"path": "internal/call/call.go", "old_string": "package call\n", "new_string": "package call\n\n// changed by an agent\n"}}).result(t)
	if res.Status != call.StatusOK {
		t.Fatalf("change: %s", res.Output)
	}

	r = s.do(t, http.MethodGet, "/v1/workspaces/repo/archive?path=internal/call", "dev-token", nil)
	if r.code != http.StatusOK {
		t.Fatalf("archive: HTTP %d %s", r.code, r.body)
	}
	files := untar(t, r.body)
	if !strings.Contains(files["call.go"], "package call\n\n// changed by an agent\n") {
		t.Fatalf("archive of internal/call: %d files, call.go starts %.300q", len(files), files["call.go"])
	}
	full, _ := s.send(t, http.MethodGet, "/v1/workspaces/repo/files/go.mod", "dev-token", nil, nil)
	part, h := s.send(t, http.MethodGet, "/v1/workspaces/repo/files/go.mod", "dev-token", nil, map[string]string{"Range": "bytes=7-20"})
	if full.code != http.StatusOK || part.code != http.StatusPartialContent || string(part.body) != string(full.body[7:21]) ||
		h.Get("Content-Range") != fmt.Sprintf("bytes 7-20/%d", len(full.body)) {
		t.Fatalf("range: HTTP %d %q %q, full HTTP %d %q", part.code, part.body, h.Get("Content-Range"), full.code, full.body)
	}
	suffix, _ := s.send(t, http.MethodGet, "/v1/workspaces/repo/files/go.mod", "dev-token", nil, map[string]string{"Range": "bytes=-5"})
	if suffix.code != http.StatusPartialContent || string(suffix.body) != string(full.body[len(full.body)-5:]) {
		t.Fatalf("suffix range: HTTP %d %q", suffix.code, suffix.body)
	}
	if r, _ := s.send(t, http.MethodGet, "/v1/workspaces/repo/files/go.mod", "dev-token", nil, map[string]string{"Range": "bytes=100000-"}); r.code != http.StatusRequestedRangeNotSatisfiable {
		t.Fatalf("range past the end: HTTP %d %s", r.code, r.body)
	}
	if r := s.do(t, http.MethodGet, "/v1/workspaces/repo/files/no/such", "dev-token", nil); r.code != http.StatusNotFound {
		t.Fatalf("missing file: HTTP %d %s", r.code, r.body)
	}

	// Upload one file and an archive into a path.
	if r := s.do(t, http.MethodPut, "/v1/workspaces/repo/files/notes/todo.txt", "dev-token", "ship it\n"); r.code != http.StatusOK {
		t.Fatalf("upload file: HTTP %d %s", r.code, r.body)
	}
	if r := s.do(t, http.MethodPost, "/v1/workspaces/repo/files?path=extra", "dev-token", tarFiles(t, map[string]string{"a.txt": "A", "b/c.txt": "C"})); r.code != http.StatusOK {
		t.Fatalf("upload archive: HTTP %d %s", r.code, r.body)
	}
	if res := s.shell(t, "dev-token", "repo", "cat notes/todo.txt extra/a.txt extra/b/c.txt; stat -c %u extra/a.txt", nil).result(t); res.Output != "ship it\nAC65532\n" {
		t.Fatalf("uploaded files seen by a call: %q", res.Output)
	}

	// Hostile archives over HTTP: refused with 422 and the reason, nothing written.
	hostile := map[string][]byte{}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "../../escape", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	hostile["dotdot"] = buf.Bytes()
	buf = bytes.Buffer{}
	tw = tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"})
	tw.WriteHeader(&tar.Header{Name: "l/passwd", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	hostile["symlink"] = buf.Bytes()
	for name, data := range hostile {
		r := s.do(t, http.MethodPost, "/v1/workspaces/repo/files", "dev-token", data)
		if r.code != http.StatusUnprocessableEntity {
			t.Fatalf("hostile %s: HTTP %d %s", name, r.code, r.body)
		}
		t.Logf("hostile %s: HTTP %d %s", name, r.code, strings.TrimSpace(string(r.body)))
	}

	// Snapshot, change, fork the snapshot, restore.
	if r := s.do(t, http.MethodPost, "/v1/workspaces/repo/snapshot", "dev-token", map[string]any{"snapshot": "s1"}); r.code != http.StatusCreated {
		t.Fatalf("snapshot: HTTP %d %s", r.code, r.body)
	} else {
		t.Logf("snapshot: reflinked=%v", *wsInfo(t, r).Reflinked)
	}
	if res := s.shell(t, "dev-token", "repo", "rm -r internal go.mod", nil).result(t); res.Status != call.StatusOK {
		t.Fatalf("break the workspace: %s", res.Output)
	}
	if r := s.do(t, http.MethodPost, "/v1/workspaces/repo/fork", "dev-token", map[string]any{"to": "repo2", "snapshot": "s1"}); r.code != http.StatusCreated {
		t.Fatalf("fork: HTTP %d %s", r.code, r.body)
	}
	if res := s.shell(t, "dev-token", "repo2", "test -f internal/call/call.go && head -1 go.mod", nil).result(t); !strings.HasPrefix(res.Output, "module ") {
		t.Fatalf("fork of the snapshot: %q", res.Output)
	}
	if r := s.do(t, http.MethodPost, "/v1/workspaces/repo/restore", "dev-token", map[string]any{"snapshot": "s1"}); r.code != http.StatusOK {
		t.Fatalf("restore: HTTP %d %s", r.code, r.body)
	}
	if res := s.shell(t, "dev-token", "repo", "grep -c 'changed by an agent' internal/call/call.go; head -1 go.mod", nil).result(t); !strings.HasPrefix(res.Output, "1\nmodule ") {
		t.Fatalf("after restore: %q", res.Output)
	}

	// List, limits, delete.
	var list struct {
		Workspaces []workspace.Info `json:"workspaces"`
	}
	r = s.do(t, http.MethodGet, "/v1/workspaces", "dev-token", nil)
	json.Unmarshal(r.body, &list)
	if r.code != http.StatusOK || len(list.Workspaces) != 2 || len(list.Workspaces[0].Snapshots)+len(list.Workspaces[1].Snapshots) != 1 {
		t.Fatalf("list: HTTP %d %s", r.code, r.body)
	}
	s.do(t, http.MethodPut, "/v1/workspaces/w3", "dev-token", nil)
	s.do(t, http.MethodPut, "/v1/workspaces/w4", "dev-token", nil)
	if r := s.do(t, http.MethodPut, "/v1/workspaces/w5", "dev-token", nil); r.code != http.StatusConflict || !strings.Contains(r.errorInfo(t).Message, "remove one") {
		t.Fatalf("over the count limit: HTTP %d %s", r.code, r.body)
	}
	if r := s.do(t, http.MethodDelete, "/v1/workspaces/repo2", "dev-token", nil); r.code != http.StatusOK {
		t.Fatalf("delete: HTTP %d %s", r.code, r.body)
	}
	if r := s.do(t, http.MethodGet, "/v1/workspaces/repo2", "dev-token", nil); r.code != http.StatusNotFound {
		t.Fatalf("deleted workspace: HTTP %d %s", r.code, r.body)
	}
	if r := s.do(t, http.MethodGet, "/v1/workspaces/repo2", "beta-token", nil); r.code != http.StatusNotFound {
		t.Fatalf("another tenant: HTTP %d %s", r.code, r.body)
	}
	if r := s.do(t, http.MethodGet, "/v1/workspaces/bad..name!", "dev-token", nil); r.code != http.StatusBadRequest {
		t.Fatalf("bad name: HTTP %d %s", r.code, r.body)
	}

	// Audited like any call: accepted and finished, by operation.
	var audit struct {
		Events []call.AuditEvent `json:"events"`
	}
	json.Unmarshal(s.do(t, http.MethodGet, "/v1/audit?since=1h&limit=1000", "dev-token", nil).body, &audit)
	seen := map[string]bool{}
	for _, e := range audit.Events {
		seen[e.Tool+" "+e.Event] = true
	}
	for _, op := range []string{"workspace_create", "workspace_upload", "workspace_snapshot", "workspace_fork", "workspace_restore", "workspace_delete", "workspace_archive", "workspace_read_file"} {
		if !seen[op+" accepted"] || !seen[op+" finished"] {
			t.Errorf("audit log lacks %s accepted/finished: %v", op, seen)
		}
	}

	// The same through the CLI.
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "src", "pkg"), 0o755)
	os.WriteFile(filepath.Join(dir, "src", "pkg", "a.go"), []byte("package pkg\n"), 0o644)
	os.Symlink("src/pkg/a.go", filepath.Join(dir, "link"))
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(binaries(t), "toolpool"), args...)
		cmd.Env = append(os.Environ(), "TOOLPOOL_URL="+s.url, "TOOLPOOL_TOKEN=dev-token")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("toolpool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if out := cli("ws", "rm", "w3"); !strings.Contains(out, `"deleted": "w3"`) {
		t.Fatalf("ws rm: %s", out)
	}
	if out := cli("ws", "create", "cli", "--from", dir); !strings.Contains(out, `"files": 2`) {
		t.Fatalf("ws create --from DIR: %s", out)
	}
	cli("ws", "push", "cli", dir, "--path", "copy")
	cli("ws", "snapshot", "cli", "first")
	cli("ws", "fork", "cli", "cli2", "--snapshot", "first")
	if out := cli("ws", "ls"); !strings.Contains(out, "cli2") || !strings.Contains(out, "NAME") {
		t.Fatalf("ws ls: %s", out)
	}
	if out := cli("ws", "info", "cli"); !strings.Contains(out, `"name": "first"`) {
		t.Fatalf("ws info: %s", out)
	}
	out := filepath.Join(t.TempDir(), "cli.tar.gz")
	cli("ws", "pull", "cli", "-o", out)
	data, _ := os.ReadFile(out)
	if files := untar(t, data); files["copy/src/pkg/a.go"] != "package pkg\n" || files["src/pkg/a.go"] != "package pkg\n" {
		t.Fatalf("ws pull: %v", files)
	}
	if got := cli("ws", "pull", "cli", "--file", "copy/src/pkg/a.go"); got != "package pkg\n" {
		t.Fatalf("ws pull --file: %q", got)
	}
	cli("ws", "rm", "cli2")
}

// TestWorkspacesSharedByTwoWorkers: two workers with their own data directories share one workspaces
// directory. Uploads of whole trees and archive downloads run at once on both; every archive holds one
// upload whole (operations on a workspace are serialized by its lock on the shared directory). A
// workspace left unused past the idle TTL is removed by a worker's sweep.
func TestWorkspacesSharedByTwoWorkers(t *testing.T) {
	shared := filepath.Join(ctrtest.ShortTempDir(t), "ws")
	cfg := fmt.Sprintf("workspaces_dir: %s\nworkspaces:\n  idle_ttl: 8s\n  sweep_every: 1s\n", shared)
	s := startStackWith(t, stackOptions{policy: permissivePolicy, workerConfig: cfg})
	second := start(t, "worker", "--data-dir", filepath.Join(s.dataDir, "w2"), "--nats-url", s.natsURL,
		"--listen", "127.0.0.1:0", "--id", "e2e-worker-2", "--slots", "4", "--config", filepath.Join(s.dataDir, "worker.yaml"))
	second.WaitLog(t, "worker ready", 60*time.Second)

	if r := s.do(t, http.MethodPut, "/v1/workspaces/shared", "dev-token", nil); r.code != http.StatusCreated {
		t.Fatalf("create: HTTP %d %s", r.code, r.body)
	}
	generation := func(g int) []byte {
		files := map[string]string{}
		for i := range 30 {
			files[fmt.Sprintf("d%d/f%d", i%3, i)] = strings.Repeat(fmt.Sprint(g%10), 2000)
		}
		return tarFiles(t, files)
	}
	workers := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			r := s.do(t, http.MethodPost, "/v1/workspaces/shared/files", "dev-token", generation(g))
			if r.code != http.StatusOK {
				t.Errorf("upload %d: HTTP %d %s", g, r.code, r.body)
				return
			}
			var v struct {
				CallID string `json:"call_id"`
			}
			json.Unmarshal(r.body, &v)
			res := s.do(t, http.MethodGet, "/v1/calls/"+v.CallID, "dev-token", nil).result(t)
			mu.Lock()
			workers[res.Worker]++
			mu.Unlock()
		}()
		go func() {
			defer wg.Done()
			r := s.do(t, http.MethodGet, "/v1/workspaces/shared/archive", "dev-token", nil)
			if r.code != http.StatusOK {
				t.Errorf("archive: HTTP %d %s", r.code, r.body)
				return
			}
			seen := map[string]int{}
			for _, body := range untar(t, r.body) {
				seen[body[:1]]++
			}
			if len(seen) > 1 {
				t.Errorf("an archive mixes uploads: %v", seen)
			}
		}()
	}
	wg.Wait()
	t.Logf("uploads ran on %v", workers)
	if len(workers) < 2 {
		t.Logf("note: every upload ran on one worker this time")
	}

	// Expiry: an unused workspace goes after the idle TTL; one in use stays.
	if r := s.do(t, http.MethodPut, "/v1/workspaces/idle", "dev-token", nil); r.code != http.StatusCreated {
		t.Fatalf("create idle: HTTP %d %s", r.code, r.body)
	}
	inf := wsInfo(t, s.do(t, http.MethodGet, "/v1/workspaces/idle", "dev-token", nil))
	t.Logf("idle workspace: last used %s, expires %s", inf.LastUsedAt.Format(time.RFC3339Nano), inf.ExpiresAt.Format(time.RFC3339Nano))
	if inf.ExpiresAt.Sub(inf.LastUsedAt) != 8*time.Second {
		t.Fatalf("idle workspace: last used %s, expires %s: want the idle TTL (8s) between", inf.LastUsedAt, inf.ExpiresAt)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		s.shell(t, "dev-token", "shared", "true", nil) // keeps "shared" in use
		r := s.do(t, http.MethodGet, "/v1/workspaces/idle", "dev-token", nil)
		if r.code == http.StatusNotFound {
			// Judged by the workers' own account of its last use, not by when this test got the answer
			// to its creation (which can come late on a loaded machine).
			if gone := time.Now(); gone.Before(inf.ExpiresAt) {
				t.Fatalf("removed at %s, before it expired at %s (last used %s, idle TTL 8s)", gone.Format(time.RFC3339Nano),
					inf.ExpiresAt.Format(time.RFC3339Nano), inf.LastUsedAt.Format(time.RFC3339Nano))
			}
			t.Logf("idle workspace removed %s after its last use (idle TTL 8s, sweeps every 1s)", time.Since(inf.LastUsedAt).Round(100*time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idle workspace not removed after 90s: HTTP %d %s", r.code, r.body)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if r := s.do(t, http.MethodGet, "/v1/workspaces/shared", "dev-token", nil); r.code != http.StatusOK {
		t.Fatalf("the workspace in use was removed: HTTP %d %s", r.code, r.body)
	}
}
