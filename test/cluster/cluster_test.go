package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// Every fault runs mutating calls that append one line to their own file in the shared workspace, so a
// second execution shows wherever it ran. Each fault counts every call it submitted.

// tally is what one fault did to the calls accepted around it.
type tally struct {
	name                                  string
	accepted, refused, final, lost, twice int
	leaked                                int
	states                                map[call.Status]int
}

func (f *tally) String() string {
	return fmt.Sprintf("| %s | %d | %d | %d | %d | %d | %d |", f.name, f.accepted, f.final, f.accepted-f.final, f.lost, f.twice, f.leaked)
}

// appendCall runs a command that records its run in count-<tag> and then sleeps; the sleep length marks
// its processes.
func appendCall(tag, sleep string, extra map[string]any) map[string]any {
	body := map[string]any{"tool": "run_shell", "workspace": "faults", "wait": false,
		"args": map[string]any{"command": fmt.Sprintf(`awk 'BEGIN{print "ran" >> "count-%s"}' && sleep %s && echo finished`, tag, sleep)}}
	for k, v := range extra {
		body[k] = v
	}
	return body
}

// submit posts a call to url; it returns the call's id when the call was accepted.
func submit(url string, body map[string]any) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, data, err := do(ctx, http.MethodPost, url+"/v1/calls", body)
	if err != nil || (code != http.StatusOK && code != http.StatusAccepted) {
		return "", false
	}
	var r call.Result
	if json.Unmarshal(data, &r) != nil || r.ID == "" {
		return "", false
	}
	return r.ID, true
}

// batch submits n calls tagged prefix-i, alternating between the live dispatchers; every one must be
// accepted. It returns tag by id.
func (p *pool) batch(prefix string, n int, sleep string) map[string]string {
	p.t.Helper()
	tags := map[string]string{}
	urls := p.dispatcherURLs()
	for i := range n {
		tag := fmt.Sprintf("%s-%d", prefix, i)
		id, ok := submit(urls[i%len(urls)], appendCall(tag, sleep, nil))
		if !ok {
			p.t.Fatalf("call %s was not accepted", tag)
		}
		tags[id] = tag
	}
	return tags
}

// running waits until every call has started its command, and returns the worker of each.
func (p *pool) running(tags map[string]string) map[string]string {
	p.t.Helper()
	workers := map[string]string{}
	eventually(p.t, 90*time.Second, "every call to run", func() bool {
		for id, tag := range tags {
			if _, ok := workers[id]; ok {
				continue
			}
			r, err := p.get(id)
			if err != nil || r.Status != call.StatusRunning || p.runs(tag) == 0 {
				return false
			}
			workers[id] = r.Worker
		}
		return true
	})
	return workers
}

// settle waits for every call's final state and counts it into f: states, lost, executed twice, and
// the containers and processes left behind once things settled.
func (p *pool) settle(f *tally, tags map[string]string, marker string) map[string]*call.Result {
	p.t.Helper()
	if f.states == nil {
		f.states = map[call.Status]int{}
	}
	results := map[string]*call.Result{}
	for id, tag := range tags {
		r := p.await(id)
		results[id] = r
		f.accepted++
		if r.Status.Terminal() {
			f.final++
		}
		f.states[r.Status]++
		if r.Status == call.StatusLost {
			f.lost++
		}
		if n := p.runs(tag); n > 1 {
			f.twice++
			p.t.Errorf("%s: call %s (%s) ran %d times", f.name, id, tag, n)
		}
	}
	f.leaked = p.leaked(marker)
	return results
}

// check fails the test unless every accepted call ended once, none twice, nothing leaked, and lost is
// what the fault explains.
func (p *pool) check(f *tally, wantLost int) {
	p.t.Helper()
	p.t.Logf("%s: %d accepted (%d refused), final states %v, %d lost, %d twice, %d leaked", f.name, f.accepted, f.refused, f.states, f.lost, f.twice, f.leaked)
	if f.final != f.accepted || f.twice != 0 || f.leaked != 0 || f.lost != wantLost {
		p.t.Fatalf("%s: want every accepted call final once, %d lost, nothing leaked", f.name, wantLost)
	}
}

