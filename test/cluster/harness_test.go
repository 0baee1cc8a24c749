// Package cluster runs toolpool across machines, on loopback: a real three-server NATS cluster (separate
// nats-server processes built from the module's nats-server), two dispatchers and three workers (the
// real binaries, each worker with its own private containerd and one workspace directory shared by all,
// as a ReadWriteMany volume would be), streams, buckets and the output store at three replicas, and the
// faults between them.
package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
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
	"github.com/toolpool/toolpool/internal/testproc"
)

// bin is the path of binary name (dispatcher, worker, toolpool, nats-server), built once per process.
func bin(t testing.TB, name string) string { return filepath.Join(testproc.All(t), name) }

func TestMain(m *testing.M) {
	code := m.Run()
	testproc.Cleanup()
	os.Exit(code)
}

// launch starts binary (dispatcher, worker, nats-server) as name with args and extra environment; the
// test's cleanup stops it, and keeps its output when the test failed.
func launch(t testing.TB, name, binary string, env []string, args ...string) *testproc.Proc {
	t.Helper()
	return testproc.StartNamed(t, name, bin(t, binary), env, args...)
}

// eventually polls cond every 50ms until it holds, failing the test after within.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freePorts returns n ports that were free a moment ago (listened on, then closed). A port can be taken
// in between; the caller retries on a collision.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// natsNode is one nats-server of the cluster.
type natsNode struct {
	name                   string
	conf                   string
	client, route, monitor int
	proc                   *testproc.Proc
}

func (n *natsNode) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.client) }

// natsCluster is three nats-server processes clustered on loopback, each with JetStream on its own disk and
// the stock limits (1 MiB max payload).
type natsCluster struct {
	dir   string
	nodes []*natsNode
}

// startNATSCluster starts the three servers and waits until JetStream has a meta leader and all three are
// healthy. A port taken between choosing and binding makes a server exit: it retries with new ports.
func startNATSCluster(t *testing.T, dir string) *natsCluster {
	t.Helper()
	for attempt := 1; ; attempt++ {
		c, err := tryNATSCluster(t, dir, attempt)
		if err == nil {
			return c
		}
		if attempt == 3 {
			t.Fatalf("start the NATS cluster: %v", err)
		}
		t.Logf("start the NATS cluster (attempt %d): %v; retrying with new ports", attempt, err)
	}
}

