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
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.yaml.in/yaml/v3"

	"github.com/toolpool/toolpool/internal/audit"
	"github.com/toolpool/toolpool/internal/call"
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
	"github.com/toolpool/toolpool/internal/workspace"
)

// config is the worker's whole configuration: defaults, then the YAML file, then flags, then Validate.
type config struct {
	ID                string `yaml:"id"`
	NATSURL           string `yaml:"nats_url"`
	ContainerdAddress string `yaml:"containerd_address"`
	ContainerdBinary  string `yaml:"containerd_binary"`
	Namespace         string `yaml:"namespace"`
	Runtime           string `yaml:"runtime"`
	// RuntimeBinary is the OCI runtime the runc runtime's shim runs: "runc", "crun", a path, or "auto" (the
	// default: crun where it is installed, runs containers on this host and is recent enough, runc otherwise).
	RuntimeBinary string `yaml:"runtime_binary"`
	// Pool is the warm pool of runc containers created ahead of their calls.
	Pool poolConfig `yaml:"pool"`
	// RunnerBinary is toolpool-runner (cmd/toolpool-runner), mounted read-only in the calls' containers
	// as the built-in tools' runner; InitBinary is toolpool-init (cmd/toolpool-init), the warm pool's
	// init. Empty: the file of that name beside the worker's executable.
	RunnerBinary  string        `yaml:"runner_binary"`
	InitBinary    string        `yaml:"init_binary"`
	DataDir       string        `yaml:"data_dir"`
	WorkspacesDir string        `yaml:"workspaces_dir"`
	Slots         int           `yaml:"slots"`
	Listen        string        `yaml:"listen"`
	UID           uint32        `yaml:"uid"`
	GID           uint32        `yaml:"gid"`
	Heartbeat     time.Duration `yaml:"heartbeat"`
	// Lease is the TTL of a running call's lease on the NATS server (default three heartbeats).
	Lease          time.Duration `yaml:"lease"`
	DrainTimeout   time.Duration `yaml:"drain_timeout"`
	WorkspaceQuota int64         `yaml:"workspace_quota"`
	// FullOutputBytes is how much of each stream of a command is kept for reading by range (negative:
	// none); default 64 MiB.
	FullOutputBytes int64 `yaml:"full_output_bytes"`
	// Workspaces are the workspace API's lifecycle and limits (docs/workspaces.md).
	Workspaces workspacesConfig `yaml:"workspaces"`
	Image      string           `yaml:"image"`
	Metrics    metrics.Options  `yaml:"metrics"`
	// Egress is the base rules of every call's egress (which policy narrows), the DNS server and the
	// credential bindings of the egress proxy.
	Egress   egress.Config `yaml:"egress"`
	LogLevel string        `yaml:"log_level"`
	Tools    struct {
		Custom []tools.CustomTool `yaml:"custom"`
	} `yaml:"tools"`

	// Runtime (above) is the sandbox runtime of calls whose tenant names none: runc, gvisor, a key of
	// Runtimes, or a containerd runtime handler. Runtimes maps more sandbox runtime names, which tenants
	// may be given, to containerd runtime handlers ("kata": "io.containerd.kata.v2"); runc is always
	// offered, gvisor when gVisor is installed.
	Runtimes map[string]string `yaml:"runtimes"`
	GVisor   gvisorConfig      `yaml:"gvisor"`
}

// workspacesConfig is the worker's part of the workspace API: expiry, per-tenant limits, archive limits.
type workspacesConfig struct {
	// IdleTTL removes a workspace (with its snapshots) unused for this long; 0 keeps workspaces forever.
	IdleTTL time.Duration `yaml:"idle_ttl"`
	// SweepEvery is how often expired workspaces are looked for (default: a tenth of IdleTTL, at most a
	// minute).
	SweepEvery      time.Duration `yaml:"sweep_every"`
	MaxPerTenant    int           `yaml:"max_per_tenant"`
	MaxTenantBytes  int64         `yaml:"max_tenant_bytes"`
	ArchiveMaxFiles int           `yaml:"archive_max_files"`
	ArchiveMaxBytes int64         `yaml:"archive_max_bytes"`
}

