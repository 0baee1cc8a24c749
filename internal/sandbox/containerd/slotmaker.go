package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/snapshots"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/sandboxinit"
)

// slotMaker creates and destroys the pool's containers. The pool consumes it; containerSlots implements it
// with the Runtime's containerd client.
type slotMaker interface {
	// create makes a ready container of profile key (its init started, waiting for a call) and blocks
	// until it is. The caller owns the result. On failure, what it made is being destroyed already.
	create(ctx context.Context, key profileKey) (*slot, error)
	// destroy removes a container that served no call, in the background; it does not block.
	destroy(s *slot)
	// measure returns the memory the ready containers hold in all, as the host counts it. It blocks while
	// it reads.
	measure(ready []*slot) int64
}

const (
	// slotsPrefix names the slots directories in StateDir: slots.<start time in ns>.
	slotsPrefix = "slots."
	// labelPool marks pooled containers.
	labelPool = "toolpool.pool"
)

// slot is one pooled container. Until a call claims it, the pool owns it; after, the claiming Run does,
// and destroys it when the call is over.
type slot struct {
	id        string
	key       profileKey
	lim       sandbox.Limits // what it was created with
	hostDir   string         // the propagation slot: bound at /workspace, the workspace is mounted on it
	container containerd.Container
	task      containerd.Task
	exitCh    <-chan containerd.ExitStatus // the init's exit (Wait before Start, at creation)
	stopWait  context.CancelFunc           // ends the wait for exitCh once the container is removed
	callIO    cio.IO
	stdin     *lateStdin
	stdout    *lateWriter
	stderr    *lateWriter
	created   time.Time
}

// endWait ends the wait for the init's exit, once the container is gone (or was never made).
func (s *slot) endWait() {
	if s.stopWait != nil {
		s.stopWait()
	}
}

// updateLimits sets the call's memory, pids and CPU limits on the container's cgroup when they
// differ from what it was created with.
func (s *slot) updateLimits(ctx context.Context, lim sandbox.Limits) error {
	if lim.MemoryBytes == s.lim.MemoryBytes && lim.PIDs == s.lim.PIDs && lim.CPUMillis == s.lim.CPUMillis {
		return nil
	}
	mem, swap, quota, period := lim.MemoryBytes, lim.MemoryBytes, lim.CPUMillis*100, uint64(100000)
	res := &specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &mem, Swap: &swap},
		Pids:   &specs.LinuxPids{Limit: lim.PIDs},
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
	}
	if err := s.task.Update(ctx, containerd.WithResources(res)); err != nil {
		return fmt.Errorf("update limits of %s: %w", s.id, err)
	}
	return nil
}

// containerSlots makes the pool's containers through the Runtime: its containerd client, host-view root and
// hardened spec. It owns the slots directory (dir), which newContainerSlots prepares and removeDir removes
// once every container is gone. Its methods are safe for concurrent use.
type containerSlots struct {
	r        *Runtime
	dir      string          // StateDir/slots.<start>: a shared mount whose subdirectories are the slots
	ahead    []sandbox.Mount // the mounts of every pooled container (PoolConfig.aheadMounts)
	initPath string          // PoolConfig.InitPath
}

// newContainerSlots prepares the slots directory of a Runtime started at started, and the mount points of
// cfg's ahead mounts in its root.
func newContainerSlots(r *Runtime, cfg PoolConfig, started time.Time) (*containerSlots, error) {
	dir := filepath.Join(r.cfg.StateDir, fmt.Sprintf("%s%d", slotsPrefix, started.UnixNano()))
	if err := setupSlotsDir(dir); err != nil {
		return nil, err
	}
	for _, m := range cfg.aheadMounts() {
		if err := ensureMountPoint(r.rootfs.path, m.Destination, false); err != nil {
			return nil, err
		}
	}
	return &containerSlots{r: r, dir: dir, ahead: cfg.aheadMounts(), initPath: cfg.InitPath}, nil
}

