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
	"sync"
	"syscall"
	"time"

	cgroup1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	cgroup2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/typeurl/v2"

	"github.com/toolpool/toolpool/internal/sandbox"
)

// Config configures a Runtime.
type Config struct {
	// Address is the containerd socket.
	Address string
	// Namespace is the containerd namespace of toolpool's containers.
	Namespace string
	// RuntimeName is the containerd runtime handler: io.containerd.runc.v2 (default), or another shim such
	// as io.containerd.runsc.v1 (gVisor) or io.containerd.kata.v2.
	RuntimeName string
	// StateDir holds the prepared root filesystem and the per-call FIFOs; the worker owns it.
	StateDir string
	// UID and GID run every sandbox process.
	UID, GID uint32
	// Defaults fill the zero fields of a Spec's Limits.
	Defaults sandbox.Limits
	// WorkerID labels the containers this runtime creates, so that cleanup after a crash finds only its own.
	WorkerID string
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
	}
	return nil
}

const (
	labelWorker = "toolpool.worker"
	// ioDrainTimeout bounds how long Run waits, after the process exited, for the last output to arrive.
	ioDrainTimeout = 5 * time.Second
	// cleanupTimeout bounds each teardown, which runs on a fresh context so that a cancelled call still
	// leaves nothing behind.
	cleanupTimeout = 30 * time.Second
)

// Runtime runs sandbox.Specs in containerd containers. It implements sandbox.Runtime.
type Runtime struct {
	cfg    Config
	client *containerd.Client
	rootfs *hostRootFS
	fifos  string
}

