// Command worker pulls tool calls from JetStream and runs each in a fresh containerd container.
//
//	worker [flags]                     run the worker
//	worker import-image --file F.tar   import an OCI image tarball into the worker's containerd
//
// The programs that run inside the calls' containers are binaries of their own, which the worker finds
// beside its executable (runner_binary, init_binary): toolpool-runner, the built-in tools and the egress
// forwarder, and toolpool-init, the warm pool's init.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"

	"github.com/toolpool/toolpool/internal/audit"
	"github.com/toolpool/toolpool/internal/metrics"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/sandboxinit"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tools/egress"
	"github.com/toolpool/toolpool/internal/tools/incontainer"
	"github.com/toolpool/toolpool/internal/tracing"
	"github.com/toolpool/toolpool/internal/worker"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case incontainer.RunnerCommand, incontainer.ForwardCommand, sandboxinit.Command:
			fmt.Fprintf(os.Stderr, "worker: %s is no longer the worker's: the worker mounts toolpool-runner and toolpool-init, built beside it (make build), into the calls' containers\n", os.Args[1])
			os.Exit(2)
		case "import-image":
			os.Exit(importImage(os.Args[2:]))
		}
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

// run runs the worker until a signal, then drains. Shutdown is ordered (teardown): stop taking calls,
// drain the running ones, stop the loops and the HTTP server and join their goroutines, then close the
// queue connection, the runtime and the private containerd.
func run(args []string) (retErr error) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	cfg, err := loadConfig(fs, args)
	if err != nil {
		return err
	}
	runner, initBinary, err := cfg.checkHost()
	if err != nil {
		return err
	}
	healthLn, err := listenHealth(cfg.Listen)
	if err != nil {
		return err
	}
	defer healthLn.Close() // Serve's, once it serves; this one covers a start that fails before
	level, _ := parseLevel(cfg.LogLevel)
	log := slog.New(tracing.LogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))).With("worker", cfg.ID)
	// The egress gateway first: a bad credential or rule stops the worker before anything starts.
	gateway, err := egress.NewGateway(cfg.Egress, egress.WithLookupEnv(os.LookupEnv))
	if err != nil {
		return err
	}
	if cfg.Egress.Test.Enabled() {
		log.Warn("egress test settings are on: addresses in egress.test.public_addrs count as public and egress.test.ca_files are trusted; never use them in production",
			"public_addrs", cfg.Egress.Test.PublicAddrs, "ca_files", cfg.Egress.Test.CAFiles)
	}
	for _, c := range cfg.Egress.Credentials {
		log.Info("egress credential bound", "name", c.Name, "host", c.Host, "tenants", c.Tenants) // never the secret
	}
	skew, err := testClockSkew()
	if err != nil {
		return err
	}

	// The first SIGINT, SIGTERM or SIGHUP drains; a second one kills the running calls at once.
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(signals)
	ctx, stop := context.WithCancel(context.Background())
	td := newTeardown(stop)
	defer func() { retErr = errors.Join(retErr, td.shutdown()) }()
	secondSignal := make(chan struct{})
	td.Go(func() {
		select {
		case <-signals:
			stop()
		case <-td.Quit():
			return
		}
		select {
		case <-signals:
			close(secondSignal)
		case <-td.Quit():
		}
	})

	// Tracing is off (no-op, no cost) unless an OTEL_* exporter variable is set.
	shutdownTracing, err := tracing.Setup(ctx, "toolpool-worker", tracing.WithLogger(log),
		tracing.WithResourceAttributes(attribute.String("service.instance.id", cfg.ID)))
	if err != nil {
		return err
	}
	td.OnClose(func() error { tracing.Flush(shutdownTracing); return nil })
	promReg := prometheus.NewRegistry()
	wm := metrics.NewWorker(promReg, cfg.Metrics)

	address := cfg.ContainerdAddress
	var daemon *supervisedDaemon
	if address == "" {
		daemon, err = startSupervised(ctx, containerd.DaemonConfig{Dir: filepath.Join(cfg.DataDir, "containerd"), Binary: cfg.ContainerdBinary}, log)
		if err != nil {
			return err
		}
		td.OnClose(daemon.Stop)
		address = daemon.Address()
		log.Info("started private containerd", "address", address)
	}
	scfg := cfg.sandboxConfig(address, runner, initBinary)
	scfg.OnCleanup = wm.ObserveCleanup
	scfg.Pull.OnWarning = func(msg string) { log.Warn("image cache", "warning", msg) }
	scfg.Pull.OnPull, scfg.Pull.OnLookup, scfg.Pull.OnCacheBytes = wm.ObserveImagePull, wm.ObserveImageLookup, wm.SetImageCacheBytes
	rt, err := containerd.New(ctx, scfg)
	if err != nil {
		return err
	}
	td.OnClose(func() error { rt.Close(); return nil })
	// The first call of the usual profile (the worker's root filesystem, default limits) finds a container
	// ready; other profiles warm up from their first call. The worker's default image and its pinned
	// images are pulled in the background from the start, each then kept warm like the host view: the
	// worker takes calls meanwhile (a call on one of them joins its pull).
	var ahead []string
	if cfg.Image == "" {
		rt.Prewarm(sandbox.Spec{})
	} else {
		ahead = append(ahead, cfg.Image)
	}
	ahead = append(ahead, cfg.Images.Pinned...)
	td.Go(func() { pullAhead(ctx, rt, ahead, cfg.Pool.MaxSize > 0, log) })
	// Draining a worker drains its pool: no idle containers are kept for calls that will not come.
	td.Go(func() {
		<-ctx.Done()
		rt.DrainPool()
	})
	wm.WatchPool(func() metrics.PoolState {
		st := rt.PoolStats()
		return metrics.PoolState{Ready: st.Ready, Creating: st.Creating, Target: st.Target, MemoryBytes: st.MemoryBytes,
			OldestAge: st.OldestAge, Created: st.Created, CreateFailures: st.CreateFailures, Discarded: st.Discarded}
	})
	for _, msg := range rt.Warnings() {
		log.Warn("sandbox runtime needs attention", "warning", msg)
	}
	// The local clock, skewed in tests only (testClockSkewEnv); every judgement of time goes by the NATS
	// server's clock, which the connection estimates from this one.
	localClock := func() time.Time { return time.Now().Add(skew) }
	qcfg := jetstream.DefaultConfig()
	qcfg.URL, qcfg.Name = cfg.NATSURL, cfg.ID
	conn, err := connectRetry(ctx, qcfg, log, jetstream.WithLocalClock(localClock))
	if err != nil {
		return err
	}
	td.OnClose(func() error { conn.Close(); return nil })
	// A container whose call's lease is gone is removed, whichever worker made it: a worker killed and
	// replaced under another id leaves its containers to the replacement.
	ownerGone := func(ctx context.Context, id string) (bool, error) {
		held, err := conn.Leases().LeaseHeld(ctx, id)
		return !held, err
	}
	removeOrphans := func() {
		if n, err := rt.RemoveOrphansOf(ctx, ownerGone); err != nil {
			log.Warn("remove orphan containers", "error", err)
		} else if n > 0 {
			log.Info("removed orphan containers", "count", n)
		}
	}
	removeOrphans()
	// A container whose removal failed after its call finished, or whose owner's lease lapsed since, is
	// swept up here (calls in flight are spared): once per lease, and often enough that the sweep, which
	// marks this worker's pooled containers alive, keeps other workers on the same containerd off them.
	td.Go(func() {
		t := time.NewTicker(min(max(cfg.Lease, time.Second), containerd.PoolOwnerStale/4))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				removeOrphans()
			}
		}
	})
	if daemon != nil {
		// A containerd that died took its calls' task streams with it: those calls end with an error,
		// and once it is back, whatever they left is removed.
		td.Go(func() { daemon.Supervise(ctx, removeOrphans) })
	}
	for _, p := range []string{incontainer.RunnerPath, incontainer.EgressSocket} {
		if err := rt.EnsureMountPoint(p, false); err != nil {
			return err
		}
	}

	reg, err := tools.NewRegistry(cfg.Tools.Custom...)
	if err != nil {
		return fmt.Errorf("load tools: %w", err)
	}
	wm.WatchNATS(conn.Ready)
	wm.WatchContainerd(rt.Ready)

	// The decorators, innermost first: audit log and metrics on the store, tracing outermost; metrics and
	// tracing on the runtime.
	audited := audit.Wrap(conn.Records(), conn.Audit(), func(err error) { log.Warn("write audit event", "error", err) })
	store := tracing.TraceWorkerStore(metrics.ObserveWorkerStore(audited, wm))
	opts := []worker.Option{worker.WithLeases(conn.Leases()), worker.WithOutputs(conn.Outputs()), worker.WithCreator(audited),
		worker.WithLive(conn.Live()), worker.WithTransfers(conn.Outputs())}
	cp, err := cfg.checkpointer(ctx, conn, wm.ObserveCheckpoint)
	if err != nil {
		return err
	}
	if cp != nil {
		opts = append(opts, worker.WithCheckpoints(cp), worker.WithHomes(conn.Homes()), worker.WithResidents(conn.Residents()))
		wm.WatchUnsaved(cp.OldestUnsaved)
		log.Info("workspaces are kept in object storage", "store", cfg.Checkpoints.Store)
	}
	w, err := worker.New(cfg.workerConfig(conn, runner, gateway), tracing.TraceRuntime(metrics.ObserveRuntime(rt, wm)), store, reg, log, opts...)
	if err != nil {
		return err
	}
	if cp != nil {
		td.Go(func() { saveUnsaved(ctx, w, log) })
		usr1 := make(chan os.Signal, 1) // SIGUSR1: collect checkpoint garbage now
		signal.Notify(usr1, syscall.SIGUSR1)
		td.Go(func() {
			defer signal.Stop(usr1)
			collectGarbage(ctx, cp, conn.Leases(), cfg.ID, cfg.Checkpoints.GCEvery, usr1, wm, log)
		})
	}
	if cfg.Workspaces.IdleTTL > 0 {
		td.Go(func() { sweepWorkspaces(ctx, w, cfg.Workspaces.SweepEvery, log) })
	}

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler(promReg))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := errors.Join(rt.Ready(r.Context()), conn.Ready(r.Context())); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	td.OnStop(func() { srv.Close() })
	td.Go(func() {
		if err := srv.Serve(healthLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serve health and metrics", "error", err)
		}
	})

	log.Info("worker ready", "image", cfg.Image, "slots", cfg.Slots, "nats", cfg.NATSURL, "containerd", address, "runtime", cfg.Runtime,
		"runtimes", rt.Runtimes(), "oci_runtime", rt.OCIRuntime(), "pool_size", cfg.Pool.MaxSize, "workspaces", cfg.WorkspacesDir)
	handle := metrics.InstrumentHandler(cfg.Slots, tracing.TraceHandler(w.Handle), wm)
	err = consumeDraining(ctx, cfg.DrainTimeout, secondSignal, log, func(fetchCtx, runCtx context.Context) error {
		if cp != nil {
			// Workspaces live on workers: this worker takes the calls routed to it (its workspaces'), and
			// those of workers that are gone, before the shared lanes.
			return conn.WorkerCalls(cfg.ID, cfg.Lease).ConsumeWith(fetchCtx, runCtx, cfg.Slots, handle)
		}
		return conn.Calls().ConsumeWith(fetchCtx, runCtx, cfg.Slots, handle)
	})
	if cp != nil {
		// Changes a failed checkpoint left here go to object storage before the worker exits, on a fresh,
		// bounded context: the calls are done, the connection still open.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unsavedAtStop)
		if serr := w.SaveUnsaved(sctx); serr != nil {
			log.Error("workspace changes not checkpointed before the worker stopped: they stay on this node's disk", "error", serr)
		}
		cancel()
	}
	log.Info("worker stopped")
	return err
}

