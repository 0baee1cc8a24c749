// Package containerd runs toolpool's per-call containers through containerd. It is the only package that
// imports containerd. A Runtime connects to a containerd socket (a shared one, or the private daemon that
// StartDaemon supervises), prepares the read-only host-view root once, and runs each call in a fresh,
// hardened container that it removes before Run returns.
package containerd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// Config configures a Runtime.
type Config struct {
	// Address is the containerd socket.
	Address string
	// Namespace is the containerd namespace of toolpool's containers.
	Namespace string
	// RuntimeName is the runtime of a Spec that names none: a runtime name this Runtime offers (RuncRuntime,
	// the default; GVisorRuntime; a key of Runtimes), or else a containerd runtime handler such as
	// io.containerd.kata.v2. docs/security.md says what each adds.
	RuntimeName string
	// Runtimes maps more runtime names a Spec may ask for (sandbox.Spec.Runtime) to containerd runtime
	// handlers, run with the handler's own defaults ("kata": "io.containerd.kata.v2"). RuncRuntime is
	// always offered, GVisorRuntime when GVisor is set. A Spec naming a runtime this Runtime does not offer
	// is refused with sandbox.ErrNoRuntime; nothing runs under another runtime instead.
	Runtimes map[string]string
	// GVisor, when set, offers GVisorRuntime. New fails when runsc is missing.
	GVisor *GVisorConfig
	// RuntimeBinary is the OCI runtime the runc shim of RuncRuntime runs (its BinaryName option): "runc",
	// "crun" or a path; empty means what the shim runs by default ("runc" on PATH, unless containerd's
	// config says otherwise). RuntimeBinaryAuto picks crun where it holds (installed, able to run containers
	// here, at least MinCrunVersion), runc otherwise, and says why in Warnings when crun is installed. An
	// explicit crun that cannot run containers on this host (CrunRefusal) fails New. The other runtimes
	// (gVisor, Runtimes) ignore it.
	RuntimeBinary string
	// ShimGroups, when positive, spreads the containers over that many runc shims (the shim's group
	// annotation) instead of starting one shim per container: a shim is a long-lived process of its own,
	// so grouping saves a process start per call and the memory of a shim per pooled container. A shim
	// that dies takes its group's containers with it. Ignored by other runtime handlers.
	ShimGroups int
	// Pool configures the warm pool; its zero value is no pool.
	Pool PoolConfig
	// Pull configures how images a Spec names and the store lacks are pulled (imageroot.go, pull.go).
	Pull PullConfig
	// StateDir holds the prepared root filesystem and the per-call FIFOs; the worker owns it.
	StateDir string
	// UID and GID run every sandbox process.
	UID, GID uint32
	// Defaults fill the zero fields of a Spec's Limits.
	Defaults sandbox.Limits
	// Ceiling caps every Spec's Limits, whatever the caller asked for: the runtime's own bound for when
	// policy is wrong. A zero field sets no ceiling for that limit. A workspace quota cannot be turned off
	// (negative WorkspaceBytes) when Ceiling.WorkspaceBytes is set.
	Ceiling sandbox.Limits
	// WorkerID labels the containers this runtime creates, so that cleanup after a crash finds only its own.
	WorkerID string
	// OnCleanup, when set, hears how long each container's removal took, its steps (delete_task,
	// delete_container, slot for a pooled container's slot directory) and whether it failed. Removal
	// happens after Run returns, so Outcome.CleanupTime is zero. Called from any goroutine.
	OnCleanup func(took time.Duration, steps []sandbox.Step, err error)
}

// DefaultLimits are the limits of a call when neither config nor policy says otherwise.
var DefaultLimits = sandbox.Limits{
	Timeout:     60 * time.Second,
	OutputBytes: 1 << 20,
	MemoryBytes: 512 << 20,
	PIDs:        256,
	CPUMillis:   1000,
	NoFile:      1024,
	TmpBytes:    256 << 20,
	// WorkspaceBytes is the workspace quota.
	WorkspaceBytes: 1 << 30,
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	switch {
	case c.Address == "":
		return errors.New("containerd address is empty")
	case c.Namespace == "":
		return errors.New("containerd namespace is empty")
	case c.StateDir == "" || !filepath.IsAbs(c.StateDir):
		return fmt.Errorf("state dir %q must be an absolute path", c.StateDir)
	case c.UID == 0 || c.GID == 0:
		return errors.New("sandbox uid and gid must not be 0: sandboxes never run as root")
	case c.ShimGroups < 0:
		return errors.New("shim groups must not be negative")
	}
	if err := c.validateRuntimes(); err != nil {
		return err
	}
	if err := c.Pull.Validate(); err != nil {
		return err
	}
	return c.Pool.validate()
}