// New connects to containerd and prepares the host-view root. The caller owns the Runtime and must Close
// it; Close does not stop containerd.
func New(ctx context.Context, cfg Config) (_ *Runtime, retErr error) {
	if cfg.RuntimeName == "" {
		cfg.RuntimeName = "io.containerd.runc.v2"
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
	rootfs, err := prepareHostRootFS(filepath.Join(cfg.StateDir, "rootfs"), cfg.UID, cfg.GID)
	if err != nil {
		return nil, fmt.Errorf("prepare host root: %w", err)
	}
	fifos := filepath.Join(cfg.StateDir, "fifo")
	if err := os.MkdirAll(fifos, 0o700); err != nil {
		return nil, fmt.Errorf("create fifo dir: %w", err)
	}
	return &Runtime{cfg: cfg, client: client, rootfs: rootfs, fifos: fifos}, nil
}

// Close releases the connection to containerd. It is idempotent.
func (r *Runtime) Close() error {
	if r.client == nil {
		return nil
	}
	err := r.client.Close()
	r.client = nil
	return err
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
	return l
}

// Run implements sandbox.Runtime.
func (r *Runtime) Run(ctx context.Context, spec sandbox.Spec) (out sandbox.Outcome, retErr error) {
	lim := mergeLimits(spec.Limits, r.cfg.Defaults)
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	began := time.Now()

	mounts := r.rootfs.mounts
	rootPath := r.rootfs.path
	containerOpts := []containerd.NewContainerOpts{
		containerd.WithRuntime(r.cfg.RuntimeName, nil),
		containerd.WithContainerLabels(map[string]string{labelWorker: r.cfg.WorkerID}),
	}
	if spec.Image != "" {
		img, err := r.client.GetImage(ctx, spec.Image)
		if err != nil {
			return out, fmt.Errorf("%w: get image %s: %w", sandbox.ErrNotStarted, spec.Image, err)
		}
		mounts, rootPath = nil, ""
		containerOpts = append(containerOpts, containerd.WithNewSnapshot(spec.ID, img))
	}
	mounts, err := callMounts(mounts, spec, lim)
	if err != nil {
		return out, fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	containerOpts = append(containerOpts, containerd.WithNewSpec(r.hardenedSpec(spec, lim, rootPath, mounts)...))
	container, err := r.client.NewContainer(ctx, spec.ID, containerOpts...)
	if err != nil {
		return out, fmt.Errorf("%w: create container %s: %w", sandbox.ErrNotStarted, spec.ID, err)
	}
	var task containerd.Task
	defer func() {
		cleanupStart := time.Now()
		if err := r.remove(ctx, container, task); err != nil {
			retErr = errors.Join(retErr, err)
		}
		out.CleanupTime = time.Since(cleanupStart)
	}()

	stdout, stderr := sandbox.NewCapWriter(lim.OutputBytes), sandbox.NewCapWriter(lim.OutputBytes)
	var stdin io.Reader
	stdinDone := make(chan struct{})
	if spec.Stdin != nil {
		stdin = &eofSignal{r: bytes.NewReader(spec.Stdin), done: stdinDone}
	}
	var callIO cio.IO
	creator := func(id string) (cio.IO, error) {
		var err error
		callIO, err = cio.NewCreator(cio.WithStreams(stdin, stdout, stderr), cio.WithFIFODir(r.fifos))(id)
		return callIO, err
	}
	task, err = container.NewTask(ctx, creator)
	if err != nil {
		return out, fmt.Errorf("%w: create task %s: %w", sandbox.ErrNotStarted, spec.ID, err)
	}
	// Wait before Start, on a context that outlives ctx so that a cancelled call still learns its exit.
	waitCtx, cancelWait := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWait()
	exitCh, err := task.Wait(waitCtx)
	if err != nil {
		return out, fmt.Errorf("%w: wait task %s: %w", sandbox.ErrNotStarted, spec.ID, err)
	}
	if err := task.Start(ctx); err != nil {
		return out, fmt.Errorf("%w: start task %s: %w", sandbox.ErrNotStarted, spec.ID, err)
	}
	started := time.Now()
	out.SandboxTime = started.Sub(began)
	if spec.Stdin != nil {
		// The shim keeps the stdin FIFO open until told otherwise: close it once everything is written, so
		// the process reads EOF.
		go func() {
			select {
			case <-stdinDone:
				_ = task.CloseIO(waitCtx, containerd.WithStdinCloser)
			case <-waitCtx.Done():
			}
		}()
	}

	timer := time.NewTimer(lim.Timeout)
	defer timer.Stop()
	var status containerd.ExitStatus
	select {
	case status = <-exitCh:
	case <-timer.C:
		out.TimedOut = true
		status, err = r.kill(ctx, task, exitCh)
	case <-ctx.Done():
		status, err = r.kill(ctx, task, exitCh)
		err = errors.Join(ctx.Err(), err)
	}
	out.RunTime = time.Since(started)
	// containerd's Delete cancels the IO copy before waiting for it, which drops whatever the FIFOs still
	// hold. The shim closes its end once every writer in the container is gone, so wait for our copy to
	// reach EOF first: that is what keeps the output of a killed process.
	r.drain(callIO)
	out.Stdout, out.Stderr = stdout.Captured(), stderr.Captured()
	if status.Error() != nil {
		err = errors.Join(err, fmt.Errorf("wait task %s: %w", spec.ID, status.Error()))
	}
	code := status.ExitCode()
	out.ExitCode = int(code)
	out.Signal = signalName(code)
	r.collectUsage(ctx, task, &out)
	return out, err
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

// collectUsage reads the container's cgroup: peak memory, CPU time, and whether the OOM killer struck.
func (r *Runtime) collectUsage(ctx context.Context, task containerd.Task, out *sandbox.Outcome) {
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	m, err := task.Metrics(mctx)
	if err != nil || m == nil || m.Data == nil {
		return
	}
	v, err := typeurl.UnmarshalAny(m.Data)
	if err != nil {
		return
	}
	switch s := v.(type) {
	case *cgroup1stats.Metrics:
		if s.Memory != nil && s.Memory.Usage != nil {
			out.MaxRSSBytes = int64(s.Memory.Usage.Max)
		}
		if s.CPU != nil && s.CPU.Usage != nil {
			out.CPUTime = time.Duration(s.CPU.Usage.Total)
		}
		if s.MemoryOomControl != nil && s.MemoryOomControl.OomKill > 0 {
			out.OOMKilled = true
		}
	case *cgroup2stats.Metrics:
		if s.Memory != nil {
			out.MaxRSSBytes = int64(s.Memory.Usage)
		}
		if s.CPU != nil {
			out.CPUTime = time.Duration(s.CPU.UsageUsec) * time.Microsecond
		}
		if s.MemoryEvents != nil && s.MemoryEvents.OomKill > 0 {
			out.OOMKilled = true
		}
	}
}

// remove deletes the task (killing it if it still runs) and the container with its snapshot, on a fresh
// bounded context.
func (r *Runtime) remove(ctx context.Context, container containerd.Container, task containerd.Task) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var errs []error
	if task != nil {
		if _, err := task.Delete(cctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete task %s: %w", task.ID(), err))
		}
	}
	if err := container.Delete(cctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete container %s: %w", container.ID(), err))
	}
	return errors.Join(errs...)
}

// RemoveOrphans deletes every container, with its task and snapshot, that a previous worker with the same
// WorkerID left behind, and returns how many it removed. Call it before the first Run.
func (r *Runtime) RemoveOrphans(ctx context.Context) (int, error) {
	ctx = namespaces.WithNamespace(ctx, r.cfg.Namespace)
	list, err := r.client.Containers(ctx, fmt.Sprintf("labels.%q==%s", labelWorker, r.cfg.WorkerID))
	if err != nil {
		return 0, fmt.Errorf("list orphan containers: %w", err)
	}
	var errs []error
	for _, c := range list {
		task, err := c.Task(ctx, nil)
		if err != nil {
			task = nil
		}
		if err := r.remove(ctx, c, task); err != nil {
			errs = append(errs, err)
		}
	}
	return len(list), errors.Join(errs...)
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
