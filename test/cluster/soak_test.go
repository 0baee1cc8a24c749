package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// The soak: the pool on the three-server cluster under steady load while servers, workers and a
// dispatcher are killed at random, counting for every call what its client was told, its final state and
// how often it ran. Opt-in (make soak): TOOLPOOL_SOAK is its length, TOOLPOOL_SOAK_SEED replays a run's
// fault schedule, TOOLPOOL_SOAK_REPORT names a file for the Markdown report.

const (
	soakClients   = 6
	soakWorkspace = "soak"
)

// soakAnswer is one HTTP answer a client got about a call.
type soakAnswer struct {
	at      time.Time
	method  string
	code    int
	id      string
	status  call.Status
	errType string
}

// soakCall is one call of the soak, from its client's point of view.
type soakCall struct {
	tag      string
	id       string
	accepted time.Time // when the client first learned the call's id
	answers  []soakAnswer
	final    *call.Result
	unfinal  string // why the client never saw a final state
}

// soakFault is one fault the soak made, and when the pool was back to full strength.
type soakFault struct {
	kind, target string
	start, end   time.Time
	serverDown   bool // one NATS server of three was down for the whole of start..end (the long outage)
}

type soak struct {
	p       *pool
	rng     *rand.Rand
	start   time.Time
	loadEnd time.Time // when the clients stopped sending calls

	mu            sync.Mutex
	calls         []*soakCall
	faults        []soakFault
	killedWorkers map[string]bool // every worker id that was killed
	transportErrs int
	transportSeen []string // the first few transport errors, for the log
	replacements  int
}

// TestSoak runs the chaos soak for TOOLPOOL_SOAK and fails on any broken guarantee (docs/reliability.md
// lists them): an accepted call answered not_found, an answer about an accepted call without its id or
// state, a call lost although its worker lived and it had deliveries left, a call run twice, or
// throughput with one server down under half of the steady state.
func TestSoak(t *testing.T) {
	d := os.Getenv("TOOLPOOL_SOAK")
	if d == "" {
		t.Skip("set TOOLPOOL_SOAK=5m to run (make soak)")
	}
	length, err := time.ParseDuration(d)
	if err != nil || length < time.Minute {
		t.Fatalf("TOOLPOOL_SOAK=%q: want a duration of at least 1m", d)
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("TOOLPOOL_SOAK_SEED"); v != "" {
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("TOOLPOOL_SOAK_SEED=%q: want a number", v)
		}
	}
	t.Logf("soak for %s, seed %d (TOOLPOOL_SOAK_SEED=%d replays this fault schedule)", length, seed, seed)

	s := &soak{p: startPool(t), rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), killedWorkers: map[string]bool{}}
	s.start = time.Now()
	ctx, stopLoad := context.WithCancel(context.Background())
	var clients sync.WaitGroup
	for i := range soakClients {
		clients.Add(1)
		go func() {
			defer clients.Done()
			s.client(ctx, i)
		}()
	}

	// A steady phase first, for the throughput the faults are compared with; then faults until the load
	// stops, one at a time, the pool back to full strength after each.
	baseline := min(length/5, time.Minute)
	time.Sleep(baseline)
	steadyEnd := time.Now()
	every := func() time.Duration { return 20*time.Second + time.Duration(s.rng.Int64N(int64(20*time.Second))) }
	if length < 3*time.Minute {
		every = func() time.Duration { return 8*time.Second + time.Duration(s.rng.Int64N(int64(8*time.Second))) }
	}
	// The first fault is a long outage of one server, over which throughput is measured: a server's
	// Raft groups need 4 to 9 s to elect new leaders (nats-server's election timeout), so the short faults
	// after it measure the failover pause rather than throughput with a server down.
	s.outage(t, min(length/4, time.Minute))
	time.Sleep(every())
	for end := s.start.Add(length); time.Now().Add(20 * time.Second).Before(end); {
		s.fault(t)
		time.Sleep(min(every(), time.Until(end)))
	}
	s.loadEnd = time.Now()
	stopLoad()
	clients.Wait()
	s.check(t, steadyEnd)
}