const (
	labelWorker = "toolpool.worker"
	// rootfsPrefix names the host-view roots in StateDir: rootfs.<start time in ns>.
	rootfsPrefix = "rootfs."
	// ioDrainTimeout bounds how long Run waits, after the process exited, for the last output to arrive.
	ioDrainTimeout = 5 * time.Second
	// killRaceGrace is how long kill waits for an exit status after the OCI runtime refused to signal a
	// task, which it does when the process has just exited.
	killRaceGrace = 2 * time.Second
	// cleanupTimeout bounds each teardown, which runs on a fresh context so that a cancelled call still
	// leaves nothing behind.
	cleanupTimeout = 30 * time.Second
	// quotaInterval is the shortest pause between two measurements of a running call's workspace; a
	// workspace that takes long to measure is measured less often (quotaIntervalFactor times its
	// measuring time, at most quotaMaxInterval), so that measuring never costs more than a few percent.
	quotaInterval       = 500 * time.Millisecond
	quotaIntervalFactor = 20
	quotaMaxInterval    = 10 * time.Second
)

// Runtime runs sandbox.Specs in containerd containers. It implements sandbox.Runtime.
type Runtime struct {
	cfg      Config
	client   *containerd.Client
	rootfs   *hostRootFS
	fifos    string
	warnings []string
	// backends are the runtimes offered by name; def is a Spec's that names none.
	backends map[string]backend
	def      backend

	mu     sync.Mutex
	active map[string]bool // ids of the calls Run is running or removing, which RemoveOrphans leaves alone

	pool      *pool           // the warm pool; nil without Config.Pool
	slots     *containerSlots // what makes the pool's containers; nil without Config.Pool
	shimGroup atomic.Uint64   // the next container's shim group (ShimGroups)
	started   time.Time       // names this Runtime's root, slots and shim groups
	views     views           // cold calls' workspace views (Spec.Hidden)

	trustMu      sync.Mutex
	trustWritten map[string]bool // the CA bundles written under StateDir/ca, by name

	images *imagePuller

	cleanups     sync.WaitGroup
	cleanupSlots chan struct{}
}

// New connects to containerd, prepares the host-view root and checks the OCI runtime's version (see
// Warnings). The caller owns the Runtime and must Close it; Close does not stop containerd.
func New(ctx context.Context, cfg Config) (_ *Runtime, retErr error) {
	if cfg.RuntimeName == "" {
		cfg.RuntimeName = RuncRuntime
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validate sandbox config: %w", err)
	}
	cfg.Defaults = mergeLimits(cfg.Defaults, DefaultLimits)
	client, err := containerd.New(cfg.Address, containerd.WithDefaultNamespace(cfg.Namespace), containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect containerd at %s: %w", cfg.Address, err)
	}
	defer func() {
		if retErr != nil {
			client.Close()
		}
	}()
	if _, err := client.Version(ctx); err != nil {
		return nil, fmt.Errorf("query containerd version at %s: %w", cfg.Address, err)
	}
	puller, err := newImagePuller(client, cfg.Pull)
	if err != nil {
		return nil, err
	}
	var warnings []string
	if cfg.RuntimeBinary, warnings, err = resolveRuntimeBinary(ctx, RuncHandler, cfg.RuntimeBinary); err != nil {
		return nil, err
	}
	all, def, err := backends(cfg)
	if err != nil {
		return nil, err
	}
	// A fresh root for every Runtime: a crashed worker's containers may still be running (or, worse, being
	// created by runc, which writes mount points into its root) on the old one until RemoveOrphans has
	// removed them, and then it removes the old roots too.
	started := time.Now()
	rootfs, err := prepareHostRootFS(filepath.Join(cfg.StateDir, fmt.Sprintf("%s%d", rootfsPrefix, started.UnixNano())), cfg.UID, cfg.GID)
	if err != nil {
		return nil, fmt.Errorf("prepare host root: %w", err)
	}
	fifos := filepath.Join(cfg.StateDir, "fifo")
	if err := os.MkdirAll(fifos, 0o700); err != nil {
		return nil, fmt.Errorf("create fifo dir: %w", err)
	}
	switch {
	case def.runc:
		warnings = append(warnings, runtimeWarnings(ctx, RuncHandler, cfg.RuntimeBinary)...)
	case def.options == nil:
		warnings = append(warnings, runtimeWarnings(ctx, def.handler, cfg.RuntimeBinary)...)
	}
	r := &Runtime{cfg: cfg, client: client, rootfs: rootfs, fifos: fifos, warnings: warnings, backends: all, def: def,
		active: map[string]bool{}, trustWritten: map[string]bool{}, cleanupSlots: make(chan struct{}, maxPendingCleanups), started: started,
		images: puller}
	if cfg.Pool.MaxSize > 0 {
		slots, err := newContainerSlots(r, cfg.Pool, started)
		if err != nil {
			return nil, fmt.Errorf("start pool: %w", err)
		}
		r.slots, r.pool = slots, newPool(cfg.Pool, slots)
		r.pool.Start(ctx)
	}
	return r, nil
}