// poolConfig is the worker's part of containerd.PoolConfig (the init is toolpool-init, InitBinary).
type poolConfig struct {
	// MaxSize is the most ready containers at once; 0 turns the pool off.
	MaxSize int `yaml:"max_size"`
	// MemoryBytes is the memory the ready containers may hold in all; 0 sets no budget beyond MaxSize.
	MemoryBytes int64 `yaml:"memory_bytes"`
	// MaxAge is the longest a ready container waits for a call before it is destroyed.
	MaxAge time.Duration `yaml:"max_age"`
}

func defaults() config {
	host, _ := os.Hostname()
	return config{
		ID: "worker-" + host, NATSURL: "nats://127.0.0.1:4222", Namespace: "toolpool", Runtime: containerd.RuncRuntime,
		DataDir: "/var/lib/toolpool/worker", Slots: 4, Listen: "127.0.0.1:9091", UID: 65532, GID: 65532,
		Heartbeat: 5 * time.Second, DrainTimeout: 30 * time.Second, LogLevel: "info", WorkspaceQuota: 1 << 30,
		Metrics: metrics.Options{TenantLabel: true, MaxTenants: metrics.DefaultMaxTenants},
		Pool:    poolConfig{MaxSize: 8, MemoryBytes: 256 << 20, MaxAge: 10 * time.Minute},
		// crun where it holds: it starts a container with less CPU than runc (docs/deploy.md).
		RuntimeBinary: containerd.RuntimeBinaryAuto,
	}
}