// TestCluster runs the pool on a three-server NATS cluster and makes each fault in turn, counting every
// accepted call: final, lost, executed twice, containers leaked.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a NATS cluster, dispatchers and workers with containerd")
	}
	began := time.Now()
	p := startPool(t)
	t.Logf("pool up in %s: NATS at %s", time.Since(began).Round(time.Second), p.nats.urls())
	var table []*tally
	defer func() {
		var b strings.Builder
		b.WriteString("\n| fault | accepted | final | without final | lost | executed twice | containers leaked |\n|---|---|---|---|---|---|---|\n")
		for _, f := range table {
			b.WriteString(f.String() + "\n")
		}
		t.Logf("fault table (%s in all):%s", time.Since(began).Round(time.Second), b.String())
	}()

	// 1. A NATS server dies (the leader of the calls stream) while calls are being submitted and run. The
	// cluster keeps serving: calls refused while the stream elects a leader are refused, never half
	// taken; every accepted one finishes, none is lost.
	{
		f := &tally{name: "kill -9 of a NATS server (calls stream leader) under load"}
		table = append(table, f)
		var mu sync.Mutex
		tags := map[string]string{}
		var wg sync.WaitGroup
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 15 {
					urls := p.dispatcherURLs()
					tag := fmt.Sprintf("nats-%d-%d", g, i)
					id, ok := submit(urls[(g+i)%len(urls)], appendCall(tag, "2.125", nil))
					mu.Lock()
					if ok {
						tags[id] = tag
					} else {
						f.refused++
					}
					mu.Unlock()
					time.Sleep(200 * time.Millisecond) // the load's pace, not synchronisation
				}
			}()
		}
		eventually(t, time.Minute, "load before the fault", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(tags) >= 8
		})
		victim := p.nats.leaderOf(t, "TOOLPOOL_CALLS")
		t.Logf("killing %s, the calls stream's leader", victim.name)
		victim.proc.Kill9(t)
		wg.Wait()
		p.settle(f, tags, "2.125")
		p.check(f, 0)
		p.nats.restart(t, victim)
	}

	// 2. A worker dies mid-call and is replaced under another id on the same node (its data dir: the
	// old containers survive in the restarted containerd). Its mutating calls end lost, never run again;
	// the others finish; the replacement removes the old containers once their leases lapse.
	{
		f := &tally{name: "kill -9 of a worker mid-call, replaced under another id"}
		table = append(table, f)
		tags := p.batch("kill", 6, "12.125")
		workers := p.running(tags)
		victim := workers[firstKey(workers)]
		w := p.workers[victim]
		t.Logf("killing worker %s (%d calls)", victim, count(workers, victim))
		w.proc.Kill9(t)
		p.startWorkers(workerSpec{id: victim + "-replacement", dataDir: w.dataDir})
		results := p.settle(f, tags, "12.125")
		p.check(f, count(workers, victim))
		lostExactly(t, results, workers, victim)
	}

	// 3. A dispatcher dies while clients wait on it. They retry on the other one with the same
	// idempotency keys and get their calls' results; no call runs twice. The same key with other
	// arguments is refused with 409.
	{
		f := &tally{name: "kill -9 of a dispatcher mid-request"}
		table = append(table, f)
		a := p.dispatchers["a"]
		for i := range 6 {
			go submit(a.url, appendCall(fmt.Sprintf("disp-%d", i), "5.125", map[string]any{"wait": true, "idempotency_key": fmt.Sprintf("disp-%d", i)}))
		}
		eventually(t, 90*time.Second, "the waited-on calls to run", func() bool {
			for i := range 6 {
				if p.runs(fmt.Sprintf("disp-%d", i)) == 0 {
					return false
				}
			}
			return true
		})
		a.proc.Kill9(t)
		b := p.dispatchers["b"]
		tags := map[string]string{}
		for i := range 6 {
			tag := fmt.Sprintf("disp-%d", i)
			id, ok := submit(b.url, appendCall(tag, "5.125", map[string]any{"idempotency_key": tag}))
			if !ok {
				t.Fatalf("the retry of %s on the other dispatcher was refused", tag)
			}
			tags[id] = tag
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		code, body, err := do(ctx, http.MethodPost, b.url+"/v1/calls", appendCall("disp-0", "9", map[string]any{"idempotency_key": "disp-0"}))
		cancel()
		if err != nil || code != http.StatusConflict || !strings.Contains(string(body), "idempotency_key_reused") {
			t.Fatalf("the same key with other arguments: HTTP %d %v %s", code, err, body)
		}
		p.settle(f, tags, "5.125")
		p.check(f, 0)
		p.startDispatchers("c")
	}

	// 4. A worker freezes (SIGSTOP) for longer than its lease and its ack wait, then resumes. Its calls
	// are judged lost by the others meanwhile (mutating: not run again); when it resumes it finds its
	// lease's deadline passed on its own clock, kills its containers and records nothing.
	{
		f := &tally{name: "worker frozen (SIGSTOP) past its lease, then resumed"}
		table = append(table, f)
		tags := p.batch("stop", 6, "10.125")
		workers := p.running(tags)
		victim := workers[firstKey(workers)]
		w := p.workers[victim]
		t.Logf("freezing worker %s (%d calls) for %s", victim, count(workers, victim), ackWait+3*time.Second)
		if err := w.proc.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(ackWait + 3*time.Second) // the freeze: the fault itself, not synchronisation
		if err := w.proc.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		results := p.settle(f, tags, "10.125")
		p.check(f, count(workers, victim))
		lostExactly(t, results, workers, victim)
		w.proc.WaitLog(t, "lease not renewed in time: the call was stopped and nothing is recorded", 30*time.Second)
	}

	// 5. Two workers' clocks are an hour apart (one ahead, one behind), and the third is stopped so
	// that they run everything. Deadlines and leases go by the NATS server's clock: every call runs once
	// and none expires; when the worker behind dies mid-call, its calls end lost (judged by the lease on
	// the server, whatever the clocks say), and a replacement on its node removes its containers.
	{
		f := &tally{name: "clock skew of +1h and -1h between two workers"}
		table = append(table, f)
		ids := p.liveWorkers()
		ahead, behind, idle := p.workers[ids[0]], p.workers[ids[1]], p.workers[ids[2]]
		idle.proc.Stop(t)
		ahead.proc.Stop(t)
		behind.proc.Stop(t)
		skewed := p.startWorkers(workerSpec{id: ahead.id, dataDir: ahead.dataDir, env: []string{"TOOLPOOL_TEST_CLOCK_SKEW=1h"}},
			workerSpec{id: behind.id, dataDir: behind.dataDir, env: []string{"TOOLPOOL_TEST_CLOCK_SKEW=-1h"}})
		behind = skewed[1]
		tags := p.batch("skew", 8, "1.125")
		p.settle(f, tags, "1.125")
		if f.states[call.StatusOK] != 8 {
			t.Fatalf("%s: final states %v, want 8 ok", f.name, f.states)
		}
		long := p.batch("skewkill", 6, "12.25")
		workers := p.running(long)
		t.Logf("killing worker %s (clock -1h, %d calls)", behind.id, count(workers, behind.id))
		behind.proc.Kill9(t)
		// Its node's next worker (another id, no skew) removes what it left; the idle one comes back.
		p.startWorkers(workerSpec{id: behind.id + "-replacement", dataDir: behind.dataDir}, workerSpec{id: idle.id, dataDir: idle.dataDir})
		results := p.settle(f, long, "12.25")
		p.check(f, count(workers, behind.id))
		lostExactly(t, results, workers, behind.id)
	}

	// 6. Outputs larger than a NATS message on servers at their stock limits (1 MiB max payload): 5 MB of
	// text and 1 MiB of NUL bytes (6 MiB as JSON) come back whole, from either dispatcher.
	{
		f := &tally{name: "5 MB output and 1 MiB of NUL bytes, stock max payload", states: map[call.Status]int{}}
		table = append(table, f)
		for _, tt := range []struct {
			command string
			want    string
		}{
			{`head -c 5000000 /dev/zero | tr '\0' x`, strings.Repeat("x", 5000000)},
			{`head -c 1048576 /dev/zero`, strings.Repeat("\x00", 1<<20)},
		} {
			urls := p.dispatcherURLs()
			id, ok := submit(urls[0], map[string]any{"tool": "run_shell", "workspace": "big", "output_bytes": 8 << 20, "wait": false,
				"args": map[string]any{"command": tt.command}})
			if !ok {
				t.Fatalf("%q was not accepted", tt.command)
			}
			f.accepted++
			for _, url := range urls {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				code, body, err := do(ctx, http.MethodGet, url+"/v1/calls/"+id+"?wait=50s", nil)
				cancel()
				var r call.Result
				if err != nil || code != http.StatusOK || json.Unmarshal(body, &r) != nil {
					t.Fatalf("%q from %s: HTTP %d %v %.300s", tt.command, url, code, err, body)
				}
				if r.Status != call.StatusOK || r.Stdout != tt.want || r.Truncated || len(r.Stored) != 0 {
					t.Fatalf("%q from %s: status %s, %d bytes of stdout (want %d), truncated %v, stored %v", tt.command, url, r.Status, len(r.Stdout), len(tt.want), r.Truncated, r.Stored)
				}
			}
			f.final++
			f.states[call.StatusOK]++
		}
		f.leaked = p.leaked("never-a-marker")
		p.check(f, 0)
	}

	// 7. A reader on the other dispatcher joins a running call late: it gets what was printed so far at
	// once, from the replicated live stream, then each later line as printed, and the whole stdout.
	lateReader(t, p)
}

