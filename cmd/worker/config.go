package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/metrics"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/containerd"
	"github.com/toolpool/toolpool/internal/sandbox/sandboxinit"
	"github.com/toolpool/toolpool/internal/tools"
	"github.com/toolpool/toolpool/internal/tools/egress"
	"github.com/toolpool/toolpool/internal/tools/incontainer"
	"github.com/toolpool/toolpool/internal/worker"
	"github.com/toolpool/toolpool/internal/workspace"
	"github.com/toolpool/toolpool/internal/yamlfile"
)

// config is the worker's whole configuration, loaded in one path (loadConfig): defaults, then the YAML
// file, then flags, then the values derived from others, then validate. Each default a library owns is
// taken from that library (worker, containerd); the values that are the command's own are in defaults.
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
	// Lease is the TTL of a running call's lease on the NATS server (default worker.DefaultLease: three
	// heartbeats, at least 1s).
	Lease        time.Duration `yaml:"lease"`
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// WorkspaceQuota is the most bytes one workspace may use (default 1 GiB); -1 (or 0) sets no quota.
	WorkspaceQuota int64 `yaml:"workspace_quota"`
	// FullOutputBytes is how much of each stream of a command is kept for reading by range (negative:
	// none); default worker.DefaultFullOutputBytes.
	FullOutputBytes int64 `yaml:"full_output_bytes"`
	// Workspaces are the workspace API's lifecycle and limits (docs/workspaces.md).
	Workspaces workspacesConfig `yaml:"workspaces"`
	// Checkpoints keeps workspaces in object storage, for workers without a shared workspaces directory.
	Checkpoints checkpointsConfig `yaml:"checkpoints"`
	// Image is the OCI image reference calls run on when neither the call nor its tenant names one; empty
	// means the host's read-only view. It is pulled on first use unless it is in the store already.
	Image string `yaml:"image"`
	// Images configures how images are pulled (docs/images.md).
	Images  imagesConfig    `yaml:"images"`
	Metrics metrics.Options `yaml:"metrics"`
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

// workspacesConfig is the worker's part of the workspace API: expiry, per-tenant limits, archive limits
// (workspace.Config; workerConfig copies it).
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

// imagesConfig is the worker's part of containerd.PullConfig; sandboxConfig copies it.
type imagesConfig struct {
	// Registries bind credentials (and plain HTTP) to registry hosts. They never enter a sandbox or a
	// result.
	Registries []containerd.RegistryConfig `yaml:"registries"`
	// MaxBytes bounds an image's size (its manifest's config and layers, compressed).
	MaxBytes int64 `yaml:"max_bytes"`
	// PullTimeout bounds one pull, resolve to unpacked snapshot.
	PullTimeout time.Duration `yaml:"pull_timeout"`
	// CacheBytes bounds the pulled images' content (0: keep every image); Pinned are never evicted.
	CacheBytes int64    `yaml:"cache_bytes"`
	Pinned     []string `yaml:"pinned"`
}

