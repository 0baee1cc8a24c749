package cluster

import (
	"context"
	"encoding/json"
	"fmt"

	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// TestWorkspacesAcrossNodes: the pool on the three-server NATS cluster, two dispatchers and three workers,
// each worker with a workspaces directory of its own (no shared filesystem), keeping workspaces in
// JetStream's object store at three replicas. Every call appends a line to one file of one workspace and
// counts the lines, so each shows whether it saw every call that completed before it:
//
//   - 20 calls one after the other, through either dispatcher: the first on any worker, which becomes the
//     workspace's resident, and the 19 others routed to it, with no restore;
//   - 6 calls at once through both dispatchers: the workspace's home runs them one at a time, none lost;
//   - kill -9 of the resident while it runs a call in the workspace: 3 calls queued meanwhile are routed
//     to the dead worker's queue, and each runs once on another worker once the dead worker's presence
//     and home lapse; they and the next call see every line of every completed call (and not the line of
//     the call that was killed, which never completed); the killed call ends lost;
//   - SIGTERM of the worker running a call: it drains (the call completes and is checkpointed), exits,
//     and the next call runs elsewhere and sees that call's line too.
//
// The time from the kill to the first queued call running on another worker is logged.
func TestWorkspacesAcrossNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a NATS cluster, dispatchers and workers with containerd")
	}
	began := time.Now()
	p := startPoolWith(t, true)
	t.Logf("pool up in %s", time.Since(began).Round(time.Second))
	urls := p.dispatcherURLs()
	lines := 0
	// appendLine runs one call through url and checks it counted every line before it and its own.
	appendLine := func(url string) *call.Result {
		t.Helper()
		r := p.runCall(url, shellCall("ws", appendAndCount("line"), true))
		lines++
		if r.Status != call.StatusOK {
			t.Fatalf("call %d on %s: %s %+v %s", lines, r.Worker, r.Status, r.Error, r.Output)
		}
		if got, _ := strconv.Atoi(strings.TrimSpace(r.Stdout)); got != lines {
			t.Fatalf("call %d on %s counted %q lines, want %d: it did not see every completed call's line", lines, r.Worker, r.Stdout, lines)
		}
		return r
	}

	// The first call goes to the shared lanes; the worker that ran it is the workspace's resident, and the
	// next 19 are routed to it through either dispatcher: one worker, no restore after the first.
	ran := map[string]int{}
	ran[appendLine(urls[0]).Worker]++
	restoresBefore, routedBefore := p.restores(), p.routed(urls)
	for i := 1; i < 20; i++ {
		ran[appendLine(urls[i%2]).Worker]++
	}
	t.Logf("20 calls one after the other ran on %v", ran)
	if len(ran) != 1 {
		t.Fatalf("20 calls of one workspace ran on %v; want one worker, the workspace's resident", ran)
	}
	if n := p.restores() - restoresBefore; n != 0 {
		t.Fatalf("%d restores after the first call; want none (every call on the resident's copy)", n)
	}
	if n := p.routed(urls) - routedBefore; n != 19 {
		t.Fatalf("%d of the 19 calls after the first were routed to the resident; want all", n)
	}
	p.workspaceOp(urls[0], "ws", "snapshot", map[string]any{"snapshot": "at20"}, http.StatusCreated)

	// At once, through both dispatchers: one at a time under the workspace's home, each on the
	// checkpoint of the one before.
	var wg sync.WaitGroup
	results := make([]*call.Result, 6)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = p.runCall(urls[i%2], shellCall("ws", appendAndCount("line"), true))
		}()
	}
	wg.Wait()
	counts := map[string]bool{}
	for i, r := range results {
		if r.Status != call.StatusOK {
			t.Fatalf("concurrent call %d on %s: %s %+v", i, r.Worker, r.Status, r.Error)
		}
		counts[strings.TrimSpace(r.Stdout)] = true
	}
	lines += len(results)
	if len(counts) != len(results) {
		t.Fatalf("6 calls at once counted %v: two of them ran on the same copy", counts)
	}

	// kill -9 of the worker running a call in the workspace, after the call wrote its line.
	id, ok := submit(urls[0], shellCall("ws", appendLineCmd("killed")+" && sleep 20", false))
	if !ok {
		t.Fatal("the call to kill was not accepted")
	}
	victim := p.runningIn(id, "killed")
	if ran[victim.id] == 0 {
		t.Fatalf("the call to kill ran on %s; want the resident %v", victim.id, ran)
	}
	victim.proc.Kill9(t)
	killed := time.Now()
	// Until the victim's presence lapses the dispatchers still route the workspace's calls to it: these
	// wait in its queue, and another worker takes each once (none lost, none run twice: each appends a
	// line, and the line counts below add up only so).
	routedBefore = p.routed(urls)
	var queued []string
	for i := range 3 {
		id, ok := submit(urls[i%2], shellCall("ws", appendAndCount("after-kill"), false))
		if !ok {
			t.Fatal("a call after the kill was not accepted")
		}
		queued = append(queued, id)
	}
	if n := p.routed(urls) - routedBefore; n != 3 {
		t.Fatalf("%d of the 3 calls after the kill were routed to the dead resident's queue; want 3 (its presence had not lapsed)", n)
	}
	seen, first := map[string]bool{}, time.Time{}
	for _, qid := range queued {
		r := p.await(qid)
		if r.Status != call.StatusOK || r.Worker == victim.id {
			t.Fatalf("call %s queued for the killed worker: %s on %s %+v; want ok on another worker", qid, r.Status, r.Worker, r.Error)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(r.Stdout))
		if n <= lines || n > lines+len(queued) || seen[r.Stdout] {
			t.Fatalf("call %s queued for the killed worker counted %q lines; want one of %d..%d, each once", qid, r.Stdout, lines+1, lines+len(queued))
		}
		seen[r.Stdout] = true
		if first.IsZero() || r.StartedAt.Before(first) {
			first = r.StartedAt
		}
	}
	lines += len(queued)
	t.Logf("kill -9 of %s: the calls queued for it started on other workers from %s after the kill (all done %s after it)",
		victim.id, first.Sub(killed).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	r := appendLine(urls[1])
	if r.Worker == victim.id {
		t.Fatalf("the call after the kill ran on the killed worker %s", victim.id)
	}
	if k := p.await(id); k.Status != call.StatusLost {
		t.Fatalf("the killed call: %s %+v; want lost", k.Status, k.Error)
	}
	// The killed worker's replacement, on its data dir and its stale copy (with the line no checkpoint
	// has), clears what the kill left and takes calls again.
	p.startWorkers(workerSpec{id: victim.id + "-replacement", dataDir: victim.dataDir})

	// SIGTERM of the worker running a call: the call completes, is checkpointed, and the worker exits.
	id, ok = submit(urls[1], shellCall("ws", appendLineCmd("drained")+" && sleep 3 && "+appendAndCount("after-drain"), false))
	if !ok {
		t.Fatal("the call to drain was not accepted")
	}
	drained := p.runningIn(id, "drained")
	if err := drained.proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if d := p.await(id); d.Status != call.StatusOK || strings.TrimSpace(d.Stdout) != strconv.Itoa(lines+2) {
		t.Fatalf("the call on the draining worker: %s %q %+v; want ok with %d lines", d.Status, d.Stdout, d.Error, lines+2)
	}
	lines += 2
	select {
	case <-drained.proc.Done():
	case <-time.After(time.Minute):
		t.Fatalf("the draining worker %s did not exit within a minute", drained.id)
	}
	r = appendLine(urls[0])
	if r.Worker == drained.id {
		t.Fatalf("the call after the drain ran on the stopped worker %s", drained.id)
	}
	t.Logf("SIGTERM of %s: it drained and exited; the next call ran on %s, %s after the signal", drained.id, r.Worker,
		time.Since(stopped).Round(time.Millisecond))

	// The snapshot taken after the first 20 calls (its worker may be gone since): restored through the
	// other dispatcher, the workspace holds its 20 lines; a fork of it too.
	p.workspaceOp(urls[1], "ws", "restore", map[string]any{"snapshot": "at20"}, http.StatusOK)
	lines = 20
	appendLine(urls[0])
	p.workspaceOp(urls[0], "ws", "fork", map[string]any{"to": "branch", "snapshot": "at20"}, http.StatusCreated)
	if r := p.runCall(urls[1], shellCall("branch", "wc -l < log.txt", true)); r.Status != call.StatusOK || strings.TrimSpace(r.Stdout) != "20" {
		t.Fatalf("the fork of the snapshot: %s %q %+v; want its 20 lines", r.Status, r.Stdout, r.Error)
	}
}