// unsavedEvery is how often workspaces whose checkpoint failed are saved again; unsavedAtStop bounds the
// last attempt as the worker stops.
const (
	unsavedEvery  = 30 * time.Second
	unsavedAtStop = 30 * time.Second
)

// saveUnsaved saves again, every unsavedEvery until ctx ends, the workspaces whose checkpoint failed.
func saveUnsaved(ctx context.Context, w *worker.Worker, log *slog.Logger) {
	every(ctx, unsavedEvery, func() {
		if err := w.SaveUnsaved(ctx); err != nil && ctx.Err() == nil {
			log.Warn("checkpoint workspaces whose checkpoint failed", "error", err)
		}
	})
}

// every runs f each interval until ctx ends.
func every(ctx context.Context, interval time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f()
	}
}

// consumeDraining runs consume and drains it when ctx ends (SIGTERM): consume's fetch context is ctx, so it
// stops taking calls at once, while its run context, which the running calls get, lasts until grace has
// passed or kill is closed (a second signal); the calls still running then are killed, and each is recorded
// as cancelled. It returns consume's error once consume and its own goroutine have returned.
func consumeDraining(ctx context.Context, grace time.Duration, kill <-chan struct{}, log *slog.Logger,
	consume func(fetchCtx, runCtx context.Context) error) error {
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	consumed := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		select {
		case <-ctx.Done():
			log.Info("worker draining", "drain_timeout", grace.String())
		case <-consumed:
			return
		}
		select {
		case <-time.After(grace):
			log.Warn("drain timeout: killing the calls still running")
			cancelRun()
		case <-kill:
			log.Warn("second signal: killing the calls still running")
			cancelRun()
		case <-consumed:
		}
	})
	err := consume(ctx, runCtx)
	close(consumed)
	return err
}

