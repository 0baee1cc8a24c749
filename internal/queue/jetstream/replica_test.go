package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/queue/jetstream/jstest"
)

// replicaCluster is three in-process NATS servers clustered on loopback, each with JetStream on its own
// store, so that one can be stopped and started again on its store.
type replicaCluster struct {
	t     *testing.T
	dir   string
	ports [3]int // cluster (route) ports, fixed for the cluster's life so that a restarted node rejoins
	nodes [3]*server.Server
}

func startReplicaCluster(t *testing.T) *replicaCluster {
	t.Helper()
	c := &replicaCluster{t: t, dir: t.TempDir()}
	var ls []net.Listener
	for i := range c.ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		c.ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		l.Close()
	}
	for i := range c.nodes {
		c.start(i)
	}
	pollUntil(t, time.Minute, "a JetStream meta leader", c.hasMetaLeader)
	t.Cleanup(func() {
		for _, n := range c.nodes {
			if n != nil {
				n.Shutdown()
			}
		}
	})
	return c
}

// hasMetaLeader reports whether a JetStream meta leader knows every server as a peer, so that a stream
// of three replicas can be placed.
func (c *replicaCluster) hasMetaLeader() bool {
	for _, n := range c.nodes {
		if n != nil && n.Running() && n.JetStreamIsLeader() {
			return len(n.JetStreamClusterPeers()) == len(c.nodes)
		}
	}
	return false
}

// start starts node i on its store and waits until it accepts connections.
func (c *replicaCluster) start(i int) {
	c.t.Helper()
	var routes []string
	for j, p := range c.ports {
		if j != i {
			routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
		}
	}
	opts := &server.Options{
		ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: filepath.Join(c.dir, fmt.Sprintf("n%d", i)), NoSigs: true, NoLog: true,
		Cluster: server.ClusterOpts{Name: "replicas", Host: "127.0.0.1", Port: c.ports[i]},
		Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		c.t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		c.t.Fatalf("node %d not ready", i)
	}
	c.nodes[i] = srv
}