// restores counts the restores that changed a copy, on every worker started so far ("workspace restored
// from its checkpoint" in their logs).
func (p *pool) restores() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, w := range p.workers {
		n += strings.Count(w.proc.Output(), "workspace restored from its checkpoint")
	}
	return n
}

// routed sums toolpool_calls_routed_total{to="resident"} over the dispatchers at urls.
func (p *pool) routed(urls []string) int {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	total := 0
	for _, url := range urls {
		code, data, err := do(ctx, http.MethodGet, url+"/metrics", nil)
		if err != nil || code != http.StatusOK {
			p.t.Fatalf("metrics of %s: HTTP %d %v", url, code, err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, `toolpool_calls_routed_total{to="resident"} `); ok {
				n, _ := strconv.ParseFloat(v, 64)
				total += int(n)
			}
		}
	}
	return total
}

// workspaceOp posts op (snapshot, fork, restore) of workspace ws with body through url and checks the
// answer's status.
func (p *pool) workspaceOp(url, ws, op string, body map[string]any, want int) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, data, err := do(ctx, http.MethodPost, url+"/v1/workspaces/"+ws+"/"+op, body)
	if err != nil || code != want {
		p.t.Fatalf("%s of workspace %s: HTTP %d %v: %.300s", op, ws, code, err, data)
	}
}