// OCIRuntime names the OCI runtime the shim runs ("runc", "crun", a path), "" when the handler decides.
func (r *Runtime) OCIRuntime() string { return r.cfg.RuntimeBinary }

// Warnings returns what New found that an operator should fix but that does not stop the worker, such as a
// runc older than MinRuncVersion. The caller logs them.
func (r *Runtime) Warnings() []string { return slices.Clone(r.warnings) }

// Close drains the pool (destroying every container that waits in it), waits for the removal of the
// containers of finished calls, then releases the connection to containerd and unmounts what gVisor keeps
// mounted between calls. Call it once no Run is in progress. It is idempotent.
func (r *Runtime) Close() error {
	if r.client == nil {
		return nil
	}
	var errs []error
	if r.pool != nil {
		r.pool.Close()
	}
	r.WaitCleanups()
	if r.slots != nil {
		errs = append(errs, r.slots.removeDir())
	}
	errs = append(errs, r.closeViews())
	errs = append(errs, r.client.Close())
	r.client = nil
	if b, ok := r.backends[GVisorRuntime]; ok && b.gvisor {
		errs = append(errs, releaseGVisor(r.cfg.StateDir))
	}
	return errors.Join(errs...)
}

// Ready reports whether containerd answers.
func (r *Runtime) Ready(ctx context.Context) error {
	ok, err := r.client.IsServing(namespaces.WithNamespace(ctx, r.cfg.Namespace))
	if err != nil {
		return fmt.Errorf("check containerd: %w", err)
	}
	if !ok {
		return errors.New("check containerd: not serving")
	}
	return nil
}

// EnsureMountPoint makes p (a path under /.toolpool) exist in the shared read-only root, as a file or a
// directory, so that Specs can bind-mount onto it. Call it before the first Run that mounts there.
func (r *Runtime) EnsureMountPoint(p string, dir bool) error {
	return ensureMountPoint(r.rootfs.path, p, dir)
}

func mergeLimits(l, def sandbox.Limits) sandbox.Limits {
	pick := func(v, d int64) int64 {
		if v > 0 {
			return v
		}
		return d
	}
	l.Timeout = time.Duration(pick(int64(l.Timeout), int64(def.Timeout)))
	l.OutputBytes = pick(l.OutputBytes, def.OutputBytes)
	l.MemoryBytes = pick(l.MemoryBytes, def.MemoryBytes)
	l.PIDs = pick(l.PIDs, def.PIDs)
	l.CPUMillis = pick(l.CPUMillis, def.CPUMillis)
	l.TmpBytes = pick(l.TmpBytes, def.TmpBytes)
	if l.NoFile == 0 {
		l.NoFile = def.NoFile
	}
	if l.WorkspaceBytes == 0 {
		l.WorkspaceBytes = def.WorkspaceBytes
	}
	return l
}