// TestReadsAfterAReplicaRestarts: whatever server a reader is connected to, it reads what another client
// wrote a moment before, also through a server that has just restarted and is catching up. A direct get is
// answered by a nearby replica, and a replica serves them once it is 90% caught up: a dispatcher then told
// a client that an accepted call did not exist (the chaos soak saw it), or that a call waiting for approval
// waited for nothing.
func TestReadsAfterAReplicaRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-server NATS cluster")
	}
	c := startReplicaCluster(t)
	writer := jstest.Connect(t, c.nodes[0].ClientURL(), "dispatcher", true, func(cfg *jetstream.Config) { cfg.Replicas = 3 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// A backlog for the restarted server to catch up on, then writes that go on while it does.
	c.nodes[2].Shutdown()
	n := 0
	write := func() string {
		n++
		id := fmt.Sprintf("c_replica%05d", n)
		if _, err := writer.Records().Create(ctx, &call.Result{ID: id, Tenant: "t1", Tool: "read_file", Status: call.StatusQueued}); err != nil {
			t.Fatal(err)
		}
		if err := writer.Approvals().PutPending(ctx, &call.Pending{Call: &call.Call{ID: id, Tenant: "t1", Tool: "run_shell"}}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	for range 3000 {
		write()
	}
	c.start(2)
	// Connected once the server has caught up with the backlog; the writes below keep it a step behind.
	pollUntil(t, time.Minute, "the restarted server to catch up", c.nodes[2].JetStreamIsCurrent)
	reader := connectPatiently(t, c.nodes[2].ClientURL())

	var missing []string
	for range 1500 {
		id := write()
		for {
			_, err := reader.Records().Get(ctx, id)
			if errors.Is(err, queue.ErrNotFound) {
				missing = append(missing, "record "+id)
			} else if err != nil && ctx.Err() == nil {
				time.Sleep(50 * time.Millisecond) // no leader for a moment: ask again
				continue
			}
			break
		}
		for {
			_, err := reader.Approvals().GetPending(ctx, "t1", id)
			if errors.Is(err, queue.ErrNotFound) {
				missing = append(missing, "approval "+id)
			} else if err != nil && ctx.Err() == nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			break
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%d of 3000 reads through another server answered not found, e.g. %v", len(missing), missing[:min(len(missing), 5)])
	}
}

// connectPatiently connects a worker's connection to url, trying for up to three minutes: a server that
// has just restarted on a loaded host may answer its first lookups late.
func connectPatiently(t *testing.T, url string) *jetstream.Conn {
	t.Helper()
	cfg := jetstream.DefaultConfig()
	cfg.URL, cfg.Name, cfg.Replicas = url, "reader", 3
	deadline := time.Now().Add(3 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		conn, err := jetstream.Connect(ctx, cfg)
		cancel()
		if err == nil {
			t.Cleanup(conn.Close)
			return conn
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
}

// TestProvisionTurnsDirectGetsOff: a dispatcher of this version provisioning over buckets that an earlier
// version made (nats.go's key-value buckets, direct gets on) turns their direct gets off in place,
// keeping what they hold.
func TestProvisionTurnsDirectGetsOff(t *testing.T) {
	url := jstest.Server(t, "").URL()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := jetstream.DefaultConfig()
	buckets := []string{cfg.Bucket, cfg.Bucket + "_approvals", cfg.Bucket + "_state"}
	for _, b := range buckets {
		kv, err := js.CreateKeyValue(ctx, natsjs.KeyValueConfig{Bucket: b, History: 1, Storage: natsjs.FileStorage})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "kept", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	jstest.Connect(t, url, "dispatcher", true)
	for _, b := range buckets {
		s, err := js.Stream(ctx, "KV_"+b)
		if err != nil {
			t.Fatal(err)
		}
		if s.CachedInfo().Config.AllowDirect {
			t.Errorf("bucket %s still has direct gets on after provisioning", b)
		}
		kv, err := js.KeyValue(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Get(ctx, "kept"); err != nil {
			t.Errorf("bucket %s lost its key: %v", b, err)
		}
	}
}

// freezer is a TCP proxy to one server that can stop passing bytes both ways, as a server frozen by
// SIGSTOP or cut off by a partition looks to its clients: the connection stays open, nothing answers.
type freezer struct {
	l      net.Listener
	mu     sync.Mutex
	frozen bool
	thaw   chan struct{}
}

func startFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{l: l, thaw: make(chan struct{})}
	t.Cleanup(func() { l.Close(); f.unfreeze() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go f.pipe(c, s)
			go f.pipe(s, c)
		}
	}()
	return f
}

func (f *freezer) url() string { return "nats://" + f.l.Addr().String() }

func (f *freezer) freeze() { f.mu.Lock(); f.frozen = true; f.mu.Unlock() }

func (f *freezer) unfreeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen {
		f.frozen = false
		close(f.thaw)
		f.thaw = make(chan struct{})
	}
}

// pipe copies from src to dst, holding every read while the proxy is frozen.
func (f *freezer) pipe(src, dst net.Conn) {
	defer src.Close()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for {
			f.mu.Lock()
			frozen, thaw := f.frozen, f.thaw
			f.mu.Unlock()
			if !frozen {
				break
			}
			<-thaw
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestFrozenServerIsLeft: a client whose server freezes (SIGSTOP, a partition: the connection stays
// open and silent) moves to another server of the cluster within a few seconds, well inside a lease, and
// its writes go on there. With the client's default pings (every 2 minutes) it waited on the frozen
// server: a worker connected to it could not renew its leases and its calls ended lost although it lived.
func TestFrozenServerIsLeft(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-server NATS cluster")
	}
	c := startReplicaCluster(t)
	jstest.Connect(t, c.nodes[0].ClientURL(), "dispatcher", true, func(cfg *jetstream.Config) { cfg.Replicas = 3 })
	f := startFreezer(t, strings.TrimPrefix(c.nodes[2].ClientURL(), "nats://"))
	client := jstest.Connect(t, f.url(), "worker", false, func(cfg *jetstream.Config) { cfg.Replicas = 3 })
	ctx := context.Background()
	if _, err := client.Records().Create(ctx, &call.Result{ID: "c_before", Tenant: "t1", Status: call.StatusQueued}); err != nil {
		t.Fatal(err)
	}

	f.freeze()
	frozenAt := time.Now()
	for i := 0; ; i++ {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := client.Records().Create(wctx, &call.Result{ID: fmt.Sprintf("c_frozen%d", i), Tenant: "t1", Status: call.StatusQueued})
		cancel()
		if err == nil {
			break
		}
		if time.Since(frozenAt) > 20*time.Second {
			t.Fatalf("no write went through for %s after the client's server froze: %v", time.Since(frozenAt).Round(time.Second), err)
		}
	}
	if took := time.Since(frozenAt); took > 10*time.Second {
		t.Fatalf("the client took %s to leave its frozen server: longer than a lease's margin", took.Round(100*time.Millisecond))
	} else {
		t.Logf("writes went on %s after the client's server froze", took.Round(100*time.Millisecond))
	}
}

// TestWaitSeesAClusterUpdateOnItsBell: on a three-server cluster, a Wait sees an update as soon as it is
// made, also with one server down, rather than at the next backstop poll (2 s). The bell (the update
// routed to a core subscription) rings before the stream's leader has applied the write, which needs a
// quorum first: the read it triggered found the record before the update, and Wait slept until its poll.
// The chaos soak's calls took twice as long after a server restart for it, and the pool ran at half
// speed; this test's Waits took 1.9 s at the 90th percentile in health and at the median with a server
// down.
func TestWaitSeesAClusterUpdateOnItsBell(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-server NATS cluster")
	}
	c := startReplicaCluster(t)
	cfg := func(cfg *jetstream.Config) { cfg.Replicas = 3 }
	writer := jstest.Connect(t, c.nodes[0].ClientURL(), "worker", true, cfg)
	waiter := jstest.Connect(t, c.nodes[1].ClientURL(), "dispatcher", false, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// An update 700 ms into a Wait falls after its early rereads (5 ms to 625 ms) and well before its
	// first poll (2.6 s): only the bell can show it in time.
	waits := func(phase string, n int) {
		var slowest time.Duration
		for i := range n {
			r := &call.Result{ID: call.NewID(), Tenant: "t", Status: call.StatusRunning}
			rev, err := writer.Records().Create(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			seen := make(chan error, 1)
			go func() {
				got, err := waiter.Records().Wait(ctx, r.ID, func(r *call.Result) bool { return r.Status.Terminal() })
				if err == nil && got.Status != call.StatusOK {
					err = fmt.Errorf("Wait returned status %s", got.Status)
				}
				seen <- err
			}()
			time.Sleep(700 * time.Millisecond)
			r.Status = call.StatusOK
			updated := time.Now()
			if _, err := writer.Records().Update(ctx, r, rev); err != nil {
				t.Fatal(err)
			}
			if err := <-seen; err != nil {
				t.Fatalf("%s, round %d: %v", phase, i, err)
			}
			slowest = max(slowest, time.Since(updated))
		}
		t.Logf("%s: the slowest of %d Waits saw its update %s after it was made", phase, n, slowest.Round(100*time.Microsecond))
		if slowest > time.Second {
			t.Fatalf("%s: a Wait saw an update %s after it was made: it missed its bell's update and waited for its poll", phase, slowest.Round(time.Millisecond))
		}
	}
	waits("all servers up", 10)
	c.nodes[2].Shutdown()
	waits("one server down", 10)
}
