package jetstream_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
)

// TestTenantScaleMemory measures the resident memory of a three-server NATS cluster (R3) with
// TOOLPOOL_SCALE_TENANTS tenants that each have two calls queued: first with toolpool's lanes, then with
// one durable consumer per tenant added, as toolpool had before. Opt-in: it builds nats-server and takes a
// few minutes at 1 000 tenants. Above 2 000 tenants only the lanes are measured.
func TestTenantScaleMemory(t *testing.T) {
	tenants, _ := strconv.Atoi(os.Getenv("TOOLPOOL_SCALE_TENANTS"))
	if tenants == 0 {
		t.Skip("set TOOLPOOL_SCALE_TENANTS=1000 to measure")
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir+"/", "github.com/nats-io/nats-server/v2")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build nats-server: %v\n%s", err, out)
	}
	var ports []int
	for range 9 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
		l.Close()
	}
	var routes, urls []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[3*i+1]))
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[3*i]))
	}
	var procs []*exec.Cmd
	for i := range 3 {
		conf := filepath.Join(dir, fmt.Sprintf("n%d.conf", i))
		body := fmt.Sprintf("server_name: n%d\nlisten: 127.0.0.1:%d\nhttp: 127.0.0.1:%d\njetstream { store_dir: %q }\ncluster { name: scale, listen: 127.0.0.1:%d, routes: [%s] }\n",
			i, ports[3*i], ports[3*i+2], filepath.Join(dir, fmt.Sprint(i)), ports[3*i+1], strings.Join(routes, ","))
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, exec.Command(filepath.Join(dir, "nats-server"), "-c", conf))
	}
	for _, p := range procs {
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { p.Process.Kill(); p.Wait() }()
	}
	pollUntil(t, time.Minute, "a healthy cluster", func() bool {
		for i := range 3 {
			resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[3*i+2]))
			if err != nil {
				return false
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false
			}
		}
		return true
	})
	rss := func() string {
		var parts []string
		total := 0
		for _, p := range procs {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Process.Pid))
			for _, line := range strings.Split(string(b), "\n") {
				if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
					kb, _ := strconv.Atoi(f[1])
					total += kb
					parts = append(parts, fmt.Sprintf("%d MiB", kb>>10))
				}
			}
		}
		return fmt.Sprintf("%s (total %d MiB)", strings.Join(parts, ", "), total>>10)
	}
	ctx := context.Background()
	cfg := jetstream.DefaultConfig()
	cfg.URL, cfg.Provision, cfg.Replicas = strings.Join(urls, ","), true, 3
	c, err := jetstream.Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("provisioned (%d lanes, R3): %s", cfg.Lanes, rss())
	began := time.Now()
	for i := range tenants {
		for range 2 {
			if err := c.Calls().Publish(ctx, &call.Call{ID: call.NewID(), Tenant: fmt.Sprintf("tenant%05d", i), Tool: "run_shell"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(5 * time.Second) // let the servers settle before measuring, not synchronisation
	t.Logf("%d tenants with 2 calls each (published in %s), lanes: %s", tenants, time.Since(began).Round(time.Millisecond), rss())
	st, err := c.Calls().State(ctx)
	if err != nil || st.Pending != uint64(2*tenants) {
		t.Fatalf("queue state %+v %v", st, err)
	}

	// The design before lanes, beside it: a work-queue stream with a subject per tenant and one R3
	// durable consumer per tenant, with the same calls queued. Making them takes about 0.14 s each.
	if tenants > 2000 {
		t.Log("the design before lanes is measured up to 2 000 tenants")
		return
	}
	nc, err := nats.Connect(cfg.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := natsjs.New(nc)
	if _, err := js.CreateStream(ctx, natsjs.StreamConfig{Name: "OLD_CALLS", Subjects: []string{"old.*"}, Retention: natsjs.WorkQueuePolicy,
		Storage: natsjs.FileStorage, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	for i := range tenants {
		tenant := fmt.Sprintf("tenant%05d", i)
		for range 2 {
			if _, err := js.Publish(ctx, "old."+tenant, []byte(`{"tool":"run_shell"}`)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := js.CreateOrUpdateConsumer(ctx, "OLD_CALLS", natsjs.ConsumerConfig{Durable: "workers_" + tenant, FilterSubject: "old." + tenant,
			AckPolicy: natsjs.AckExplicitPolicy, Replicas: 3, MaxAckPending: -1}); err != nil {
			t.Fatalf("consumer %d of %d: %v", i, tenants, err)
		}
	}
	time.Sleep(5 * time.Second) // as above
	t.Logf("plus the same calls in a stream with one R3 consumer per tenant (made in %s): %s", time.Since(began).Round(time.Millisecond), rss())
}