// capLimits lowers every limit of l to its ceiling in c (zero: no ceiling).
func capLimits(l, c sandbox.Limits) sandbox.Limits {
	low := func(v, ceiling int64) int64 {
		if ceiling > 0 && (v <= 0 || v > ceiling) {
			return ceiling
		}
		return v
	}
	l.Timeout = time.Duration(low(int64(l.Timeout), int64(c.Timeout)))
	l.OutputBytes = low(l.OutputBytes, c.OutputBytes)
	l.MemoryBytes = low(l.MemoryBytes, c.MemoryBytes)
	l.PIDs = low(l.PIDs, c.PIDs)
	l.CPUMillis = low(l.CPUMillis, c.CPUMillis)
	l.TmpBytes = low(l.TmpBytes, c.TmpBytes)
	l.WorkspaceBytes = low(l.WorkspaceBytes, c.WorkspaceBytes)
	if c.NoFile > 0 && l.NoFile > c.NoFile {
		l.NoFile = c.NoFile
	}
	return l
}

// Run implements sandbox.Runtime. Limits are the Spec's, with Config.Defaults for zero fields, capped by
// Config.Ceiling. With a pool (Config.Pool), a call that the pool can serve runs in a container created
// ahead of it (Outcome.Warm); every other call runs in a container created for it, and Outcome.ColdReason
// says why. Either way the container is fresh, hardened alike, and serves this call only. The pool holds
// containers of RuncRuntime only: a call whose runtime is another (gVisor, a Config.Runtimes handler) runs
// cold (ColdRuntime), and one naming a runtime this Runtime does not offer is refused with
// sandbox.ErrNoRuntime.
func (r *Runtime) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	lim := capLimits(mergeLimits(spec.Limits, r.cfg.Defaults), r.cfg.Ceiling)
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	if spec.Image != "" {
		began := time.Now()
		digest, release, err := r.prepareImage(ctx, &spec)
		step := sandbox.Step{Name: "image", Took: time.Since(began)} // the pull, when the store lacked it
		if err != nil {
			return sandbox.Outcome{WorkspaceBytes: -1, Steps: []sandbox.Step{step}}, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
		}
		defer release()
		out, err := r.run(ctx, spec, lim)
		out.Image, out.Steps = digest, append([]sandbox.Step{step}, out.Steps...)
		return out, err
	}
	return r.run(ctx, spec, lim)
}

// run runs spec, whose image (if any) is in the store, warm when the pool can and cold otherwise.
func (r *Runtime) run(ctx context.Context, spec sandbox.Spec, lim sandbox.Limits) (sandbox.Outcome, error) {
	if r.pool == nil {
		return r.runCold(ctx, spec, lim)
	}
	if be, err := r.backendFor(spec.Runtime); err != nil || !be.runc {
		// runCold refuses an unknown runtime as it does without a pool.
		out, err := r.runCold(ctx, spec, lim)
		if be.handler != "" {
			out.ColdReason = ColdRuntime
		}
		return out, err
	}
	out, reason, err := r.runWarm(ctx, spec, lim)
	if reason == "" {
		return out, err
	}
	out, err = r.runCold(ctx, spec, lim)
	out.ColdReason = reason
	return out, err
}