// client submits calls one after another until ctx ends, then follows the last one to its final state.
// Even clients wait in the POST; odd ones send "wait": false and poll. Every call carries its tag as its
// idempotency key, so a POST that got no answer is sent again and finds the call it may have made.
func (s *soak) client(ctx context.Context, n int) {
	for i := 0; ctx.Err() == nil; i++ {
		c := &soakCall{tag: fmt.Sprintf("c%d-%d", n, i)}
		s.mu.Lock()
		s.calls = append(s.calls, c)
		s.mu.Unlock()
		body := map[string]any{"tool": "run_shell", "workspace": soakWorkspace, "idempotency_key": c.tag,
			"args": map[string]any{"command": fmt.Sprintf(`awk 'BEGIN{print "ran" >> "count-%s"}' && sleep 0.2 && echo finished`, c.tag)}}
		if n%2 == 1 {
			body["wait"] = false
		}
		s.follow(c, body)
	}
}

// follow sends the call (again, until it has an id) and reads it until it is final, for at most five
// minutes, recording every answer.
func (s *soak) follow(c *soakCall, body map[string]any) {
	deadline := time.Now().Add(5 * time.Minute)
	for i := 0; time.Now().Before(deadline); i++ {
		urls := s.p.dispatcherURLs()
		if len(urls) == 0 {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		url := urls[i%len(urls)]
		method, target := http.MethodGet, url+"/v1/calls/"+c.id+"?wait=20s"
		var send any
		if c.id == "" {
			method, target, send = http.MethodPost, url+"/v1/calls", body
		}
		// Longer than any wait the dispatcher holds a request for (max_wait 2m in the pool's config), so that
		// what the client gets is the dispatcher's answer, not its own timeout.
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
		code, data, err := do(ctx, method, target, send)
		cancel()
		if err != nil {
			s.mu.Lock()
			s.transportErrs++
			if len(s.transportSeen) < 5 {
				s.transportSeen = append(s.transportSeen, fmt.Sprintf("+%s %s %s: %v", time.Since(s.start).Round(time.Millisecond), method, target, err))
			}
			s.mu.Unlock()
			time.Sleep(200 * time.Millisecond)
			continue
		}
		a := soakAnswer{at: time.Now(), method: method, code: code}
		var r call.Result
		if json.Unmarshal(data, &r) == nil {
			a.id, a.status = r.ID, r.Status
			if r.Error != nil {
				a.errType = r.Error.Type
			}
		}
		var e struct {
			Error struct{ Type string } `json:"error"`
		}
		if a.errType == "" && json.Unmarshal(data, &e) == nil {
			a.errType = e.Error.Type
		}
		s.mu.Lock()
		c.answers = append(c.answers, a)
		if c.id == "" && a.id != "" && (code == http.StatusOK || code == http.StatusAccepted) {
			c.id, c.accepted = a.id, a.at
		}
		if code == http.StatusOK && r.Status.Terminal() && a.id == c.id {
			c.final = &r
		}
		s.mu.Unlock()
		if c.final != nil {
			return
		}
		if code >= 500 || code == http.StatusTooManyRequests {
			time.Sleep(500 * time.Millisecond)
		}
	}
	c.unfinal = "no final state within 5 minutes"
}

// outage kills one server, chosen at random, keeps it down for d, and restarts it: the window over which
// throughput with one server of three down is measured.
func (s *soak) outage(t *testing.T, d time.Duration) {
	t.Helper()
	n := s.p.nats.nodes[s.rng.IntN(len(s.p.nats.nodes))]
	f := soakFault{kind: fmt.Sprintf("kill -9 a NATS server, down for %s", d), target: n.name, start: time.Now(), serverDown: true}
	n.proc.Kill9(t)
	time.Sleep(d)
	f.end = time.Now()
	s.p.nats.restart(t, n)
	t.Logf("fault at +%s: %s (%s)", f.start.Sub(s.start).Round(time.Second), f.kind, f.target)
	s.mu.Lock()
	s.faults = append(s.faults, f)
	s.mu.Unlock()
}

// fault makes one fault, chosen at random, and returns once the pool is back to full strength.
func (s *soak) fault(t *testing.T) {
	t.Helper()
	f := soakFault{start: time.Now()}
	nodes := s.p.nats.nodes
	switch k := s.rng.IntN(8); {
	case k == 0: // a random server, killed and restarted 8 s later
		n := nodes[s.rng.IntN(len(nodes))]
		f.kind, f.target = "kill -9 a NATS server (restarted 8 s later)", n.name
		s.killServer(t, n)
	case k == 1: // every run_shell call stores its full output there before its result is recorded
		n := s.p.nats.leaderOf(t, "OBJ_toolpool_calls_outputs")
		f.kind, f.target = "kill -9 the output store's leader (restarted 8 s later)", n.name
		s.killServer(t, n)
	case k == 2:
		n := s.p.nats.leaderOf(t, "TOOLPOOL_CALLS")
		f.kind, f.target = "kill -9 the calls stream's leader (restarted 8 s later)", n.name
		s.killServer(t, n)
	case k == 3:
		n := s.p.nats.leaderOf(t, "KV_toolpool_calls")
		f.kind, f.target = "kill -9 the records bucket's leader (restarted 8 s later)", n.name
		s.killServer(t, n)
	case k == 4: // frozen past the route and Raft heartbeats, then resumed
		n := nodes[s.rng.IntN(len(nodes))]
		f.kind, f.target = "SIGSTOP a NATS server for 6 s", n.name
		if err := n.proc.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(6 * time.Second)
		if err := n.proc.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if err := s.p.nats.waitHealthy(n, time.Now().Add(90*time.Second)); err != nil {
			t.Fatal(err)
		}
	case k <= 6: // a worker, replaced under a new id on the same node (its data dir)
		live := s.p.liveWorkers()
		id := live[s.rng.IntN(len(live))]
		s.p.mu.Lock()
		w := s.p.workers[id]
		s.p.mu.Unlock()
		f.kind, f.target = "kill -9 a worker (replaced under a new id)", id
		s.mu.Lock()
		s.killedWorkers[id] = true
		s.replacements++
		newID := fmt.Sprintf("w%d", 3+s.replacements)
		s.mu.Unlock()
		w.proc.Kill9(t)
		s.p.startWorkers(workerSpec{id: newID, dataDir: w.dataDir})
	default: // a dispatcher, restarted
		name := []string{"a", "b"}[s.rng.IntN(2)]
		s.p.mu.Lock()
		d := s.p.dispatchers[name]
		s.p.mu.Unlock()
		f.kind, f.target = "kill -9 a dispatcher (restarted)", name
		d.proc.Kill9(t)
		time.Sleep(2 * time.Second)
		s.p.startDispatchers(name)
	}
	f.end = time.Now()
	t.Logf("fault at +%s: %s (%s), %s to full strength", f.start.Sub(s.start).Round(time.Second), f.kind, f.target,
		f.end.Sub(f.start).Round(100*time.Millisecond))
	s.mu.Lock()
	s.faults = append(s.faults, f)
	s.mu.Unlock()
}

// killServer kills n with SIGKILL and restarts it on its store 8 s later.
func (s *soak) killServer(t *testing.T, n *natsNode) {
	t.Helper()
	n.proc.Kill9(t)
	time.Sleep(8 * time.Second)
	s.p.nats.restart(t, n)
}

// check reads every accepted call once more through every dispatcher, judges each guarantee, and writes
// the report.
func (s *soak) check(t *testing.T, steadyEnd time.Time) {
	t.Helper()
	var (
		accepted, ok, lostExplained int
		violations                  = map[string][]string{}
		finalStates                 = map[call.Status]int{}
		answers                     = map[string]int{}
	)
	violate := func(class, format string, a ...any) {
		violations[class] = append(violations[class], fmt.Sprintf(format, a...))
	}
	for _, c := range s.calls {
		for _, a := range c.answers {
			answers[fmt.Sprintf("%s %d", a.method, a.code)]++
		}
		if c.id == "" {
			continue // never accepted: the client was told so, or the load stopped first
		}
		accepted++
		for _, a := range c.answers {
			about := a.method == http.MethodGet || (c.final != nil && !c.final.CreatedAt.After(a.at))
			switch {
			case !about:
			case a.code == http.StatusNotFound:
				violate("an accepted call answered not_found", "%s (%s) %s at +%s", c.id, c.tag, a.method, a.at.Sub(s.start).Round(time.Millisecond))
			case a.id != c.id || a.status == "":
				violate("an answer about an accepted call without its id and state", "%s (%s) %s HTTP %d %s at +%s", c.id, c.tag, a.method, a.code, a.errType, a.at.Sub(s.start).Round(time.Millisecond))
			}
		}
		runs := s.runsIn(c.tag)
		if runs > 1 {
			violate("a call ran more than once", "%s (%s) ran %d times", c.id, c.tag, runs)
		}
		if c.final == nil {
			violate("an accepted call without a final state", "%s (%s): %s", c.id, c.tag, c.unfinal)
			continue
		}
		finalStates[c.final.Status]++
		switch c.final.Status {
		case call.StatusOK:
			ok++
			if runs != 1 {
				violate("a call ran more than once", "%s (%s) ok but ran %d times", c.id, c.tag, runs)
			}
		case call.StatusLost:
			if s.killedWorkers[c.final.Worker] || (c.final.Error != nil && strings.Contains(c.final.Error.Message, "gave up redelivering")) {
				lostExplained++
			} else {
				violate("a call lost although its worker lived", "%s (%s) worker %q: %s", c.id, c.tag, c.final.Worker, c.final.Error.Message)
			}
		default:
			msg := ""
			if c.final.Error != nil {
				msg = c.final.Error.Type + ": " + c.final.Error.Message
			}
			violate("a call that ended other than ok or lost", "%s (%s) %s %s", c.id, c.tag, c.final.Status, msg)
		}
		// Readable through every dispatcher, as final, once the faults are over.
		for _, url := range s.p.dispatcherURLs() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			code, data, err := do(ctx, http.MethodGet, url+"/v1/calls/"+c.id, nil)
			cancel()
			var r call.Result
			if err != nil || code != http.StatusOK || json.Unmarshal(data, &r) != nil || r.Status != c.final.Status {
				violate("a final call not readable through every dispatcher afterwards", "%s (%s) via %s: HTTP %d %v %.200s", c.id, c.tag, url, code, err, data)
			}
		}
	}

	// Throughput: calls finished per second in the steady phase, and while one server was down.
	var steady, down int
	var downFor time.Duration
	for _, f := range s.faults {
		if f.serverDown {
			downFor += f.end.Sub(f.start)
		}
	}
	for _, c := range s.calls {
		if c.final == nil {
			continue
		}
		at := c.final.FinishedAt
		if at.Before(steadyEnd) && !at.Before(s.start) {
			steady++
		}
		for _, f := range s.faults {
			if f.serverDown && !at.Before(f.start) && at.Before(f.end) {
				down++
			}
		}
	}
	steadyRate := float64(steady) / steadyEnd.Sub(s.start).Seconds()
	downRate := 0.0
	if downFor > 0 {
		downRate = float64(down) / downFor.Seconds()
		if downRate < steadyRate/2 {
			violate("throughput with one server down under half the steady state", "%.2f calls/s with one server down against %.2f steady", downRate, steadyRate)
		}
	}

	for _, e := range s.transportSeen {
		t.Logf("no answer: %s", e)
	}
	report := s.report(accepted, ok, lostExplained, finalStates, answers, violations, steadyRate, downRate, downFor)
	t.Log("\n" + report)
	if path := os.Getenv("TOOLPOOL_SOAK_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
			t.Errorf("write the report: %v", err)
		}
	}
	for class, samples := range violations {
		t.Errorf("%s: %d, e.g. %s", class, len(samples), strings.Join(samples[:min(len(samples), 5)], "; "))
	}
}