// profileOf returns the profile that serves spec with limits lim, or why none does.
func (c *containerSlots) profileOf(spec sandbox.Spec, lim sandbox.Limits) (profileKey, string) {
	if be, err := c.r.backendFor(spec.Runtime); err != nil || !be.runc {
		return profileKey{}, ColdRuntime
	}
	if len(spec.TrustedCAs) > 0 {
		return profileKey{}, ColdMounts
	}
	for _, m := range spec.Mounts {
		if !slices.Contains(c.ahead, m) {
			return profileKey{}, ColdMounts
		}
	}
	if lim.NoFile > c.limits(profileKey{}).NoFile {
		return profileKey{}, ColdLimits
	}
	image := spec.Image
	if name, err := ParseImageRef(image); err == nil && image != "" {
		image = name // as Run names it once the image is pulled (prepareImage), however the caller wrote it
	}
	return profileKey{image: image, tmp: lim.TmpBytes}, ""
}

// limits are the limits a pooled container of profile key is created with: the runtime's defaults
// (within its ceiling), the ceiling's open files when it has one (a call may then ask for any number up to
// it), and no file size limit (the init sets the call's).
func (c *containerSlots) limits(key profileKey) sandbox.Limits {
	lim := capLimits(c.r.cfg.Defaults, c.r.cfg.Ceiling)
	if c.r.cfg.Ceiling.NoFile > 0 {
		lim.NoFile = c.r.cfg.Ceiling.NoFile
	}
	lim.TmpBytes = key.tmp
	lim.WorkspaceBytes = -1
	return lim
}

// create creates a pooled container for profile key: a container with the same hardened spec as a
// cold call's, whose process is the init, whose /workspace is a read-only bind of a fresh slot directory
// that receives mounts from the host (rslave), and whose task is started: the init runs, as the sandbox
// user with nothing of any call, blocked on its standard input until a call sends its request. Starting
// it here takes the OCI runtime's start and the init's own start-up off the call's path. The caller owns
// the result.
func (c *containerSlots) create(ctx context.Context, key profileKey) (_ *slot, retErr error) {
	id := "pool-" + randomHex(8)
	if err := c.r.begin(id, true); err != nil {
		return nil, err
	}
	lim := c.limits(key)
	s := &slot{id: id, key: key, lim: lim, hostDir: filepath.Join(c.dir, id),
		stdin: &lateStdin{src: make(chan io.Reader, 1)}, stdout: &lateWriter{}, stderr: &lateWriter{}}
	defer func() {
		if retErr != nil {
			c.destroy(s)
		}
	}()
	if err := os.Mkdir(s.hostDir, 0o755); err != nil {
		return nil, fmt.Errorf("create slot dir: %w", err)
	}
	mounts, rootPath := c.r.rootfs.mounts, c.r.rootfs.path
	opts := []containerd.NewContainerOpts{
		containerd.WithRuntime(c.r.backends[RuncRuntime].handler, c.r.backends[RuncRuntime].options),
		containerd.WithContainerLabels(map[string]string{labelWorker: c.r.cfg.WorkerID, labelPool: "1"}),
	}
	if key.image != "" {
		img, err := c.r.client.GetImage(ctx, key.image)
		if err != nil {
			return nil, fmt.Errorf("get image %s: %w", key.image, err)
		}
		mounts, rootPath = nil, ""
		opts = append(opts, containerd.WithNewSnapshot(id, img, snapshots.WithLabels(map[string]string{labelWorker: c.r.cfg.WorkerID})))
	}
	specOpts, err := c.spec(id, lim, rootPath, mounts, s.hostDir)
	if err != nil {
		return nil, err
	}
	opts = append(opts, containerd.WithNewSpec(specOpts...))
	s.container, err = c.r.client.NewContainer(ctx, id, opts...)
	if err != nil {
		return nil, fmt.Errorf("create container %s: %w", id, err)
	}
	creator := func(id string) (cio.IO, error) {
		var err error
		s.callIO, err = cio.NewCreator(cio.WithStreams(s.stdin, s.stdout, s.stderr), cio.WithFIFODir(c.r.fifoDir(id)))(id)
		return s.callIO, err
	}
	s.task, err = s.container.NewTask(ctx, creator)
	if err != nil {
		return nil, fmt.Errorf("create task %s: %w", id, err)
	}
	// Wait before Start, on a context that lives as long as the container: removal ends it.
	waitCtx, stopWait := context.WithCancel(context.WithoutCancel(ctx))
	s.exitCh, err = s.task.Wait(waitCtx)
	if err != nil {
		stopWait()
		return nil, fmt.Errorf("wait task %s: %w", id, err)
	}
	s.stopWait = stopWait
	if err := s.task.Start(ctx); err != nil {
		return nil, fmt.Errorf("start init of %s: %w", id, err)
	}
	s.created = time.Now()
	return s, nil
}

