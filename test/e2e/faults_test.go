package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/sandbox/containerd/ctrtest"
	"github.com/toolpool/toolpool/internal/testproc"
)

// The fault tests run mutating calls that append one line to their own file in the workspace, then stay
// busy; after the fault, every accepted call must have exactly one final state and no file more than one
// line: no mutating call ran twice.

// The lease is how long a NATS outage a running call survives: its worker stops a call it could not renew
// the lease of for that long (less a heartbeat). The ack wait must cover the lease. The warm pool is off:
// the fault tests prove that nothing is left by counting every container of the worker's containerd, and
// a pool's ready containers are there by design (the pool's own crash recovery is
// TestPoolOrphansAfterCrash's, in internal/sandbox/containerd).
const faultWorkerConfig = "heartbeat: 300ms\nlease: 4s\npool: {max_size: 0}\n"
const faultQueueConfig = "  queue_timeout: 5m\nqueue:\n  ack_wait: 5s\n"

// appendCall is a mutating call that records its run in count-<n> and then sleeps for sleep seconds. The
// sleep length is unusual so that leftover processes can be recognised.
func appendCall(n int, sleep string) map[string]any {
	return map[string]any{"tool": "run_shell", "workspace": "faults", "wait": false,
		"args": map[string]any{"command": fmt.Sprintf(`awk 'BEGIN{print "ran" >> "count-%d"}' && sleep %s && echo finished`, n, sleep)}}
}

func (s *stack) submit(t *testing.T, n int, sleep string) []string {
	t.Helper()
	var ids []string
	for i := range n {
		r := s.do(t, http.MethodPost, "/v1/calls", "dev-token", appendCall(i, sleep))
		if r.code != http.StatusAccepted {
			t.Fatalf("submit %d: HTTP %d %s", i, r.code, r.body)
		}
		ids = append(ids, r.result(t).ID)
	}
	return ids
}

func (s *stack) workspaceFile(name string) string {
	return filepath.Join(s.dataDir, "w", "workspaces", "dev", "faults", name)
}

// waitRunning waits until every call's file exists: each has started its command.
func (s *stack) waitRunning(t *testing.T, n int) {
	t.Helper()
	waitFor(t, 60*time.Second, "every call started", func() bool {
		for i := range n {
			if _, err := os.Stat(s.workspaceFile(fmt.Sprintf("count-%d", i))); err != nil {
				return false
			}
		}
		return true
	})
}

// finalStates waits for each call's final state and checks that no call ran twice.
func (s *stack) finalStates(t *testing.T, ids []string) map[call.Status]int {
	t.Helper()
	counts := map[call.Status]int{}
	for i, id := range ids {
		deadline := time.Now().Add(2 * time.Minute)
		var res *call.Result
		for {
			r := s.do(t, http.MethodGet, "/v1/calls/"+id+"?wait=20s", "dev-token", nil)
			if r.code == http.StatusOK || r.code == http.StatusForbidden {
				res = r.result(t)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("call %d (%s) has no final state: HTTP %d %s", i, id, r.code, r.body)
			}
		}
		counts[res.Status]++
		data, err := os.ReadFile(s.workspaceFile(fmt.Sprintf("count-%d", i)))
		if err == nil && strings.Count(string(data), "ran\n") > 1 {
			t.Errorf("call %d (%s) ran %d times", i, id, strings.Count(string(data), "ran\n"))
		}
	}
	return counts
}

// startFaultStack starts a stack for the fault tests, which also need ctr (it comes with containerd) to
// list the worker's containers: checked up front, so that a host without it fails (CI=true) or skips at
// once, not on a timeout.
func startFaultStack(t *testing.T) *stack {
	t.Helper()
	ctrtest.RequirePrograms(t, "ctr")
	return startStackWith(t, stackOptions{policy: permissivePolicy, workerConfig: faultWorkerConfig, extraConfig: faultQueueConfig})
}