// sweepWorkspaces removes expired workspaces every interval until ctx ends.
func sweepWorkspaces(ctx context.Context, w *worker.Worker, interval time.Duration, log *slog.Logger) {
	every(ctx, interval, func() {
		removed, err := w.SweepWorkspaces(ctx)
		for _, name := range removed {
			log.Info("workspace expired and removed", "workspace", name)
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("sweep expired workspaces", "error", err)
		}
	})
}

// testClockSkewEnv, when set to a duration ("90s", "-10m"), skews this worker's local clock: the cluster
// test's clock-skew fault. It is read only here, in main, and never documented for operators.
const testClockSkewEnv = "TOOLPOOL_TEST_CLOCK_SKEW"

func testClockSkew() (time.Duration, error) {
	v := os.Getenv(testClockSkewEnv)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not a duration: %w", testClockSkewEnv, v, err)
	}
	return d, nil
}

// connectRetry connects to NATS, retrying while the dispatcher that embeds it is still starting.
func connectRetry(ctx context.Context, cfg jetstream.Config, log *slog.Logger, opts ...jetstream.Option) (*jetstream.Conn, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := jetstream.Connect(cctx, cfg, opts...)
		cancel()
		if err == nil {
			return conn, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, err
		}
		log.Info("waiting for nats", "url", cfg.URL, "error", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func importImage(args []string) int {
	fs := flag.NewFlagSet("import-image", flag.ContinueOnError)
	file := fs.String("file", "", "OCI or Docker image tarball")
	cfgAddr := fs.String("containerd-address", "", "containerd socket (default the private one under --data-dir)")
	dataDir := fs.String("data-dir", defaults().DataDir, "the worker's data dir")
	ns := fs.String("namespace", defaults().Namespace, "containerd namespace")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *file == "" {
		fmt.Fprintln(os.Stderr, "usage: worker import-image --file IMAGE.tar [--data-dir DIR | --containerd-address SOCK]")
		return 2
	}
	ctx := context.Background()
	addr := *cfgAddr
	if addr == "" {
		addr = filepath.Join(*dataDir, "containerd", "containerd.sock")
		if _, err := os.Stat(addr); err != nil {
			d, err := containerd.StartDaemon(ctx, containerd.DaemonConfig{Dir: filepath.Join(*dataDir, "containerd")})
			if err != nil {
				fmt.Fprintln(os.Stderr, "worker import-image:", err)
				return 1
			}
			defer d.Stop(ctx)
			addr = d.Address()
		}
	}
	names, err := containerd.ImportImage(ctx, addr, *ns, *file)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker import-image:", err)
		return 1
	}
	fmt.Println("imported:", strings.Join(names, ", "))
	return 0
}

// pullAheadWarmWithin bounds how long the worker waits, after pulling an image ahead, for the pool to have a
// container of it ready before it logs the image as pulled but not warm.
const pullAheadWarmWithin = time.Minute

// pullAhead pulls images (the worker's default image and its pinned ones) into the store one at a time
// and, when pooled, waits until the pool holds a ready container of each, logging each image's outcome:
// "image pulled ahead" (with warm, and why not), or a warning when it could not be pulled (calls on it
// then pull it). It returns when every image is done or ctx ends.
func pullAhead(ctx context.Context, rt *containerd.Runtime, images []string, pooled bool, log *slog.Logger) {
	for _, ref := range images {
		began := time.Now()
		if err := rt.PullAhead(ctx, ref); err != nil {
			if ctx.Err() != nil {
				return // the worker is stopping
			}
			log.Warn("pull image ahead: calls on it will pull it", "image", ref, "error", err)
			continue
		}
		took := time.Since(began).Round(time.Millisecond)
		why := "the warm pool is off (pool.max_size: 0)"
		if pooled {
			wctx, cancel := context.WithTimeout(ctx, pullAheadWarmWithin)
			err := rt.WaitWarm(wctx, sandbox.Spec{Image: ref})
			cancel()
			why = ""
			if err != nil {
				why = err.Error()
			}
		}
		log.Info("image pulled ahead", "image", ref, "took", took.String(), "warm", why == "", "not_warm_because", why)
	}
}