func tryNATSCluster(t *testing.T, dir string, attempt int) (*natsCluster, error) {
	ports := freePorts(t, 9)
	c := &natsCluster{dir: filepath.Join(dir, fmt.Sprintf("nats%d", attempt))}
	var routes []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[3*i+1]))
	}
	for i := range 3 {
		n := &natsNode{name: fmt.Sprintf("n%d", i+1), client: ports[3*i], route: ports[3*i+1], monitor: ports[3*i+2]}
		store := filepath.Join(c.dir, n.name)
		if err := os.MkdirAll(store, 0o700); err != nil {
			t.Fatal(err)
		}
		n.conf = filepath.Join(c.dir, n.name+".conf")
		conf := fmt.Sprintf("server_name: %s\nlisten: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\njetstream { store_dir: %q }\ncluster { name: toolpool, listen: 127.0.0.1:%d, routes: [%s] }\n",
			n.name, n.client, n.monitor, store, n.route, strings.Join(routes, ", "))
		if err := os.WriteFile(n.conf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		n.proc = launch(t, "nats-"+n.name, "nats-server", nil, "-c", n.conf)
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, n := range c.nodes {
		if err := c.waitHealthy(n, deadline); err != nil {
			for _, n := range c.nodes {
				n.proc.Kill9(t)
			}
			return nil, err
		}
	}
	return c, nil
}

// waitHealthy waits until node n reports JetStream healthy (a meta leader, its assets current).
func (c *natsCluster) waitHealthy(n *natsNode, deadline time.Time) error {
	for {
		select {
		case <-n.proc.Done():
			return fmt.Errorf("%s exited: %s", n.name, n.proc.Tail(5))
		default:
		}
		var h struct {
			Status string `json:"status"`
		}
		if getJSON(fmt.Sprintf("http://127.0.0.1:%d/healthz", n.monitor), &h) == nil && h.Status == "ok" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not healthy in time", n.name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// urls is the client URL list of every node, for clients that fail over.
func (c *natsCluster) urls() string {
	var us []string
	for _, n := range c.nodes {
		us = append(us, n.url())
	}
	return strings.Join(us, ",")
}

// leaderOf returns the node that leads stream, as a live node's monitoring endpoint reports it.
func (c *natsCluster) leaderOf(t *testing.T, stream string) *natsNode {
	t.Helper()
	var leader *natsNode
	eventually(t, 30*time.Second, "a leader of "+stream, func() bool {
		for _, n := range c.nodes {
			if n.proc.Exited() {
				continue
			}
			var jsz struct {
				Accounts []struct {
					Streams []struct {
						Name    string `json:"name"`
						Cluster struct {
							Leader string `json:"leader"`
						} `json:"cluster"`
					} `json:"stream_detail"`
				} `json:"account_details"`
			}
			if getJSON(fmt.Sprintf("http://127.0.0.1:%d/jsz?accounts=true&streams=true", n.monitor), &jsz) != nil {
				continue
			}
			for _, a := range jsz.Accounts {
				for _, s := range a.Streams {
					for _, m := range c.nodes {
						if s.Name == stream && s.Cluster.Leader == m.name {
							leader = m
							return true
						}
					}
				}
			}
		}
		return false
	})
	return leader
}

// restart starts a killed node again on its store and waits until it is healthy.
func (c *natsCluster) restart(t *testing.T, n *natsNode) {
	t.Helper()
	n.proc = launch(t, "nats-"+n.name, "nats-server", nil, "-c", n.conf)
	if err := c.waitHealthy(n, time.Now().Add(90*time.Second)); err != nil {
		t.Fatal(err)
	}
}

func getJSON(url string, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// Timing of the pool under test. The lease outlives a NATS leader election (4 to 9 seconds without a
// leader), so that losing a server loses no call; the ack wait covers the lease.
const (
	heartbeat = time.Second
	lease     = 12 * time.Second
	ackWait   = 15 * time.Second
)

const dispatcherConfig = `
api:
  tenants:
    - name: t1
      tokens: [{token: t1-token, role: approver}]
  queue_timeout: 3m
  max_wait: 2m
  max_output_bytes: 8388608
queue:
  replicas: 3
  lanes: 4
  ack_wait: 15s
reconciler:
  interval: 2s
  grace: 30s
`

const permissivePolicy = "version: 1\ndefault_action: allow\n"

// pool is the whole toolpool on the cluster: its dispatchers, its workers, the shared workspaces.
type pool struct {
	t          *testing.T
	dir        string
	nats       *natsCluster
	workspaces string
	// checkpoints: each worker has its own workspaces directory (under its data dir) and keeps workspaces
	// in JetStream's object store, instead of one directory shared by all.
	checkpoints bool

	mu          sync.Mutex
	dispatchers map[string]*dispatcherProc
	workers     map[string]*workerProc
	dataDirs    []string // every worker data dir ever used, for counting containers
}

type dispatcherProc struct {
	proc *testproc.Proc
	url  string
}

type workerProc struct {
	id      string
	dataDir string
	proc    *testproc.Proc
}

func startPool(t *testing.T) *pool { return startPoolWith(t, false) }

// startPoolWith starts the pool; with checkpoints, each worker has a workspaces directory of its own and
// keeps workspaces in JetStream's object store.
func startPoolWith(t *testing.T, checkpoints bool) *pool {
	t.Helper()
	p := startPoolTimed(t, checkpoints, heartbeat, lease)
	p.startWorkers(workerSpec{id: "w1", dataDir: filepath.Join(p.dir, "w1")}, workerSpec{id: "w2", dataDir: filepath.Join(p.dir, "w2")},
		workerSpec{id: "w3", dataDir: filepath.Join(p.dir, "w3")})
	return p
}

// startPoolTimed starts the NATS cluster and the dispatchers, and writes the workers' configs with
// heartbeat hb and lease: the caller starts the workers.
func startPoolTimed(t *testing.T, checkpoints bool, hb, lease time.Duration) *pool {
	t.Helper()
	ctrtest.RequirePrograms(t, "ctr") // containers() counts what is left with it
	p := &pool{t: t, dir: ctrtest.ShortTempDir(t), dispatchers: map[string]*dispatcherProc{}, workers: map[string]*workerProc{},
		checkpoints: checkpoints}
	p.workspaces = filepath.Join(p.dir, "ws")
	p.nats = startNATSCluster(t, p.dir)
	// The workers run without a warm pool: the fault table counts every container left, and a ready
	// pooled container is no call's (the pool's own crash recovery is tested in internal/sandbox).
	for _, f := range []struct{ name, body string }{{"dispatcher.yaml", dispatcherConfig}, {"policy.yaml", permissivePolicy},
		{"worker.yaml", fmt.Sprintf("heartbeat: %s\nlease: %s\nslots: 4\nlog_level: debug\npool: {max_size: 0}\n", hb, lease)},
		{"worker-checkpoints.yaml", fmt.Sprintf("heartbeat: %s\nlease: %s\nslots: 4\nlog_level: debug\npool: {max_size: 0}\ncheckpoints: {store: jetstream}\n", hb, lease)}} {
		if err := os.WriteFile(filepath.Join(p.dir, f.name), []byte(f.body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Dispatcher a provisions the streams; then the others start at once, each waited for in turn.
	p.startDispatchers("a")
	p.startDispatchers("b")
	return p
}

// startDispatchers starts the dispatchers named, all at once, and waits until each is ready.
func (p *pool) startDispatchers(names ...string) {
	p.t.Helper()
	procs := make([]*testproc.Proc, len(names))
	for i, name := range names {
		procs[i] = launch(p.t, "dispatcher-"+name, "dispatcher", nil, "--config", filepath.Join(p.dir, "dispatcher.yaml"),
			"--policy", filepath.Join(p.dir, "policy.yaml"), "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(p.dir, "d-"+name),
			"--nats-url", p.nats.urls())
	}
	for i, name := range names {
		d := &dispatcherProc{proc: procs[i], url: "http://" + procs[i].WaitLog(p.t, "dispatcher ready", 90*time.Second)["listen"].(string)}
		p.mu.Lock()
		p.dispatchers[name] = d
		p.mu.Unlock()
	}
}

// workerSpec is a worker to start: its id, its data dir (its private containerd lives there) and extra
// environment.
type workerSpec struct {
	id, dataDir string
	env         []string
}

// startWorkers starts the workers, all at once, and waits until each is ready.
func (p *pool) startWorkers(specs ...workerSpec) []*workerProc {
	p.t.Helper()
	ws := make([]*workerProc, len(specs))
	for i, s := range specs {
		config, workspaces := "worker.yaml", p.workspaces
		if p.checkpoints {
			config, workspaces = "worker-checkpoints.yaml", filepath.Join(s.dataDir, "ws")
		}
		proc := launch(p.t, "worker-"+s.id, "worker", s.env, "--config", filepath.Join(p.dir, config), "--id", s.id,
			"--data-dir", s.dataDir, "--workspaces", workspaces, "--nats-url", p.nats.urls(), "--listen", "127.0.0.1:0")
		ws[i] = &workerProc{id: s.id, dataDir: s.dataDir, proc: proc}
	}
	for _, w := range ws {
		w.proc.WaitLog(p.t, "worker ready", 90*time.Second)
		p.mu.Lock()
		p.workers[w.id] = w
		if !strings.Contains(strings.Join(p.dataDirs, "\n"), w.dataDir) {
			p.dataDirs = append(p.dataDirs, w.dataDir)
		}
		p.mu.Unlock()
	}
	return ws
}

// dispatcherURLs lists the live dispatchers' URLs, in a stable order.
func (p *pool) dispatcherURLs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var urls []string
	for _, name := range []string{"a", "b", "c", "d"} {
		if d, ok := p.dispatchers[name]; ok && !d.proc.Exited() {
			urls = append(urls, d.url)
		}
	}
	return urls
}

// do sends one request to base; a transport error is returned, not fatal (a dispatcher may be dying).
func do(ctx context.Context, method, url string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer t1-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// await returns the call's final state, asking any live dispatcher, within three minutes.
func (p *pool) await(id string) *call.Result {
	p.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for i := 0; ; i++ {
		urls := p.dispatcherURLs()
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		code, body, err := do(ctx, http.MethodGet, urls[i%len(urls)]+"/v1/calls/"+id+"?wait=20s", nil)
		cancel()
		if err == nil && code == http.StatusOK {
			var r call.Result
			if err := json.Unmarshal(body, &r); err != nil {
				p.t.Fatalf("decode call %s: %v", id, err)
			}
			return &r
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("call %s has no final state after 3 minutes: HTTP %d %v %.300s", id, code, err, body)
		}
	}
}

// get reads a call's current state from any live dispatcher.
func (p *pool) get(id string) (*call.Result, error) {
	urls := p.dispatcherURLs()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code, body, err := do(ctx, http.MethodGet, urls[0]+"/v1/calls/"+id, nil)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK && code != http.StatusAccepted {
		return nil, fmt.Errorf("HTTP %d %s", code, body)
	}
	var r call.Result
	return &r, json.Unmarshal(body, &r)
}

// runs counts how often the call tagged tag ran: each run appends one line to its file.
func (p *pool) runs(tag string) int {
	data, err := os.ReadFile(filepath.Join(p.workspaces, "t1", "faults", "count-"+tag))
	if err != nil {
		return 0
	}
	return strings.Count(string(data), "ran\n")
}

// containers counts the call containers left in every worker's containerd (those of killed workers too:
// their replacements use the same data dir). A containerd that does not answer counts as one container
// left, until it answers.
func (p *pool) containers() int {
	p.mu.Lock()
	dirs := append([]string(nil), p.dataDirs...)
	p.mu.Unlock()
	n := 0
	for _, d := range dirs {
		out, err := exec.Command("ctr", "-a", filepath.Join(d, "containerd", "containerd.sock"), "-n", "toolpool", "containers", "ls", "-q").Output()
		if err != nil {
			n++
			continue
		}
		n += len(strings.Fields(string(out)))
	}
	return n
}

// leaked waits up to a minute for every call container and every process running "sleep marker" to be
// gone, and returns how many containers and processes are left.
func (p *pool) leaked(marker string) int {
	left := 0
	deadline := time.Now().Add(time.Minute)
	for {
		left = p.containers() + len(testproc.ProcessesWith("sleep "+marker))
		if left == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(200 * time.Millisecond)
	}
}