// assertNothingLeft checks that the worker's containerd holds no container and that nothing of the calls
// ids is left on the host: no cgroup directory in any hierarchy and no process in their cgroups. It looks
// only at this stack's containerd and calls (other tests on the host use the same namespace name).
func (s *stack) assertNothingLeft(t *testing.T, ids []string) {
	t.Helper()
	sock := filepath.Join(s.dataDir, "w", "containerd", "containerd.sock")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left []string
		out, err := exec.Command("ctr", "-a", sock, "-n", "toolpool", "containers", "ls", "-q").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			left = append(left, fmt.Sprintf("containers: %q (%v)", out, err))
		}
		for _, id := range ids {
			if cg, err := ctrtest.ContainerCgroup("toolpool", id); err != nil || !cg.Empty() {
				left = append(left, fmt.Sprintf("%s (%v)", cg, err))
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind 30s after the calls ended: %s", strings.Join(left, "; "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWorkerKilledMidCall: kill -9 of a worker running mutating calls. They end lost, never run twice, and
// the restarted worker clears what the dead one left.
func TestWorkerKilledMidCall(t *testing.T) {
	s := startFaultStack(t)
	ids := s.submit(t, 4, "41.25")
	s.waitRunning(t, 4)
	s.worker.Kill9(t)
	s.startWorker(t)
	counts := s.finalStates(t, ids)
	if counts[call.StatusLost] != 4 {
		t.Fatalf("final states %v, want 4 lost", counts)
	}
	s.assertNothingLeft(t, ids)
	// The restarted worker serves new calls.
	if r := s.shell(t, "dev-token", "faults", "echo alive", nil); r.result(t).Stdout != "alive\n" {
		t.Fatalf("after restart: %s", r.body)
	}
}

// TestDispatcherRestartMidCall: the dispatcher (and its embedded NATS) restarts while calls run. Every
// call finishes once, and its result is readable from the new dispatcher.
func TestDispatcherRestartMidCall(t *testing.T) {
	s := startFaultStack(t)
	ids := s.submit(t, 4, "2.75")
	s.waitRunning(t, 4)
	s.dispatcher.Stop(t)
	s.startDispatcher(t)
	counts := s.finalStates(t, ids)
	if counts[call.StatusOK] != 4 {
		t.Fatalf("final states %v, want 4 ok", counts)
	}
	s.assertNothingLeft(t, ids)
}

// TestExternalNATSRestart: with an external NATS server, the server restarts while calls run.
func TestExternalNATSRestart(t *testing.T) {
	storeDir := t.TempDir()
	port := freePort(t)
	startNATS := func() *testproc.Proc { return startNATSServer(t, storeDir, port) }
	ctrtest.RequirePrograms(t, "ctr")
	nats := startNATS()
	s := startStackWith(t, stackOptions{policy: permissivePolicy, workerConfig: faultWorkerConfig, extraConfig: faultQueueConfig,
		natsURL: fmt.Sprintf("nats://127.0.0.1:%d", port)})
	ids := s.submit(t, 4, "2.5")
	s.waitRunning(t, 4)
	nats.Stop(t)
	time.Sleep(time.Second) // the outage: the server is down for this long
	startNATS()
	stopFirst(t, s.worker)
	counts := s.finalStates(t, ids)
	if counts[call.StatusOK] != 4 {
		t.Fatalf("final states %v, want 4 ok", counts)
	}
	// Calls accepted after the restart run too.
	if r := s.shell(t, "dev-token", "faults", "echo after", nil); r.result(t).Stdout != "after\n" {
		t.Fatalf("after restart: %s", r.body)
	}
	s.assertNothingLeft(t, ids)
}

// TestContainerdDiesUnderWorker: the worker's private containerd is killed while calls run. Those calls end
// once (with an error), containerd comes back, and the worker serves again with nothing left behind.
func TestContainerdDiesUnderWorker(t *testing.T) {
	s := startFaultStack(t)
	ids := s.submit(t, 3, "43.5")
	s.waitRunning(t, 3)
	config := filepath.Join(s.dataDir, "w", "containerd", "config.toml")
	pids := testproc.ProcessesWith("--config " + config)
	if len(pids) != 1 {
		t.Fatalf("found %d private containerd processes: %v", len(pids), pids)
	}
	var pid int
	fmt.Sscan(pids[0], &pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.worker.WaitLog(t, "restarted private containerd", 30*time.Second)
	counts := s.finalStates(t, ids)
	t.Logf("final states after containerd died: %v", counts)
	// The calls sleep 43.5 s and their containerd died under them: none can have finished normally.
	total := 0
	for st, n := range counts {
		if !st.Terminal() {
			t.Errorf("%d calls in non-final state %s", n, st)
		}
		total += n
	}
	if total != 3 || counts[call.StatusOK] != 0 {
		t.Fatalf("final states %v: want 3 final states, none ok", counts)
	}
	s.assertNothingLeft(t, ids)
	if r := s.shell(t, "dev-token", "faults", "echo back", nil); r.result(t).Stdout != "back\n" {
		t.Fatalf("after containerd restart: %s", r.body)
	}
}

// startNATSServer starts a JetStream nats-server on 127.0.0.1:port storing under storeDir, with extra
// arguments, and waits until it listens.
func startNATSServer(t testing.TB, storeDir string, port int, extra ...string) *testproc.Proc {
	t.Helper()
	p := start(t, "nats-server", append([]string{"-js", "-sd", storeDir, "-a", "127.0.0.1", "-p", fmt.Sprint(port)}, extra...)...)
	waitFor(t, 30*time.Second, "nats-server listening", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return p
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// tickTool is a read-only custom tool that prints ticks: a call of it whose worker is lost runs again.
const tickTool = `
tools:
  custom:
    - name: ticks
      description: Print six ticks, one every 400 ms.
      kind: read
      schema: {type: object, additionalProperties: false}
      command: ["/bin/sh", "-c", "for i in 1 2 3 4 5 6; do echo tick-$i; sleep 0.4; done"]
`

// TestFollowerSeesARunAgainStartOver: kill -9 of the worker running a read-only command call that a
// reader follows. The call runs again on the next worker, from byte 0: the reader gets a restart event
// (attempt 2), then the new attempt's output from its first byte, and what it read after the restart is
// exactly the result's stdout; a reader that comes back with an id of the first attempt starts over too.
func TestFollowerSeesARunAgainStartOver(t *testing.T) {
	ctrtest.RequirePrograms(t, "ctr")
	s := startStackWith(t, stackOptions{policy: permissivePolicy, workerConfig: faultWorkerConfig + tickTool, extraConfig: faultQueueConfig + tickTool})
	r := s.do(t, http.MethodPost, "/v1/calls", "dev-token", map[string]any{"tool": "ticks", "workspace": "faults", "args": map[string]any{}, "wait": false})
	if r.code != http.StatusAccepted {
		t.Fatalf("submit: HTTP %d %s", r.code, r.body)
	}
	id := r.result(t).ID
	var (
		before, after []byte // stdout read before and after the restart
		restarted     bool
		firstID       string // an event id of the first attempt
		res           *call.Result
	)
	events(t, s.request(t, http.MethodGet, "/v1/calls/"+id+"/events", "dev-token", nil), func(ev sseEvent) bool {
		switch ev.name {
		case "stdout":
			off, b := outputBytes(t, ev)
			dst := &before
			if restarted {
				dst = &after
			}
			if off != int64(len(*dst)) {
				t.Fatalf("stdout at offset %d after %d bytes of this attempt (restarted %v)", off, len(*dst), restarted)
			}
			*dst = append(*dst, b...)
			if !restarted && firstID == "" {
				firstID = ev.id
				s.worker.Kill9(t) // mid-call: tick-1 is printed, five more to come
				s.startWorker(t)
			}
		case "restart":
			var rs struct {
				Attempt uint64 `json:"attempt"`
			}
			if err := json.Unmarshal(ev.data, &rs); err != nil || rs.Attempt < 2 || ev.id != fmt.Sprintf("0.0.%d", rs.Attempt) {
				t.Fatalf("restart event %s %s, want a later attempt at its start", ev.id, ev.data)
			}
			restarted = true
		case "result":
			res = &call.Result{}
			if err := json.Unmarshal(ev.data, res); err != nil {
				t.Fatal(err)
			}
			return false
		}
		return true
	})
	want := "tick-1\ntick-2\ntick-3\ntick-4\ntick-5\ntick-6\n"
	if res == nil || res.Status != call.StatusOK || res.Attempt < 2 || res.Stdout != want {
		t.Fatalf("result %+v, want ok on a later attempt with the six ticks", res)
	}
	if !restarted || string(after) != want || !strings.HasPrefix(want, string(before)) || len(before) == 0 {
		t.Fatalf("restarted %v; read %q before and %q after, want the first attempt's start, then the six ticks", restarted, before, after)
	}
	// Back with an id of the first attempt, after the call ended: told, then the whole stored output.
	var names []string
	var again []byte
	req := s.request(t, http.MethodGet, "/v1/calls/"+id+"/events", "dev-token", nil)
	if !strings.HasSuffix(firstID, ".1") {
		t.Fatalf("the first stdout event's id %q is not of attempt 1", firstID)
	}
	req.Header.Set("Last-Event-ID", firstID)
	events(t, req, func(ev sseEvent) bool {
		names = append(names, ev.name)
		if ev.name == "stdout" {
			_, b := outputBytes(t, ev)
			again = append(again, b...)
		}
		return ev.name != "result"
	})
	if len(names) < 3 || names[0] != "restart" || names[1] != "status" || string(again) != want {
		t.Fatalf("resumed with %s: events %v, stdout %q; want restart, status, then the six ticks", firstID, names, again)
	}
}