// runCold runs spec in a container created for it.
func (r *Runtime) runCold(ctx context.Context, spec sandbox.Spec, lim sandbox.Limits) (out sandbox.Outcome, err error) {
	began := time.Now()
	clock := stepClock{steps: &out.Steps, last: began}
	out.WorkspaceBytes = -1
	if err := r.begin(spec.ID, true); err != nil {
		return out, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	// Until the container exists, this Run releases the id; after, the container's removal does.
	owned := true
	defer func() {
		if owned {
			r.end(spec.ID)
		}
	}()
	be, err := r.backendFor(spec.Runtime)
	if err != nil {
		return out, fmt.Errorf("%w: %w", sandbox.ErrNoRuntime, err)
	}
	cwd, err := checkCwd(spec.Cwd)
	if err != nil {
		return out, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}

	mounts := r.rootfs.mounts
	rootPath := r.rootfs.path
	containerOpts := []containerd.NewContainerOpts{
		containerd.WithRuntime(be.handler, be.options),
		containerd.WithContainerLabels(map[string]string{labelWorker: r.cfg.WorkerID}),
	}
	if spec.Image != "" {
		img, err := r.client.GetImage(ctx, spec.Image)
		if err != nil {
			return out, fmt.Errorf("%w: get image %s: %w", sandbox.ErrNotStarted, spec.Image, err)
		}
		mounts, rootPath = nil, ""
		containerOpts = append(containerOpts, containerd.WithNewSnapshot(spec.ID, img,
			snapshots.WithLabels(map[string]string{labelWorker: r.cfg.WorkerID})))
	}
	mountSpec := spec
	if needsMasks(spec) {
		view, release, err := r.makeView(spec)
		if err != nil {
			return out, err // not ErrNotStarted: another worker would fail alike, and must not run it unmasked
		}
		defer r.releaseView(release)
		mountSpec.WorkspaceDir = view
	}
	mounts, err = callMounts(mounts, mountSpec, lim)
	if err != nil {
		return out, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	if len(spec.TrustedCAs) > 0 {
		caMounts, caEnv, err := r.trustMounts(spec.TrustedCAs, spec.Image == "")
		if err != nil {
			return out, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
		}
		mounts = append(mounts, caMounts...)
		spec.Env = append(caEnv, spec.Env...) // the call's own variables may point elsewhere
	}
	argv, cwd, err := processArgs(spec.Argv, cwd, spec.Image == "")
	if err != nil {
		return out, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	specOpts := r.specOpts(be, argv, cwd, spec, lim, rootPath, mounts)
	if be.gvisor {
		specOpts = append(specOpts, withGVisor(lim))
	}
	containerOpts = append(containerOpts, containerd.WithNewSpec(specOpts...))
	container, err := r.client.NewContainer(ctx, spec.ID, containerOpts...)
	if err != nil {
		return out, fmt.Errorf("%w: create container %s: %w", sandbox.ErrNotStarted, spec.ID, err)
	}
	clock.done("create_container")
	out.ContainerID = spec.ID
	var task containerd.Task
	owned = false
	// The container is removed after Run returns: the call's result need not wait for it (it was about a
	// third of a short call's latency). The id stays taken, and RemoveOrphans spares it, until it is gone.
	defer func() { r.removeLater(ctx, spec.ID, container, task, nil) }()

	stdout, stderr := sandbox.NewCapWriter(lim.OutputBytes), sandbox.NewCapWriter(lim.OutputBytes)
	var stdin io.Reader
	stdinDone := make(chan struct{})
	if spec.Stdin != nil {
		stdin = &eofSignal{r: bytes.NewReader(spec.Stdin), done: stdinDone}
	}
	var callIO cio.IO
	creator := func(id string) (cio.IO, error) {
		var err error
		callIO, err = cio.NewCreator(cio.WithStreams(stdin, sandbox.Tee(stdout, spec.Stdout), sandbox.Tee(stderr, spec.Stderr)), cio.WithFIFODir(r.fifoDir(id)))(id)
		return callIO, err
	}
	task, err = container.NewTask(ctx, creator)
	if err != nil {
		return out, fmt.Errorf("%w: create task %s: %w", startError(err), spec.ID, err)
	}
	clock.done("create_task")
	// Wait before Start, on a context that outlives ctx so that a cancelled call still learns its exit.
	waitCtx, cancelWait := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWait()
	exitCh, err := task.Wait(waitCtx)
	if err != nil {
		return out, fmt.Errorf("%w: wait task %s: %w", sandbox.ErrNotStarted, spec.ID, err)
	}
	clock.done("wait")
	// Start on a context the call's cancellation does not end: the process may be running before
	// containerd answers, so a Start cancelled in flight would report "not started" for a program that
	// ran, and drop what it printed. A cancelled call is killed by supervise, which keeps its output.
	startCtx, cancelStart := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	err = task.Start(startCtx)
	cancelStart()
	if err != nil {
		return out, fmt.Errorf("%w: start task %s: %w", startError(err), spec.ID, err)
	}
	clock.done("start")
	p := startedCall{task: task, exitCh: exitCh, callIO: callIO, stdout: stdout, stderr: stderr, at: clock.last}
	out.SandboxTime = p.at.Sub(began)
	if spec.Stdin != nil {
		go closeStdinAfter(waitCtx, task, stdinDone)
	}
	return out, r.supervise(ctx, p, spec, lim, &out)
}

// closeStdinAfter closes the task's standard input once done is closed (everything was written): the shim
// keeps the stdin FIFO open until told otherwise, and the process reads EOF only then.
func closeStdinAfter(ctx context.Context, task containerd.Task, done <-chan struct{}) {
	select {
	case <-done:
		_ = task.CloseIO(ctx, containerd.WithStdinCloser)
	case <-ctx.Done():
	}
}

// startedCall is a call's process after Start: what supervise needs to see it to its end.
type startedCall struct {
	task           containerd.Task
	exitCh         <-chan containerd.ExitStatus
	callIO         cio.IO
	stdout, stderr *sandbox.CapWriter
	at             time.Time // when it started
	// cpuBefore is the CPU time the container had used before the call was handed to it: a pooled
	// container's init, started ahead. The call's usage does not count it.
	cpuBefore time.Duration
}

// supervise waits for a started call's process to end, or ends it (killing every process of the
// container) at the timeout, when the workspace grows past its quota, or when ctx is cancelled. It then
// fills out with how the process ended, its output and usage, and the workspace's size. It blocks.
func (r *Runtime) supervise(ctx context.Context, p startedCall, spec sandbox.Spec, lim sandbox.Limits, out *sandbox.Outcome) (err error) {
	timer := time.NewTimer(lim.Timeout)
	defer timer.Stop()
	measure := lim.WorkspaceBytes > 0 && spec.WorkspaceDir != ""
	var overQuota <-chan struct{}
	stopWatch := func() {}
	if measure {
		overQuota, stopWatch = watchWorkspace(spec.WorkspaceDir, lim.WorkspaceBytes)
	}
	var status containerd.ExitStatus
	select {
	case status = <-p.exitCh:
	case <-timer.C:
		out.TimedOut = true
		status, err = r.kill(ctx, p.task, p.exitCh)
	case <-overQuota:
		out.QuotaExceeded = true
		status, err = r.kill(ctx, p.task, p.exitCh)
	case <-ctx.Done():
		status, err = r.kill(ctx, p.task, p.exitCh)
		err = errors.Join(ctx.Err(), err)
	}
	stopWatch()
	clock := stepClock{steps: &out.Steps, last: p.at}
	clock.done("run")
	out.RunTime = clock.last.Sub(p.at)
	// containerd's Delete cancels the IO copy before waiting for it, which drops whatever the FIFOs still
	// hold. The shim closes its end once every writer in the container is gone, so wait for our copy to
	// reach EOF first: that is what keeps the output of a killed process.
	r.drain(p.callIO)
	clock.done("drain_io")
	out.Stdout, out.Stderr = p.stdout.Captured(), p.stderr.Captured()
	if status.Error() != nil {
		err = errors.Join(err, fmt.Errorf("wait task %s: %w", spec.ID, status.Error()))
	}
	code := status.ExitCode()
	out.ExitCode = int(code)
	out.Signal = signalName(code)
	r.collectUsage(ctx, p.task, spec.Runtime, out)
	out.CPUTime = max(out.CPUTime-p.cpuBefore, 0)
	clock.done("usage")
	if !out.OOMKilled && !out.TimedOut && !out.QuotaExceeded && ctx.Err() == nil && out.Signal == "SIGKILL" &&
		out.MaxRSSBytes >= lim.MemoryBytes-lim.MemoryBytes/16 {
		// The cgroup's OOM counter is missing (an old kernel or shim): a SIGKILL nobody sent, at the
		// limit, is the OOM killer's.
		out.OOMKilled = true
	}
	if measure {
		if n, merr := sandbox.DiskUsage(spec.WorkspaceDir); merr == nil {
			out.WorkspaceBytes = n
			out.QuotaExceeded = out.QuotaExceeded || n > lim.WorkspaceBytes
		} else if errors.Is(merr, sandbox.ErrTreeTooDeep) {
			out.WorkspaceBytes, out.QuotaExceeded = n, true
		}
		clock.done("workspace_size")
	}
	return err
}

// stepClock times consecutive steps (of a Run, into its Outcome's Steps; of a removal): each step took the
// time since the previous one ended (or since last, for the first).
type stepClock struct {
	steps *[]sandbox.Step
	last  time.Time
}

// done records that step name ended now. A nil clock times nothing.
func (c *stepClock) done(name string) {
	if c == nil {
		return
	}
	now := time.Now()
	*c.steps = append(*c.steps, sandbox.Step{Name: name, Took: now.Sub(c.last)})
	c.last = now
}

// watchWorkspace measures dir until stop is called and closes the returned channel once it is over quota
// (or too deep to measure, which fails closed). It measures no more often than quotaInterval and backs off
// for trees that take long to measure. stop does not wait for a measurement in progress.
func watchWorkspace(dir string, quota int64) (over <-chan struct{}, stop func()) {
	ch := make(chan struct{})
	done := make(chan struct{})
	go func() {
		interval := quotaInterval
		t := time.NewTimer(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			began := time.Now()
			n, err := sandbox.DiskUsage(dir)
			if n > quota || errors.Is(err, sandbox.ErrTreeTooDeep) {
				close(ch)
				return
			}
			interval = min(max(quotaInterval, quotaIntervalFactor*time.Since(began)), quotaMaxInterval)
			t.Reset(interval)
		}
	}()
	var once sync.Once
	return ch, func() { once.Do(func() { close(done) }) }
}

// begin marks id (a call's, or a pooled container's) as running, so that RemoveOrphans leaves it alone, and
// creates its FIFO directory when fifos is set.
func (r *Runtime) begin(id string, fifos bool) error {
	if id == "" || id != filepath.Base(id) || id[0] == '.' {
		return fmt.Errorf("call id %q: it must be a plain file name", id)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active[id] {
		return fmt.Errorf("call id %s: a call with this id is running", id)
	}
	if fifos {
		if err := os.Mkdir(r.fifoDir(id), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create fifo dir: %w", err)
		}
	}
	r.active[id] = true
	return nil
}

// end removes call id's FIFO directory and forgets it.
func (r *Runtime) end(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = os.RemoveAll(r.fifoDir(id))
	delete(r.active, id)
}

// running reports whether Run is running call id.
func (r *Runtime) running(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.active[id]
}

// fifoDir is where call id's FIFOs live (in a directory of their own that cio creates inside it).
func (r *Runtime) fifoDir(id string) string { return filepath.Join(r.fifos, id) }

// startError classifies a failure to create or start a task: a program missing from the root filesystem
// is the call's own problem (sandbox.ErrNoProgram, final); anything else may be retried elsewhere
// (sandbox.ErrNotStarted).
func startError(err error) error {
	msg := err.Error()
	if strings.Contains(msg, "exec:") && (strings.Contains(msg, "no such file or directory") || strings.Contains(msg, "executable file not found")) {
		return sandbox.ErrNoProgram
	}
	// gVisor's sentry loads the program itself and says so in its own words.
	if strings.Contains(msg, "failed to load") && strings.Contains(msg, "no such file or directory") {
		return sandbox.ErrNoProgram
	}
	return sandbox.ErrNotStarted
}

// eofSignal closes done when its reader is exhausted.
type eofSignal struct {
	r    io.Reader
	done chan struct{}
	once sync.Once
}

func (e *eofSignal) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil {
		e.once.Do(func() { close(e.done) })
	}
	return n, err
}

// kill ends every process of the task and waits for its exit status.
func (r *Runtime) kill(ctx context.Context, task containerd.Task, exitCh <-chan containerd.ExitStatus) (containerd.ExitStatus, error) {
	killCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := task.Kill(killCtx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		// runc says "not found" when the kill raced the process's exit; runsc says "sandbox is not running".
		select {
		case st := <-exitCh:
			return st, nil
		case <-time.After(killRaceGrace):
		}
		return containerd.ExitStatus{}, fmt.Errorf("kill task %s: %w", task.ID(), err)
	}
	select {
	case st := <-exitCh:
		return st, nil
	case <-killCtx.Done():
		return containerd.ExitStatus{}, fmt.Errorf("wait killed task %s: %w", task.ID(), killCtx.Err())
	}
}

func (r *Runtime) drain(callIO cio.IO) {
	if callIO == nil {
		return
	}
	done := make(chan struct{})
	go func() {
		callIO.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(ioDrainTimeout):
	}
}

// Containers lists the ids of the containers this runtime's worker owns; tests use it to prove that nothing
// is left behind.
func (r *Runtime) Containers(ctx context.Context) ([]string, error) {
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	list, err := r.client.Containers(ctx, fmt.Sprintf("labels.%q==%s", labelWorker, r.cfg.WorkerID))
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	ids := make([]string, 0, len(list))
	for _, c := range list {
		ids = append(ids, c.ID())
	}
	return ids, nil
}