func (c *config) validate() error {
	var errs []error
	if c.Slots < 1 || c.Slots > 1024 {
		errs = append(errs, fmt.Errorf("slots %d is outside 1..1024", c.Slots))
	}
	if !filepath.IsAbs(c.DataDir) {
		errs = append(errs, fmt.Errorf("data dir %q must be absolute", c.DataDir))
	}
	if c.UID == 0 || c.GID == 0 {
		errs = append(errs, errors.New("uid and gid must not be 0: sandboxes never run as root"))
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if c.Pool.MaxSize < 0 || c.Pool.MaxSize > 1024 {
		errs = append(errs, fmt.Errorf("pool.max_size %d is outside 0..1024 (0 turns the warm pool off)", c.Pool.MaxSize))
	}
	if c.Pool.MemoryBytes < 0 {
		errs = append(errs, fmt.Errorf("pool.memory_bytes %d is negative (0 sets no memory budget)", c.Pool.MemoryBytes))
	}
	if c.Pool.MaxAge < 0 {
		errs = append(errs, fmt.Errorf("pool.max_age %s is negative", c.Pool.MaxAge))
	}
	for name := range c.Runtimes {
		if err := call.ValidateName("runtime", name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sandboxBinaries returns the host paths of toolpool-runner and toolpool-init: as configured, or beside
// the worker's executable. Each must be a regular file.
func (c *config) sandboxBinaries() (runner, init string, err error) {
	self, err := os.Executable()
	if err != nil {
		return "", "", fmt.Errorf("find the worker's executable: %w", err)
	}
	find := func(configured, name, key string) (string, error) {
		p := configured
		if p == "" {
			p = filepath.Join(filepath.Dir(self), name)
		}
		fi, err := os.Stat(p)
		if err == nil && !fi.Mode().IsRegular() {
			err = errors.New("not a regular file")
		}
		if err != nil {
			return "", fmt.Errorf("find %s, which runs inside the calls' containers: %w: build it beside the worker (make build puts bin/%s next to bin/worker) or set %s", name, err, name, key)
		}
		return filepath.Abs(p)
	}
	if runner, err = find(c.RunnerBinary, "toolpool-runner", "runner_binary"); err != nil {
		return "", "", err
	}
	if init, err = find(c.InitBinary, "toolpool-init", "init_binary"); err != nil {
		return "", "", err
	}
	return runner, init, nil
}

// gvisorConfig offers the sandbox runtime "gvisor": gVisor's runsc under containerd's runc shim
// (docs/security.md).
type gvisorConfig struct {
	// Runsc is gVisor's runsc. Empty means "runsc" on PATH, and gVisor is offered only when it is there;
	// a path given here must exist.
	Runsc string `yaml:"runsc"`
	// Platform is systrap (default), ptrace or kvm (needs /dev/kvm).
	Platform string `yaml:"platform"`
	// Disabled never offers gVisor, even when runsc is installed.
	Disabled bool `yaml:"disabled"`
}

// gvisor returns the gVisor settings of the sandbox, or nil when gVisor is not offered: disabled, named in
// Runtimes (a node's own gVisor shim), or not installed.
func (c *config) gvisor() *containerd.GVisorConfig {
	if _, named := c.Runtimes[containerd.GVisorRuntime]; c.GVisor.Disabled || named {
		return nil
	}
	if c.GVisor.Runsc == "" {
		if _, err := exec.LookPath("runsc"); err != nil {
			return nil
		}
	}
	return &containerd.GVisorConfig{Runsc: c.GVisor.Runsc, Platform: c.GVisor.Platform}
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log level %q is not debug, info, warn or error", s)
	}
	return l, nil
}

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

// loadConfig applies defaults, then the file, then flags, then validates.
func loadConfig(fs *flag.FlagSet, args []string) (config, error) {
	cfg := defaults()
	configPath := fs.String("config", "", "YAML config file")
	id := fs.String("id", "", "worker id (default worker-HOSTNAME)")
	natsURL := fs.String("nats-url", "", "NATS server URL (default nats://127.0.0.1:4222, the dispatcher's embedded server)")
	ctrd := fs.String("containerd-address", "", "containerd socket; empty starts a private containerd under the data dir")
	runtimeName := fs.String("runtime", "", "sandbox runtime of calls whose tenant names none: runc (default), gvisor, a name from runtimes, or a containerd runtime handler")
	runtimeBinary := fs.String("runtime-binary", "", "OCI runtime the shim of the runc runtime runs: runc, crun, a path, or auto (default: crun where it works here and is recent enough, else runc)")
	poolSize := fs.Int("pool-size", 0, "most runc containers kept ready ahead of calls (default 8; 0: no warm pool)")
	dataDir := fs.String("data-dir", "", "state directory (default /var/lib/toolpool/worker)")
	wsDir := fs.String("workspaces", "", "workspaces directory (default DATA_DIR/workspaces)")
	slots := fs.Int("slots", 0, "calls run at once (default 4)")
	listen := fs.String("listen", "", "address for /metrics, /healthz and /readyz (default 127.0.0.1:9091)")
	logLevel := fs.String("log-level", "", "debug, info, warn or error")
	drain := fs.Duration("drain-timeout", 0, "on SIGTERM, how long running calls may finish before they are killed (default 30s)")
	image := fs.String("image", "", "run every call in this OCI image (import it with 'worker import-image') instead of the host's read-only /usr")
	wsQuota := fs.Int64("workspace-quota", 0, "most bytes one workspace may use (default 1 GiB; -1: no quota)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if *configPath != "" {
		if err := decodeYAMLFile(*configPath, &cfg); err != nil {
			return cfg, err
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	apply := func(name string, dst *string, v string) {
		if set[name] {
			*dst = v
		}
	}
	apply("id", &cfg.ID, *id)
	apply("nats-url", &cfg.NATSURL, *natsURL)
	apply("containerd-address", &cfg.ContainerdAddress, *ctrd)
	apply("runtime", &cfg.Runtime, *runtimeName)
	apply("runtime-binary", &cfg.RuntimeBinary, *runtimeBinary)
	if set["pool-size"] {
		cfg.Pool.MaxSize = *poolSize
	}
	apply("data-dir", &cfg.DataDir, *dataDir)
	apply("workspaces", &cfg.WorkspacesDir, *wsDir)
	apply("listen", &cfg.Listen, *listen)
	apply("log-level", &cfg.LogLevel, *logLevel)
	apply("image", &cfg.Image, *image)
	if set["slots"] {
		cfg.Slots = *slots
	}
	if set["drain-timeout"] {
		cfg.DrainTimeout = *drain
	}
	if set["workspace-quota"] {
		cfg.WorkspaceQuota = *wsQuota
	}
	if cfg.WorkspaceQuota < 0 {
		cfg.WorkspaceQuota = 0
	}
	if abs, err := filepath.Abs(cfg.DataDir); err == nil {
		cfg.DataDir = abs
	}
	if cfg.WorkspacesDir == "" {
		cfg.WorkspacesDir = filepath.Join(cfg.DataDir, "workspaces")
	}
	if abs, err := filepath.Abs(cfg.WorkspacesDir); err == nil {
		cfg.WorkspacesDir = abs
	}
	return cfg, cfg.validate()
}

func decodeYAMLFile(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open config: %w", err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("read config %s: %w", path, err)
	}
	return nil
}

func run(args []string) (retErr error) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	cfg, err := loadConfig(fs, args)
	if err != nil {
		return err
	}
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

	// The first SIGINT, SIGTERM or SIGHUP drains; a second one kills the running calls at once.
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(signals)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	secondSignal := make(chan struct{})
	go func() {
		<-signals
		stop()
		<-signals
		close(secondSignal)
	}()

	// Tracing is off (no-op, no cost) unless an OTEL_* exporter variable is set.
	shutdownTracing, err := tracing.Setup(ctx, "toolpool-worker", tracing.WithLogger(log),
		tracing.WithResourceAttributes(attribute.String("service.instance.id", cfg.ID)))
	if err != nil {
		return err
	}
	defer tracing.Flush(shutdownTracing)
	promReg := prometheus.NewRegistry()
	wm := metrics.NewWorker(promReg, cfg.Metrics)

	lease := cfg.Lease
	if lease == 0 {
		lease = max(3*cfg.Heartbeat, time.Second)
	}
	if lease < time.Second {
		return fmt.Errorf("lease %s is below 1s, the shortest TTL the NATS server keeps: raise lease", lease)
	}
	skew, err := testClockSkew()
	if err != nil {
		return err
	}

	address := cfg.ContainerdAddress
	var daemon *supervisedDaemon
	if address == "" {
		daemon, err = startSupervised(ctx, containerd.DaemonConfig{Dir: filepath.Join(cfg.DataDir, "containerd"), Binary: cfg.ContainerdBinary}, log)
		if err != nil {
			return err
		}
		defer func() { retErr = errors.Join(retErr, daemon.Stop()) }()
		address = daemon.Address()
		log.Info("started private containerd", "address", address)
	}
	runner, initBinary, err := cfg.sandboxBinaries()
	if err != nil {
		return err
	}
	// Every pooled container carries the tool runner too, so that a tool call, which mounts it, can run
	// in one.
	rt, err := containerd.New(ctx, containerd.Config{
		Address: address, Namespace: cfg.Namespace, RuntimeName: cfg.Runtime, RuntimeBinary: cfg.RuntimeBinary,
		Runtimes: cfg.Runtimes, GVisor: cfg.gvisor(),
		StateDir: filepath.Join(cfg.DataDir, "sandbox"), UID: cfg.UID, GID: cfg.GID, WorkerID: cfg.ID, OnCleanup: wm.ObserveCleanup,
		Pool: containerd.PoolConfig{MaxSize: cfg.Pool.MaxSize, MemoryBytes: cfg.Pool.MemoryBytes, MaxAge: cfg.Pool.MaxAge,
			InitBinary: initBinary, InitPath: sandboxinit.Path, Mounts: []sandbox.Mount{{Source: runner, Destination: incontainer.RunnerPath}}},
	})
	if err != nil {
		return err
	}
	defer rt.Close()
	// The first call of the usual profile (the worker's root filesystem, default limits) finds a container
	// ready; other profiles warm up from their first call.
	rt.Prewarm(sandbox.Spec{Image: cfg.Image})
	// Draining a worker drains its pool: no idle containers are kept for calls that will not come.
	go func() {
		<-ctx.Done()
		rt.DrainPool()
	}()
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
	defer conn.Close()
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
	// swept up here (calls in flight are spared): once per lease.
	go func() {
		t := time.NewTicker(max(lease, time.Second))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				removeOrphans()
			}
		}
	}()
	if daemon != nil {
		// A containerd that died took its calls' task streams with it: those calls end with an error,
		// and once it is back, whatever they left is removed.
		go daemon.Supervise(ctx, removeOrphans)
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
	w, err := worker.New(worker.Config{
		ID: cfg.ID, WorkspacesDir: cfg.WorkspacesDir, RunnerBinary: runner, UID: int(cfg.UID), GID: int(cfg.GID),
		Heartbeat: cfg.Heartbeat, Lease: lease, AckWait: conn.AckWait(), MaxDeliver: conn.MaxDeliver(), Now: conn.Now,
		WorkspaceQuota: cfg.WorkspaceQuota, Image: cfg.Image, EgressDir: filepath.Join(cfg.DataDir, "egress"), Egress: gateway,
		FullOutputBytes: cfg.FullOutputBytes, SpoolDir: filepath.Join(cfg.DataDir, "spool"),
		Workspaces: workspace.Config{
			IdleTTL: cfg.Workspaces.IdleTTL, MaxWorkspaces: cfg.Workspaces.MaxPerTenant, MaxBytes: cfg.Workspaces.MaxTenantBytes,
			Archive: workspace.Limits{Files: cfg.Workspaces.ArchiveMaxFiles, Bytes: cfg.Workspaces.ArchiveMaxBytes},
		},
	}, tracing.TraceRuntime(metrics.ObserveRuntime(rt, wm)), store, reg, log,
		worker.WithLeases(conn.Leases()), worker.WithOutputs(conn.Outputs()), worker.WithCreator(audited), worker.WithLive(conn.Live()),
		worker.WithTransfers(conn.Outputs()))
	if err != nil {
		return err
	}
	if ttl := cfg.Workspaces.IdleTTL; ttl > 0 {
		every := cfg.Workspaces.SweepEvery
		if every <= 0 {
			every = min(ttl/10, time.Minute)
		}
		go sweepWorkspaces(ctx, w, every, log)
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
	srv := &http.Server{Addr: cfg.Listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serve health and metrics", "error", err)
		}
	}()
	defer srv.Close()

	log.Info("worker ready", "image", cfg.Image, "slots", cfg.Slots, "nats", cfg.NATSURL, "containerd", address, "runtime", cfg.Runtime,
		"runtimes", rt.Runtimes(), "oci_runtime", rt.OCIRuntime(), "pool_size", cfg.Pool.MaxSize, "workspaces", cfg.WorkspacesDir)
	handle := metrics.InstrumentHandler(cfg.Slots, tracing.TraceHandler(w.Handle), wm)
	err = consumeDraining(ctx, cfg.DrainTimeout, secondSignal, log, func(fetchCtx, runCtx context.Context) error {
		return conn.Calls().ConsumeWith(fetchCtx, runCtx, cfg.Slots, handle)
	})
	log.Info("worker stopped")
	return err
}

// consumeDraining runs consume and drains it when ctx ends (SIGTERM): consume's fetch context is ctx, so it
// stops taking calls at once, while its run context, which the running calls get, lasts until grace has
// passed or kill is closed (a second signal); the calls still running then are killed, and each is recorded
// as cancelled. It returns consume's error once consume has returned.
func consumeDraining(ctx context.Context, grace time.Duration, kill <-chan struct{}, log *slog.Logger,
	consume func(fetchCtx, runCtx context.Context) error) error {
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	consumed := make(chan struct{})
	go func() {
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
	}()
	err := consume(ctx, runCtx)
	close(consumed)
	return err
}

// sweepWorkspaces removes expired workspaces every interval until ctx ends.
func sweepWorkspaces(ctx context.Context, w *worker.Worker, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		removed, err := w.SweepWorkspaces(ctx)
		for _, name := range removed {
			log.Info("workspace expired and removed", "workspace", name)
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("sweep expired workspaces", "error", err)
		}
	}
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

// supervisedDaemon is the worker's private containerd, restarted when it dies.
type supervisedDaemon struct {
	cfg     containerd.DaemonConfig
	log     *slog.Logger
	mu      sync.Mutex
	current *containerd.Daemon
	stopped bool
}

func startSupervised(ctx context.Context, cfg containerd.DaemonConfig, log *slog.Logger) (*supervisedDaemon, error) {
	d, err := containerd.StartDaemon(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &supervisedDaemon{cfg: cfg, log: log, current: d}, nil
}

// Address is the daemon's socket; it stays the same across restarts.
func (s *supervisedDaemon) Address() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current.Address()
}

// Supervise restarts the daemon whenever it exits, until ctx ends or Stop is called, and runs afterRestart
// once it is back. It blocks.
func (s *supervisedDaemon) Supervise(ctx context.Context, afterRestart func()) {
	for {
		s.mu.Lock()
		d := s.current
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-d.Done():
		}
		backoff := 100 * time.Millisecond
		for {
			s.mu.Lock()
			if s.stopped || ctx.Err() != nil {
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
			s.log.Error("containerd exited; restarting it")
			nd, err := containerd.StartDaemon(ctx, s.cfg)
			if err == nil {
				s.mu.Lock()
				s.current = nd
				s.mu.Unlock()
				s.log.Info("restarted private containerd")
				afterRestart()
				break
			}
			s.log.Error("restart containerd", "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}
}

// Stop stops the daemon and the supervision. It is idempotent.
func (s *supervisedDaemon) Stop() error {
	s.mu.Lock()
	s.stopped = true
	d := s.current
	s.mu.Unlock()
	return d.Stop(context.Background())
}