// lateReader runs a call printing a tick a second through one dispatcher and follows it from the other,
// joining 2.2 s after the call started running. On this loaded pool each tick must come within a second;
// the 250 ms target is test/e2e's TestLiveReadersJoinAnyTime.
func lateReader(t *testing.T, p *pool) {
	urls := p.dispatcherURLs()
	id, ok := submit(urls[0], map[string]any{"tool": "run_shell", "workspace": "live", "wait": false,
		"args": map[string]any{"command": `for i in 1 2 3 4 5; do echo "tick-$i $(date +%s%N)"; sleep 1; done`}})
	if !ok {
		t.Fatal("the tick call was not accepted")
	}
	eventually(t, 2*time.Minute, "the tick call running", func() bool {
		r, err := p.get(id)
		return err == nil && r.Status == call.StatusRunning
	})
	time.Sleep(2200 * time.Millisecond) // the scenario: join late
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, urls[1]+"/v1/calls/"+id+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer t1-token")
	req.Header.Set("Accept", "text/event-stream")
	joined := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var stdout strings.Builder
	var lines []string
	before, ended := 0, false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var name string
	for !ended && sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = line[7:]
		case strings.HasPrefix(line, "data: ") && name == "result":
			ended = true
		case strings.HasPrefix(line, "data: ") && name == "stdout":
			var ev struct {
				Offset int64  `json:"offset"`
				Text   string `json:"text"`
			}
			if err := json.Unmarshal([]byte(line[6:]), &ev); err != nil || ev.Offset != int64(stdout.Len()) {
				t.Fatalf("stdout event %s after %d bytes (%v)", line, stdout.Len(), err)
			}
			stdout.WriteString(ev.Text)
			got := time.Now()
			for _, l := range strings.SplitAfter(stdout.String(), "\n")[len(lines):] {
				var n int
				var ns int64
				if !strings.HasSuffix(l, "\n") {
					break
				}
				if _, err := fmt.Sscanf(l, "tick-%d %d", &n, &ns); err != nil {
					t.Fatalf("line %q is not a tick", l)
				}
				lines = append(lines, l)
				printed := time.Unix(0, ns)
				late := got.Sub(printed)
				if printed.Before(joined) {
					before++
					late = got.Sub(joined)
				}
				t.Logf("the late reader on the other dispatcher: tick-%d %s after it was printed or the reader joined", n, late.Round(time.Millisecond))
				if late > time.Second {
					t.Errorf("tick-%d came %s late", n, late.Round(time.Millisecond))
				}
			}
		}
	}
	if !ended || len(lines) != 5 || before < 2 {
		t.Errorf("the late reader: result %v, %d ticks (%d printed before it joined, want at least 2): %q", ended, len(lines), before, stdout.String())
	}
}