// runsIn counts how often the call tagged tag ran.
func (s *soak) runsIn(tag string) int {
	data, err := os.ReadFile(filepath.Join(s.p.workspaces, "t1", soakWorkspace, "count-"+tag))
	if err != nil {
		return 0
	}
	return strings.Count(string(data), "ran\n")
}

// report is the soak's outcome in Markdown: what was killed, how often, and what the clients saw.
func (s *soak) report(accepted, ok, lostExplained int, finals map[call.Status]int, answers map[string]int,
	violations map[string][]string, steadyRate, downRate float64, downFor time.Duration) string {
	var b strings.Builder
	kinds, pauses := map[string]int{}, map[string]time.Duration{}
	finished := s.finishTimes()
	for _, f := range s.faults {
		kinds[f.kind]++
		pauses[f.kind] = max(pauses[f.kind], longestGap(finished, f.start, earliestOf(f.end.Add(20*time.Second), s.loadEnd)))
	}
	fmt.Fprintf(&b, "| fault | times | longest pause without a finished call, from the fault to 20 s after full strength |\n| --- | --- | --- |\n")
	for _, k := range sortedKeys(kinds) {
		fmt.Fprintf(&b, "| %s | %d | %.1f s |\n", k, kinds[k], pauses[k].Seconds())
	}
	fmt.Fprintf(&b, "\n| what the clients saw | count |\n| --- | --- |\n")
	fmt.Fprintf(&b, "| calls submitted | %d |\n| calls accepted | %d |\n", len(s.calls), accepted)
	for _, st := range sortedKeys(finals) {
		fmt.Fprintf(&b, "| final `%s` | %d |\n", st, finals[st])
	}
	fmt.Fprintf(&b, "| of those lost, lost with their worker | %d |\n", lostExplained)
	for _, k := range sortedKeys(answers) {
		fmt.Fprintf(&b, "| answers `%s` | %d |\n", k, answers[k])
	}
	fmt.Fprintf(&b, "| requests that got no answer (connection refused or cut, or no answer in 150 s) | %d |\n", s.transportErrs)
	fmt.Fprintf(&b, "| calls finished per second, steady | %.2f |\n| calls finished per second, one server down (%s in all) | %.2f |\n",
		steadyRate, downFor.Round(time.Second), downRate)
	fmt.Fprintf(&b, "\n| guarantee | broken |\n| --- | --- |\n")
	for _, g := range []string{"an accepted call answered not_found", "an answer about an accepted call without its id and state",
		"a call lost although its worker lived", "a call ran more than once", "an accepted call without a final state",
		"a call that ended other than ok or lost", "a final call not readable through every dispatcher afterwards",
		"throughput with one server down under half the steady state"} {
		fmt.Fprintf(&b, "| %s | %d |\n", g, len(violations[g]))
	}
	return b.String()
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// finishTimes lists when each call that got a final state finished, in order.
func (s *soak) finishTimes() []time.Time {
	var at []time.Time
	for _, c := range s.calls {
		if c.final != nil {
			at = append(at, c.final.FinishedAt)
		}
	}
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	return at
}

// longestGap is the longest time within from..to in which no call finished (finished is sorted).
func longestGap(finished []time.Time, from, to time.Time) time.Duration {
	var gap time.Duration
	last := from
	for _, at := range finished {
		if at.Before(from) {
			continue
		}
		if at.After(to) {
			break
		}
		gap = max(gap, at.Sub(last))
		last = at
	}
	return max(gap, to.Sub(last))
}

func earliestOf(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