// poolConfig is the worker's part of containerd.PoolConfig (the init is toolpool-init, InitBinary);
// sandboxConfig copies it.
type poolConfig struct {
	// MaxSize is the most ready containers at once; 0 turns the pool off.
	MaxSize int `yaml:"max_size"`
	// MemoryBytes is the memory the ready containers may hold in all; 0 sets no budget beyond MaxSize.
	MemoryBytes int64 `yaml:"memory_bytes"`
	// MaxAge is the longest a ready container waits for a call before it is destroyed.
	MaxAge time.Duration `yaml:"max_age"`
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

// defaults returns the configuration before the file and flags: the command's own defaults, and the
// libraries' where they have them.
func defaults() config {
	host, _ := os.Hostname()
	pool := containerd.DefaultPoolConfig()
	return config{
		ID: "worker-" + host, NATSURL: jetstream.DefaultURL, Namespace: containerd.DefaultNamespace, Runtime: containerd.RuncRuntime,
		DataDir: "/var/lib/toolpool/worker", Slots: 4, Listen: "127.0.0.1:9091", UID: 65532, GID: 65532,
		Heartbeat: worker.DefaultHeartbeat, DrainTimeout: 30 * time.Second, LogLevel: "info", WorkspaceQuota: 1 << 30,
		FullOutputBytes: worker.DefaultFullOutputBytes,
		Metrics:         metrics.DefaultOptions(),
		Checkpoints:     defaultCheckpoints(),
		Pool:            poolConfig{MaxSize: pool.MaxSize, MemoryBytes: pool.MemoryBytes, MaxAge: pool.MaxAge},
		Images:          imagesConfig{MaxBytes: containerd.DefaultPullMaxBytes, PullTimeout: containerd.DefaultPullTimeout},
		// crun where it holds: it starts a container with less CPU than runc (docs/deploy.md).
		RuntimeBinary: containerd.RuntimeBinaryAuto,
	}
}

// loadConfig is the worker's one path to its configuration: defaults, then the file (-config), then the
// flags set on the command line, then the values derived from others (derive), then validate.
func loadConfig(fs *flag.FlagSet, args []string) (config, error) {
	cfg := defaults()
	configPath := fs.String("config", "", "YAML config file")
	id := fs.String("id", "", "worker id (default worker-HOSTNAME)")
	natsURL := fs.String("nats-url", "", "NATS server URL (default "+cfg.NATSURL+", the dispatcher's embedded server)")
	ctrd := fs.String("containerd-address", "", "containerd socket; empty starts a private containerd under the data dir")
	runtimeName := fs.String("runtime", "", "sandbox runtime of calls whose tenant names none: runc (default), gvisor, a name from runtimes, or a containerd runtime handler")
	runtimeBinary := fs.String("runtime-binary", "", "OCI runtime the shim of the runc runtime runs: runc, crun, a path, or auto (default: crun where it works here and is recent enough, else runc)")
	poolSize := fs.Int("pool-size", 0, fmt.Sprintf("most runc containers kept ready ahead of calls (default %d; 0: no warm pool)", cfg.Pool.MaxSize))
	dataDir := fs.String("data-dir", "", "state directory (default "+cfg.DataDir+")")
	wsDir := fs.String("workspaces", "", "workspaces directory (default DATA_DIR/workspaces)")
	slots := fs.Int("slots", 0, fmt.Sprintf("calls run at once (default %d)", cfg.Slots))
	listen := fs.String("listen", "", "address for /metrics, /healthz and /readyz (default "+cfg.Listen+")")
	logLevel := fs.String("log-level", "", "debug, info, warn or error")
	drain := fs.Duration("drain-timeout", 0, "on SIGTERM, how long running calls may finish before they are killed (default "+cfg.DrainTimeout.String()+")")
	image := fs.String("image", "", "run calls that name no image in this OCI image reference (pulled on first use, or imported with 'worker import-image') instead of the host's read-only /usr")
	wsQuota := fs.Int64("workspace-quota", 0, "most bytes one workspace may use (default 1 GiB; -1: no quota)")
	checkpoints := fs.String("checkpoints", "", "keep workspaces in object storage: none (default), jetstream or s3 (checkpoints.s3 in the config file)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if *configPath != "" {
		if err := yamlfile.Decode(*configPath, &cfg); err != nil {
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
	apply("checkpoints", &cfg.Checkpoints.Store, *checkpoints)
	if set["slots"] {
		cfg.Slots = *slots
	}
	if set["drain-timeout"] {
		cfg.DrainTimeout = *drain
	}
	if set["workspace-quota"] {
		cfg.WorkspaceQuota = *wsQuota
	}
	cfg.derive()
	return cfg, cfg.validate()
}

// derive fills the values that follow from others once the file and flags are in: the image's full name,
// the lease from the heartbeat, the workspaces directory from the data directory, the sweep interval from
// the idle TTL.
func (c *config) derive() {
	if name, err := containerd.ParseImageRef(c.Image); err == nil && c.Image != "" {
		c.Image = name // the store's full name, by which the warm pool matches calls (validate reports a bad one)
	}
	if c.WorkspaceQuota < 0 {
		c.WorkspaceQuota = 0
	}
	if c.Lease == 0 {
		c.Lease = worker.DefaultLease(c.Heartbeat)
	}
	if abs, err := filepath.Abs(c.DataDir); err == nil {
		c.DataDir = abs
	}
	if c.WorkspacesDir == "" {
		c.WorkspacesDir = filepath.Join(c.DataDir, "workspaces")
	}
	if abs, err := filepath.Abs(c.WorkspacesDir); err == nil {
		c.WorkspacesDir = abs
	}
	if ttl := c.Workspaces.IdleTTL; ttl > 0 && c.Workspaces.SweepEvery <= 0 {
		c.Workspaces.SweepEvery = min(ttl/10, time.Minute)
	}
}

// validate checks what can be checked before anything starts, each bad value with what to change. What
// depends on the queue server (the lease against its ack wait) is checked by worker.New.
func (c *config) validate() error {
	var errs []error
	if c.Slots < 1 || c.Slots > 1024 {
		errs = append(errs, fmt.Errorf("slots %d is outside 1..1024: set slots (--slots) to the calls to run at once", c.Slots))
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
	if c.Heartbeat <= 0 {
		errs = append(errs, fmt.Errorf("heartbeat %s must be positive (default %s)", c.Heartbeat, worker.DefaultHeartbeat))
	}
	if c.Lease < worker.MinLease {
		errs = append(errs, fmt.Errorf("lease %s is below %s, the shortest TTL the NATS server keeps: raise lease", c.Lease, worker.MinLease))
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
	if c.Image != "" {
		if _, err := containerd.ParseImageRef(c.Image); err != nil {
			errs = append(errs, fmt.Errorf("image (--image): %w", err))
		}
	}
	if c.Images.MaxBytes <= 0 {
		errs = append(errs, fmt.Errorf("images.max_bytes %d must be positive (default %d)", c.Images.MaxBytes, containerd.DefaultPullMaxBytes))
	}
	if c.Images.PullTimeout <= 0 {
		errs = append(errs, fmt.Errorf("images.pull_timeout %s must be positive (default %s)", c.Images.PullTimeout, containerd.DefaultPullTimeout))
	}
	if err := (&containerd.PullConfig{Registries: c.Images.Registries, CacheBytes: c.Images.CacheBytes, Pinned: c.Images.Pinned}).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("images.%w", err))
	}
	if err := c.Checkpoints.validate(); err != nil {
		errs = append(errs, err)
	}
	for name := range c.Runtimes {
		if err := call.ValidateName("runtime", name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sandboxConfig is the containerd runtime's configuration: the file's fields copied, and what the worker
// found (the containerd address, the runner and init binaries).
func (c *config) sandboxConfig(address, runner, initBinary string) containerd.Config {
	// Every pooled container carries the tool runner too, so that a tool call, which mounts it, can run
	// in one.
	return containerd.Config{
		Address: address, Namespace: c.Namespace, RuntimeName: c.Runtime, RuntimeBinary: c.RuntimeBinary,
		Runtimes: c.Runtimes, GVisor: c.gvisor(),
		StateDir: filepath.Join(c.DataDir, "sandbox"), UID: c.UID, GID: c.GID, WorkerID: c.ID,
		Pool: containerd.PoolConfig{MaxSize: c.Pool.MaxSize, MemoryBytes: c.Pool.MemoryBytes, MaxAge: c.Pool.MaxAge,
			InitBinary: initBinary, InitPath: sandboxinit.Path, Mounts: []sandbox.Mount{{Source: runner, Destination: incontainer.RunnerPath}}},
		Pull: containerd.PullConfig{Registries: c.Images.Registries, MaxBytes: c.Images.MaxBytes, Timeout: c.Images.PullTimeout,
			CacheBytes: c.Images.CacheBytes, Pinned: c.Images.Pinned},
	}
}

// queueTiming is what the worker's configuration takes from the queue connection: its ack wait, its
// max deliveries and the server's clock.
type queueTiming interface {
	AckWait() time.Duration
	MaxDeliver() int
	Now() time.Time
}

// workerConfig is the worker's configuration: the file's fields copied, the queue's timing, and what the
// worker found (the runner binary, the egress gateway).
func (c *config) workerConfig(q queueTiming, runner string, gateway *egress.Gateway) worker.Config {
	return worker.Config{
		ID: c.ID, WorkspacesDir: c.WorkspacesDir, RunnerBinary: runner, UID: int(c.UID), GID: int(c.GID),
		Heartbeat: c.Heartbeat, Lease: c.Lease, AckWait: q.AckWait(), MaxDeliver: q.MaxDeliver(), Now: q.Now,
		WorkspaceQuota: c.WorkspaceQuota, Image: c.Image, EgressDir: filepath.Join(c.DataDir, "egress"), Egress: gateway,
		FullOutputBytes: c.FullOutputBytes, SpoolDir: filepath.Join(c.DataDir, "spool"),
		Workspaces: workspace.Config{
			IdleTTL: c.Workspaces.IdleTTL, MaxWorkspaces: c.Workspaces.MaxPerTenant, MaxBytes: c.Workspaces.MaxTenantBytes,
			Archive: workspace.Limits{Files: c.Workspaces.ArchiveMaxFiles, Bytes: c.Workspaces.ArchiveMaxBytes},
		},
	}
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