// spec returns the spec options of pooled container id: those of a cold call (hardenedSpec, through
// callMounts), whose process is the init in "/", whose extra mounts are the init binary and Mounts and whose
// workspace is the slot directory hostDir, read-only and a slave of the host's mount, so that the
// workspace the host mounts there at claim time appears in the container and nothing mounted in the
// container could go back.
func (c *containerSlots) spec(id string, lim sandbox.Limits, rootPath string, base []specs.Mount, hostDir string) ([]oci.SpecOpts, error) {
	mounts, err := callMounts(base, sandbox.Spec{WorkspaceDir: hostDir, Mounts: c.ahead}, lim)
	if err != nil {
		return nil, err
	}
	for i := range mounts {
		if mounts[i].Destination == workspaceDir {
			mounts[i].Options = []string{"bind", "ro", "nosuid", "nodev", "rslave"}
		}
	}
	return c.r.specOpts(c.r.backends[RuncRuntime], []string{c.initPath, sandboxinit.Command}, "/", sandbox.Spec{ID: id}, lim, rootPath, mounts), nil
}

// destroy destroys a container that served no call, in the background (see removeLater).
func (c *containerSlots) destroy(s *slot) {
	s.stdin.close()
	if s.container == nil {
		err := removeSlotDir(s.hostDir)
		c.r.end(s.id)
		if c.r.cfg.OnCleanup != nil && err != nil {
			c.r.cfg.OnCleanup(0, nil, err)
		}
		return
	}
	c.r.removeLater(context.Background(), s.id, s.container, s.task, func() error {
		s.endWait()
		return removeSlotDir(s.hostDir)
	})
}

// retire ends a claimed container's life: the workspace is unmounted from its slot at once (so that
// nothing of the host leads to it through the slot any more), and the container is removed in the
// background.
func (c *containerSlots) retire(s *slot, bound bool) {
	var unbindErr error
	if bound {
		unbindErr = unmountDetach(s.hostDir)
	}
	s.stdin.close()
	c.r.removeLater(context.Background(), s.id, s.container, s.task, func() error {
		s.endWait()
		return errors.Join(unbindErr, removeSlotDir(s.hostDir))
	})
}

// measure returns what the ready containers hold: each one's cgroup memory, and its share of the shim
// that serves it (the shim's proportional set size over the tasks it serves).
func (c *containerSlots) measure(ready []*slot) int64 {
	var total int64
	shims := map[int]int{} // shim pid: ready containers it serves
	for _, s := range ready {
		total += cgroupMemory(c.r.cfg.Namespace, s.id)
		if shim := parentPID(int(s.task.Pid())); shim > 1 {
			shims[shim]++
		}
	}
	for shim, n := range shims {
		if all := len(childPIDs(shim)); all > 0 {
			total += procPSS(shim) * int64(n) / int64(all)
		}
	}
	return total
}

// removeDir unmounts the slots directory (and whatever is still mounted below it) and removes it. The
// Runtime's Close calls it once every container is gone.
func (c *containerSlots) removeDir() error { return removeSlotsTree(c.dir) }