// TestClusterBench runs `toolpool bench` at concurrency 16 for TOOLPOOL_CLUSTER_BENCH (a duration) against
// one dispatcher of a fresh pool: three NATS servers, two dispatchers, three workers of 4 slots. Opt-in.
func TestClusterBench(t *testing.T) {
	d := os.Getenv("TOOLPOOL_CLUSTER_BENCH")
	if d == "" {
		t.Skip("set TOOLPOOL_CLUSTER_BENCH=30s to run")
	}
	p := startPool(t)
	cmd := exec.Command(bin(t, "toolpool"), "bench", "--concurrency", "16", "--duration", d, "--workspace", "bench")
	cmd.Env = append(os.Environ(), "TOOLPOOL_URL="+p.dispatcherURLs()[0], "TOOLPOOL_TOKEN=t1-token")
	out, err := cmd.CombinedOutput()
	t.Logf("toolpool bench --concurrency 16 --duration %s against %d workers:\n%s", d, len(p.liveWorkers()), out)
	if err != nil {
		t.Errorf("bench: %v", err)
	}
	// Where the time went, from the workers' "call finished" lines.
	var n, total, sandbox, run float64
	for _, id := range p.liveWorkers() {
		for _, line := range strings.Split(p.workers[id].proc.Output(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) != nil || m["msg"] != "call finished" {
				continue
			}
			n++
			total += m["total_ms"].(float64)
			sandbox += m["sandbox_ms"].(float64)
			run += m["run_ms"].(float64)
		}
	}
	if n > 0 {
		t.Logf("per call, on average over %.0f: %.0f ms in all, %.0f ms creating the sandbox, %.0f ms running, %.0f ms queued and recording",
			n, total/n, sandbox/n, run/n, (total-sandbox-run)/n)
	}
}

// lostExactly fails the test unless the calls that ended lost are exactly those of worker victim.
func lostExactly(t *testing.T, results map[string]*call.Result, workers map[string]string, victim string) {
	t.Helper()
	for id, r := range results {
		if (workers[id] == victim) != (r.Status == call.StatusLost) {
			t.Fatalf("call %s of worker %s ended %s (worker %s was the one killed or frozen)", id, workers[id], r.Status, victim)
		}
	}
}

// liveWorkers lists the ids of the workers running now, sorted.
func (p *pool) liveWorkers() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for id, w := range p.workers {
		if !w.proc.Exited() {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

func firstKey(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys[0]
}

func count(workers map[string]string, id string) int {
	n := 0
	for _, w := range workers {
		if w == id {
			n++
		}
	}
	return n
}