// appendLineCmd appends line to log.txt (awk: the pool's policy asks a person about shell redirections).
func appendLineCmd(line string) string {
	return fmt.Sprintf(`awk 'BEGIN{print "%s" >> "log.txt"}'`, line)
}

// appendAndCount appends line to log.txt and prints how many lines it has.
func appendAndCount(line string) string {
	return fmt.Sprintf(`awk 'BEGIN{print "%s" >> "log.txt"; close("log.txt"); while ((getline l < "log.txt") > 0) n++; print n}'`, line)
}

// runningIn waits until call id runs and has written line to log.txt in its worker's copy of workspace
// ws, and returns that worker.
func (p *pool) runningIn(id, line string) *workerProc {
	p.t.Helper()
	var w *workerProc
	eventually(p.t, time.Minute, "call "+id+" to write "+line, func() bool {
		r, err := p.get(id)
		if err != nil || r.Status != call.StatusRunning {
			return false
		}
		if w = p.worker(r.Worker); w == nil {
			return false
		}
		b, _ := os.ReadFile(filepath.Join(w.dataDir, "ws", "t1", "ws", "log.txt"))
		return strings.Contains(string(b), line)
	})
	return w
}

// shellCall is a run_shell call into workspace ws; wait: whether POST waits for the result.
func shellCall(ws, command string, wait bool) map[string]any {
	return map[string]any{"tool": "run_shell", "workspace": ws, "wait": wait, "args": map[string]any{"command": command}}
}

// runCall posts a call that waits for its result through url, and returns the result.
func (p *pool) runCall(url string, body map[string]any) *call.Result {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	code, data, err := do(ctx, http.MethodPost, url+"/v1/calls", body)
	if err != nil {
		p.t.Fatalf("call: %v", err)
	}
	var r call.Result
	if err := json.Unmarshal(data, &r); err != nil || r.ID == "" {
		p.t.Fatalf("call: HTTP %d %v: %.300s", code, err, data)
	}
	if !r.Status.Terminal() {
		return p.await(r.ID)
	}
	return &r
}

// worker returns the live worker named id, nil when there is none.
func (p *pool) worker(id string) *workerProc {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.workers[id]
}
