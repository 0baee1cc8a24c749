package containerd

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/snapshots"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/sandboxinit"
)

// PoolConfig configures the warm pool: containers created ahead of their calls (container, shim and the
// OCI runtime's create done, and the first process, the init, started and waiting on its standard input
// for its call), each used by exactly one call and then destroyed. A call claims one and binds what could not be bound ahead: its workspace (mounted into the
// container's /workspace slot by propagation), its argv, environment, working directory and stdin (read by
// the init, sandboxinit.Main, which then executes the program), and its memory, pids and CPU limits (a
// cgroup update). docs/security.md says what the pool changes and what it does not.
type PoolConfig struct {
	// MaxSize is the most containers the pool keeps ready at once, over every profile; 0 turns the pool
	// off and every call runs in a container created for it.
	MaxSize int
	// MemoryBytes is the memory the ready containers may hold in all (their processes and cgroups, and
	// their share of the shims, as measured); the pool keeps fewer than MaxSize when this says so. 0 sets
	// no budget beyond MaxSize.
	MemoryBytes int64
	// MaxAge is the longest a container waits in the pool: an older one is destroyed, never claimed.
	// Default DefaultPoolMaxAge (10 minutes).
	MaxAge time.Duration
	// Fillers is how many containers the pool creates at once; default DefaultPoolFillers (2).
	Fillers int
	// MaxProfiles bounds the profiles (root filesystem or image, /tmp size) kept warm at once; default
	// DefaultPoolMaxProfiles (4). A call of another profile runs cold ("profiles").
	MaxProfiles int
	// InitBinary is the host path of a static binary that runs sandboxinit.Main for its
	// sandboxinit.Command sub-command (toolpool-init), mounted read-only at InitPath (under /.toolpool)
	// in every pooled container.
	InitBinary string
	InitPath   string
	// Mounts are more read-only files every pooled container carries (the tool runner), each at a clean
	// path under /.toolpool. A Spec whose extra mounts are all among these (or the init's) is served by
	// the pool; a Spec with any other extra mount, a writable one, or TrustedCAs runs cold ("mounts").
	Mounts []sandbox.Mount
}

// aheadMounts are the mounts of every pooled container: the init's, then Mounts.
func (c *PoolConfig) aheadMounts() []sandbox.Mount {
	return append([]sandbox.Mount{{Source: c.InitBinary, Destination: c.InitPath}}, c.Mounts...)
}

func (c *PoolConfig) validate() error {
	switch {
	case c.MaxSize <= 0:
		return nil
	case c.MemoryBytes < 0 || c.MaxAge < 0 || c.Fillers < 0 || c.MaxProfiles < 0:
		return errors.New("pool: sizes and durations must not be negative")
	}
	seen := map[string]bool{}
	for i, m := range c.aheadMounts() {
		what := "init"
		if i > 0 {
			what = fmt.Sprintf("mount %d", i)
		}
		switch {
		case !filepath.IsAbs(m.Source):
			return fmt.Errorf("pool: %s: binary %q must be an absolute path", what, m.Source)
		case !strings.HasPrefix(m.Destination, toolpoolDir+"/") || path.Clean(m.Destination) != m.Destination:
			return fmt.Errorf("pool: %s: path %q must be a clean path under %s", what, m.Destination, toolpoolDir)
		case m.Writable:
			return fmt.Errorf("pool: %s: %s must be read-only", what, m.Destination)
		case seen[m.Destination]:
			return fmt.Errorf("pool: %s: a second mount at %s", what, m.Destination)
		}
		seen[m.Destination] = true
		if fi, err := os.Stat(m.Source); err != nil {
			return fmt.Errorf("pool: %s: %w", what, err)
		} else if !fi.Mode().IsRegular() {
			return fmt.Errorf("pool: %s: %s is not a regular file", what, m.Source)
		}
	}
	return nil
}

// PoolStats is a snapshot of the pool for metrics.
type PoolStats struct {
	// Ready containers wait for a call; Creating are being made; Target is how many the pool aims to
	// keep ready now (after MaxSize and the memory budget).
	Ready, Creating, Target int
	// MemoryBytes is what the ready containers hold, as last measured; SlotBytes the estimate for one.
	MemoryBytes, SlotBytes int64
	// OldestAge is the age of the oldest ready container.
	OldestAge time.Duration
	// Profiles is how many profiles the pool keeps warm.
	Profiles int
	// Created counts the containers made for the pool; CreateFailures the attempts that failed;
	// Discarded the containers destroyed without serving a call, by reason: max_age, shrink, drain.
	Created, CreateFailures uint64
	Discarded               map[string]uint64
	// Disabled, when not empty, says why the pool stopped serving calls (a host that does not propagate
	// the workspace into a container).
	Disabled string
}

// Reasons a call runs cold although the runtime has a pool (sandbox.Outcome.ColdReason).
const (
	ColdEmpty    = "empty"    // no container of the call's profile was ready
	ColdMounts   = "mounts"   // extra mounts or trusted CAs: the container's mounts are the call's own
	ColdLimits   = "limits"   // limits a pooled container cannot be lowered to (more open files)
	ColdProfiles = "profiles" // a profile beyond MaxProfiles
	ColdBroken   = "broken"   // the claimed container failed before the call's program started
	ColdDisabled = "disabled" // the pool has stopped serving (PoolStats.Disabled)
	ColdDraining = "draining" // the pool was drained (DrainPool) or the runtime is closing
	ColdRuntime  = "runtime"  // the call's runtime is not RuncRuntime (gVisor, a Config.Runtimes handler)
)

const (
	// demandWindow is how many seconds of claims the pool remembers to size itself.
	demandWindow = 30
	// idleAfter is how long a profile without a claim keeps containers; after it, none and it is forgotten.
	idleAfter = 5 * time.Minute
	// poolTick is how often the pool resizes, retires old containers and measures its memory.
	poolTick = time.Second
	// refillDelay is how long after a claim the pool starts the container that replaces it.
	refillDelay = 100 * time.Millisecond
	// defaultSlotBytes is the memory assumed for one ready container until one has been measured.
	defaultSlotBytes = 16 << 20
	// labelPool marks pooled containers.
	labelPool = "toolpool.pool"
)

// profileKey is what a pooled container is made for: the calls it can serve. Memory, pids, CPU, open files
// and the file size limit are bound at claim time and are not part of it.
type profileKey struct {
	image string
	tmp   int64
}

type profile struct {
	key      profileKey
	ready    []*slot // oldest first
	creating int
	claims   [demandWindow]int // claims per second, claims[sec%demandWindow]
	claimSec int64             // the second the newest entry of claims counts
	lastUsed time.Time
	failures int
	retryAt  time.Time
}

// note counts one call of this profile at now.
func (p *profile) note(now time.Time) {
	p.advance(now)
	p.claims[p.claimSec%demandWindow]++
	p.lastUsed = now
}

func (p *profile) advance(now time.Time) {
	sec := now.Unix()
	if sec-p.claimSec >= demandWindow {
		p.claims = [demandWindow]int{}
		p.claimSec = sec
	}
	for p.claimSec < sec {
		p.claimSec++
		p.claims[p.claimSec%demandWindow] = 0
	}
}

// target is how many ready containers the profile wants: as many as its busiest second of the last
// demandWindow seconds claimed, at least one while it has been used within idleAfter, none after.
func (p *profile) target(now time.Time) int {
	if now.Sub(p.lastUsed) > idleAfter {
		return 0
	}
	p.advance(now)
	return max(1, slices.Max(p.claims[:]))
}

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

// pool holds the ready containers of a Runtime. Its methods are safe for concurrent use.
type pool struct {
	cfg  PoolConfig
	dir  string // StateDir/slots.<start>: a shared mount whose subdirectories are the slots
	stop context.CancelFunc
	wake chan struct{}
	// after runs f after d (time.AfterFunc; tests record it).
	after func(d time.Duration, f func()) *time.Timer
	done  sync.WaitGroup // the manager and every creation in progress

	closeOnce sync.Once // closePool's work, which every caller waits for

	mu        sync.Mutex
	closed    bool
	profiles  map[profileKey]*profile
	creating  int
	target    int
	slotBytes int64
	memBytes  int64
	created   uint64
	failures  uint64
	discarded map[string]uint64
	disabled  string
}

// startPool prepares the slots directory and starts filling. The pool stops in closePool.
func (r *Runtime) startPool(ctx context.Context, started time.Time) error {
	cfg := r.cfg.Pool.withDefaults()
	dir := filepath.Join(r.cfg.StateDir, fmt.Sprintf("%s%d", slotsPrefix, started.UnixNano()))
	if err := setupSlotsDir(dir); err != nil {
		return err
	}
	for _, m := range cfg.aheadMounts() {
		if err := ensureMountPoint(r.rootfs.path, m.Destination, false); err != nil {
			return err
		}
	}
	mctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	p := &pool{cfg: cfg, dir: dir, stop: stop, wake: make(chan struct{}, 1), after: time.AfterFunc, profiles: map[profileKey]*profile{},
		slotBytes: defaultSlotBytes, discarded: map[string]uint64{}}
	r.pool = p
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		r.managePool(mctx)
	}()
	return nil
}

// slotsPrefix names the slots directories in StateDir: slots.<start time in ns>.
const slotsPrefix = "slots."

// DrainPool stops the warm pool for good: it creates no more containers and destroys every ready one (in
// the background; Close waits for their removal). Calls that hold a claimed container keep it until they
// end; later calls run cold (ColdDraining). A worker calls it when it starts draining, so that a worker on
// its way out holds no idle containers. It blocks until the creations in flight have ended and every
// ready container's removal has begun, also when another DrainPool or Close is draining the pool at the
// same time. Without a pool it does nothing; calling it again does nothing.
func (r *Runtime) DrainPool() {
	if r.pool != nil {
		r.closePool()
	}
}

// closePool stops the pool and starts the removal of every ready container; Close then waits for it.
// Calls that hold a claimed container keep it until they end. Idempotent, and a caller that finds the pool
// being closed by another waits until that one is done: otherwise Close, racing the worker's DrainPool,
// could close the client while the creations in flight were still to be removed, and their containers and
// shims would outlive the worker.
func (r *Runtime) closePool() {
	p := r.pool
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		p.stop()
		p.done.Wait() // the manager and the creations in flight; what they made is in profiles now
		p.mu.Lock()
		var all []*slot
		for _, pr := range p.profiles {
			all = append(all, pr.ready...)
			pr.ready = nil
		}
		p.discarded["drain"] += uint64(len(all))
		p.mu.Unlock()
		for _, s := range all {
			r.discardSlot(s)
		}
	})
}

// removeSlotsDir unmounts the slots directory (and whatever is still mounted below it) and removes it.
// Close calls it once every container is gone.
func (p *pool) removeSlotsDir() error { return removeSlotsTree(p.dir) }

// profileOf returns the profile that serves spec with limits lim, or why none does.
func (r *Runtime) profileOf(spec sandbox.Spec, lim sandbox.Limits) (profileKey, string) {
	if be, err := r.backendFor(spec.Runtime); err != nil || !be.runc {
		return profileKey{}, ColdRuntime
	}
	if len(spec.TrustedCAs) > 0 {
		return profileKey{}, ColdMounts
	}
	ahead := r.pool.cfg.aheadMounts()
	for _, m := range spec.Mounts {
		if !slices.Contains(ahead, m) {
			return profileKey{}, ColdMounts
		}
	}
	if lim.NoFile > r.slotLimits(profileKey{}).NoFile {
		return profileKey{}, ColdLimits
	}
	return profileKey{image: spec.Image, tmp: lim.TmpBytes}, ""
}

// slotLimits are the limits a pooled container of profile key is created with: the runtime's defaults
// (within its ceiling), the ceiling's open files when it has one (a call may then ask for any number up to
// it), and no file size limit (the init sets the call's).
func (r *Runtime) slotLimits(key profileKey) sandbox.Limits {
	lim := capLimits(r.cfg.Defaults, r.cfg.Ceiling)
	if r.cfg.Ceiling.NoFile > 0 {
		lim.NoFile = r.cfg.Ceiling.NoFile
	}
	lim.TmpBytes = key.tmp
	lim.WorkspaceBytes = -1
	return lim
}

// take hands out the oldest ready container of key, or nil. It counts the claim for sizing either way.
func (p *pool) take(key profileKey, now time.Time) (s *slot, reason string, expired []*slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// The replacement is made a moment later, off the claimed call's path: its creation would take the
	// CPU the call, its result's write and its answer need now.
	defer p.after(refillDelay, p.poke)
	if p.disabled != "" {
		return nil, ColdDisabled, nil
	}
	if p.closed {
		return nil, ColdDraining, nil
	}
	pr := p.profiles[key]
	if pr == nil {
		if len(p.profiles) >= p.cfg.MaxProfiles {
			return nil, ColdProfiles, nil
		}
		pr = &profile{key: key}
		p.profiles[key] = pr
	}
	pr.note(now)
	for len(pr.ready) > 0 {
		s, pr.ready = pr.ready[0], pr.ready[1:]
		if now.Sub(s.created) < p.cfg.MaxAge {
			return s, "", expired
		}
		p.discarded["max_age"]++
		expired = append(expired, s)
	}
	return nil, ColdEmpty, expired
}

// giveBack returns an unused container to the front of its profile's queue.
func (p *pool) giveBack(s *slot) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr := p.profiles[s.key]
	if p.closed || pr == nil {
		return false
	}
	pr.ready = append([]*slot{s}, pr.ready...)
	return true
}

// poke wakes the manager.
func (p *pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// managePool keeps the pool at its target until ctx ends: every tick, or when a claim wakes it, it
// retires containers past MaxAge and beyond the target and starts creations for what is missing. It
// measures the pool's memory every few ticks. It blocks.
func (r *Runtime) managePool(ctx context.Context) {
	p := r.pool
	t := time.NewTicker(poolTick)
	defer t.Stop()
	measured := time.Time{}
	for {
		now := time.Now()
		if now.Sub(measured) >= 5*poolTick {
			r.measurePool()
			measured = now
		}
		for _, s := range p.plan(now) {
			r.discardSlot(s)
		}
		for _, key := range p.toCreate(now) {
			p.done.Add(1)
			go func() {
				defer p.done.Done()
				r.fillSlot(ctx, key)
			}()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.wake:
		}
	}
}

// plan recomputes the targets and returns the ready containers to discard: those past MaxAge, and the
// oldest beyond their profile's target. It forgets idle profiles.
func (p *pool) plan(now time.Time) (discard []*slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	budget := p.cfg.MaxSize
	if p.cfg.MemoryBytes > 0 {
		fits := int(p.cfg.MemoryBytes / max(p.slotBytes, 1))
		if p.memBytes == 0 {
			fits = max(fits, 1) // nothing measured yet: one container, to learn what one holds
		}
		budget = min(budget, fits)
	}
	if p.disabled != "" {
		budget = 0
	}
	// The most recently used profiles first: under a tight budget they keep their containers.
	list := make([]*profile, 0, len(p.profiles))
	for _, pr := range p.profiles {
		list = append(list, pr)
	}
	slices.SortFunc(list, func(a, b *profile) int { return b.lastUsed.Compare(a.lastUsed) })
	total := 0
	for _, pr := range list {
		keep := pr.ready[:0]
		for _, s := range pr.ready {
			if now.Sub(s.created) >= p.cfg.MaxAge {
				p.discarded["max_age"]++
				discard = append(discard, s)
				continue
			}
			keep = append(keep, s)
		}
		pr.ready = keep
		want := min(pr.target(now), budget-total)
		total += want
		for len(pr.ready) > want {
			p.discarded["shrink"]++
			discard = append(discard, pr.ready[0])
			pr.ready = pr.ready[1:]
		}
		if want == 0 && len(pr.ready) == 0 && pr.creating == 0 && now.Sub(pr.lastUsed) > idleAfter {
			delete(p.profiles, pr.key)
		}
	}
	p.target = total
	return discard
}

// toCreate returns the profiles to start one creation for each (a profile may appear several times),
// within Fillers creations at once.
func (p *pool) toCreate(now time.Time) []profileKey {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	budget := p.target
	var keys []profileKey
	list := make([]*profile, 0, len(p.profiles))
	for _, pr := range p.profiles {
		list = append(list, pr)
	}
	slices.SortFunc(list, func(a, b *profile) int { return b.lastUsed.Compare(a.lastUsed) })
	for _, pr := range list {
		want := min(pr.target(now), budget)
		budget -= want
		if now.Before(pr.retryAt) {
			continue
		}
		for len(pr.ready)+pr.creating < want && p.creating < p.cfg.Fillers {
			pr.creating++
			p.creating++
			keys = append(keys, pr.key)
		}
	}
	return keys
}

// fillSlot creates one container for profile key and adds it to the pool (or destroys it, when the pool
// closed or the profile was forgotten meanwhile).
func (r *Runtime) fillSlot(ctx context.Context, key profileKey) {
	p := r.pool
	// A creation runs to its end even when the pool stops meanwhile (closePool waits for it and destroys
	// what it made): one cut short would leave a task, a shim and a cgroup that no one knows of.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	s, err := r.createSlot(cctx, key)
	cancel()
	p.mu.Lock()
	p.creating--
	pr := p.profiles[key]
	if pr != nil {
		pr.creating--
	}
	switch {
	case err != nil:
		p.failures++
		if pr != nil {
			pr.failures++
			pr.retryAt = time.Now().Add(min(time.Second<<min(pr.failures, 6), time.Minute))
		}
	case pr == nil:
		p.discarded["drain"]++
	default:
		p.created++
		pr.failures = 0
		pr.ready = append(pr.ready, s)
		s = nil
	}
	p.mu.Unlock()
	if s != nil {
		r.discardSlot(s)
	}
	p.poke()
}

// createSlot creates a pooled container for profile key: a container with the same hardened spec as a
// cold call's, whose process is the init, whose /workspace is a read-only bind of a fresh slot directory
// that receives mounts from the host (rslave), and whose task is started: the init runs, as the sandbox
// user with nothing of any call, blocked on its standard input until a call sends its request. Starting
// it here takes the OCI runtime's start and the init's own start-up off the call's path. The caller owns
// the result.
func (r *Runtime) createSlot(ctx context.Context, key profileKey) (_ *slot, retErr error) {
	id := "pool-" + randomHex(8)
	if err := r.begin(id, true); err != nil {
		return nil, err
	}
	lim := r.slotLimits(key)
	s := &slot{id: id, key: key, lim: lim, hostDir: filepath.Join(r.pool.dir, id),
		stdin: &lateStdin{src: make(chan io.Reader, 1)}, stdout: &lateWriter{}, stderr: &lateWriter{}}
	defer func() {
		if retErr != nil {
			r.discardSlot(s)
		}
	}()
	if err := os.Mkdir(s.hostDir, 0o755); err != nil {
		return nil, fmt.Errorf("create slot dir: %w", err)
	}
	mounts, rootPath := r.rootfs.mounts, r.rootfs.path
	opts := []containerd.NewContainerOpts{
		containerd.WithRuntime(r.backends[RuncRuntime].handler, r.backends[RuncRuntime].options),
		containerd.WithContainerLabels(map[string]string{labelWorker: r.cfg.WorkerID, labelPool: "1"}),
	}
	if key.image != "" {
		img, err := r.client.GetImage(ctx, key.image)
		if err != nil {
			return nil, fmt.Errorf("get image %s: %w", key.image, err)
		}
		mounts, rootPath = nil, ""
		opts = append(opts, containerd.WithNewSnapshot(id, img, snapshots.WithLabels(map[string]string{labelWorker: r.cfg.WorkerID})))
	}
	specOpts, err := r.slotSpec(id, lim, rootPath, mounts, s.hostDir)
	if err != nil {
		return nil, err
	}
	opts = append(opts, containerd.WithNewSpec(specOpts...))
	s.container, err = r.client.NewContainer(ctx, id, opts...)
	if err != nil {
		return nil, fmt.Errorf("create container %s: %w", id, err)
	}
	creator := func(id string) (cio.IO, error) {
		var err error
		s.callIO, err = cio.NewCreator(cio.WithStreams(s.stdin, s.stdout, s.stderr), cio.WithFIFODir(r.fifoDir(id)))(id)
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

// slotSpec returns the spec options of pooled container id: those of a cold call (hardenedSpec, through
// callMounts), whose process is the init in "/", whose extra mounts are the init binary and Mounts and whose
// workspace is the slot directory hostDir, read-only and a slave of the host's mount, so that the
// workspace the host mounts there at claim time appears in the container and nothing mounted in the
// container could go back.
func (r *Runtime) slotSpec(id string, lim sandbox.Limits, rootPath string, base []specs.Mount, hostDir string) ([]oci.SpecOpts, error) {
	mounts, err := callMounts(base, sandbox.Spec{WorkspaceDir: hostDir, Mounts: r.pool.cfg.aheadMounts()}, lim)
	if err != nil {
		return nil, err
	}
	for i := range mounts {
		if mounts[i].Destination == workspaceDir {
			mounts[i].Options = []string{"bind", "ro", "nosuid", "nodev", "rslave"}
		}
	}
	return r.specOpts(r.backends[RuncRuntime], []string{r.pool.cfg.InitPath, sandboxinit.Command}, "/", sandbox.Spec{ID: id}, lim, rootPath, mounts), nil
}

// discardSlot destroys a container that served no call, in the background (see removeLater).
func (r *Runtime) discardSlot(s *slot) {
	s.stdin.close()
	if s.container == nil {
		err := removeSlotDir(s.hostDir)
		r.end(s.id)
		if r.cfg.OnCleanup != nil && err != nil {
			r.cfg.OnCleanup(0, nil, err)
		}
		return
	}
	r.removeLater(context.Background(), s.id, s.container, s.task, func() error {
		s.endWait()
		return removeSlotDir(s.hostDir)
	})
}

// endWait ends the wait for the init's exit, once the container is gone (or was never made).
func (s *slot) endWait() {
	if s.stopWait != nil {
		s.stopWait()
	}
}

// runWarm runs spec in a pooled container when the pool can serve it. A non-empty reason means that
// nothing of the call ran and the caller is to run it cold; the container, if one was claimed, is
// destroyed either way.
func (r *Runtime) runWarm(ctx context.Context, spec sandbox.Spec, lim sandbox.Limits) (out sandbox.Outcome, reason string, err error) {
	out.WorkspaceBytes = -1
	key, reason := r.profileOf(spec, lim)
	if reason != "" {
		return out, reason, nil
	}
	// The checks of a cold call, so that a call is refused alike wherever it would run.
	cwd, err := checkCwd(spec.Cwd)
	if err != nil {
		return out, "", fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	if _, _, err := processArgs(spec.Argv, cwd, spec.Image == ""); err != nil {
		return out, "", fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	if spec.WorkspaceDir != "" {
		if err := checkWorkspaceDir(spec.WorkspaceDir); err != nil {
			return out, "", fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
		}
	}
	began := time.Now()
	clock := stepClock{steps: &out.Steps, last: began}
	s, reason, expired := r.pool.take(key, began)
	for _, e := range expired {
		r.discardSlot(e)
	}
	if s == nil {
		return out, reason, nil
	}
	if err := r.begin(spec.ID, false); err != nil {
		if !r.pool.giveBack(s) {
			r.discardSlot(s)
		}
		return out, "", fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	defer r.end(spec.ID)
	// From here the container is this call's: it is destroyed when the call is over, whatever happens.
	bound := false
	defer func() { r.retireSlot(s, bound) }()
	clock.done("claim")
	fallBack := func() (sandbox.Outcome, string, error) {
		if ctx.Err() != nil {
			return sandbox.Outcome{WorkspaceBytes: -1}, "", fmt.Errorf("%w: %w", sandbox.ErrNotStarted, ctx.Err())
		}
		return sandbox.Outcome{}, ColdBroken, nil
	}

	req := sandboxinit.Request{Argv: spec.Argv, Env: append(slices.Clone(baseEnv), spec.Env...), Cwd: cwd,
		Stdin: spec.Stdin != nil, NoFile: lim.NoFile, Nonce: randomHex(16)}
	if lim.WorkspaceBytes > 0 {
		req.FileSize = uint64(lim.WorkspaceBytes)
	}
	if spec.WorkspaceDir != "" {
		id, err := bindWorkspace(s.hostDir, spec.WorkspaceDir)
		if err != nil {
			return fallBack()
		}
		bound, req.Workspace = true, &id
		clock.done("bind_workspace")
	}
	if err := r.updateLimits(ctx, s, lim); err != nil {
		return fallBack()
	}
	clock.done("limits")
	header, err := sandboxinit.Encode(req)
	if err != nil {
		return out, "", fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	stdout, stderr := sandbox.NewCapWriter(lim.OutputBytes), sandbox.NewCapWriter(lim.OutputBytes)
	// The live watchers (spec.Stdout, spec.Stderr) see the call's output as under a cold start.
	s.stdout.set(sandbox.Tee(stdout, spec.Stdout))
	ack := &ackFilter{ack: []byte(sandboxinit.Ack(req.Nonce)), next: sandbox.Tee(stderr, spec.Stderr)}
	s.stderr.set(ack)
	select {
	case <-s.exitCh:
		return fallBack() // the init died while it waited in the pool: nothing of the call ran
	default:
	}
	// The init is running: the request is all it needs. No call to containerd is on this path.
	cpuBefore := usageBefore(cgroup2Root, r.cgroupsPath(s.id))
	stdinDone := make(chan struct{})
	s.stdin.provide(&eofSignal{r: io.MultiReader(bytes.NewReader(header), bytes.NewReader(spec.Stdin)), done: stdinDone})
	clock.done("request")
	p := startedCall{task: s.task, exitCh: s.exitCh, callIO: s.callIO, stdout: stdout, stderr: stderr, at: clock.last, cpuBefore: cpuBefore}
	out.SandboxTime = p.at.Sub(began)
	out.Warm, out.ContainerID = true, s.id
	stdinCtx, cancelStdin := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelStdin()
	go closeStdinAfter(stdinCtx, s.task, stdinDone)
	err = r.supervise(ctx, p, spec, lim, &out)
	if !ack.taken() {
		// The init ended before it took the request (it died while it waited, and the claim saw no exit
		// yet): nothing of the call ran.
		return fallBack()
	}
	if prefix := sandboxinit.FailurePrefix(req.Nonce); bytes.HasPrefix(out.Stderr.Head, []byte(prefix)) {
		// The init, not the call's program, ended the process: the program never started.
		msg := strings.TrimSpace(strings.TrimPrefix(out.Stderr.String(), prefix))
		switch out.ExitCode {
		case sandboxinit.ExitNoProgram:
			return out, "", fmt.Errorf("%w: %s", sandbox.ErrNoProgram, msg)
		case sandboxinit.ExitFailed:
			if req.Workspace != nil && strings.Contains(msg, "check workspace") {
				r.pool.disable("the workspace mounted on a slot did not reach its container: " + msg)
			}
			return fallBack()
		}
	}
	return out, "", err
}

// ackFilter passes a pooled container's standard error on to next without the init's acknowledgement
// (sandboxinit.Ack) at its head, and records whether it came. Writes come from one goroutine; taken is
// read once they are over.
type ackFilter struct {
	ack   []byte
	next  io.Writer
	seen  int  // bytes of ack matched so far
	done  bool // the head is decided: ack matched whole, or not there
	found atomic.Bool
}

func (f *ackFilter) Write(p []byte) (int, error) {
	n := len(p)
	if !f.done {
		k := min(len(f.ack)-f.seen, len(p))
		if !bytes.Equal(p[:k], f.ack[f.seen:f.seen+k]) {
			// Not the acknowledgement: what was held back is the stream's own.
			f.done = true
			if f.seen > 0 {
				if _, err := f.next.Write(f.ack[:f.seen]); err != nil {
					return 0, err
				}
			}
		} else {
			f.seen += k
			p = p[k:]
			if f.seen == len(f.ack) {
				f.done = true
				f.found.Store(true)
			}
		}
	}
	if len(p) > 0 {
		if _, err := f.next.Write(p); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// taken reports whether the init acknowledged its request.
func (f *ackFilter) taken() bool { return f.found.Load() }

// retireSlot ends a claimed container's life: the workspace is unmounted from its slot at once (so that
// nothing of the host leads to it through the slot any more), and the container is removed in the
// background.
func (r *Runtime) retireSlot(s *slot, bound bool) {
	var unbindErr error
	if bound {
		unbindErr = unmountDetach(s.hostDir)
	}
	s.stdin.close()
	r.removeLater(context.Background(), s.id, s.container, s.task, func() error {
		s.endWait()
		return errors.Join(unbindErr, removeSlotDir(s.hostDir))
	})
}

// updateLimits sets the call's memory, pids and CPU limits on the pooled container's cgroup when they
// differ from what it was created with.
func (r *Runtime) updateLimits(ctx context.Context, s *slot, lim sandbox.Limits) error {
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

// disable stops the pool from serving calls, for a reason an operator must fix.
func (p *pool) disable(why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.disabled == "" {
		p.disabled = why
	}
}

// Prewarm makes the pool keep a container ready for calls like spec, as if one had just been made, so that
// the first of them is warm. It does not block. Without a pool, or for a spec the pool cannot serve, it
// does nothing.
func (r *Runtime) Prewarm(spec sandbox.Spec) {
	if r.pool == nil {
		return
	}
	key, reason := r.profileOf(spec, capLimits(mergeLimits(spec.Limits, r.cfg.Defaults), r.cfg.Ceiling))
	if reason != "" {
		return
	}
	p := r.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.poke()
	pr := p.profiles[key]
	if pr == nil {
		if len(p.profiles) >= p.cfg.MaxProfiles {
			return
		}
		pr = &profile{key: key}
		p.profiles[key] = pr
	}
	pr.lastUsed = time.Now()
}

// WaitWarm prewarms spec's profile and blocks until a container of it is ready, ctx ends or the pool
// cannot serve spec.
func (r *Runtime) WaitWarm(ctx context.Context, spec sandbox.Spec) error {
	if r.pool == nil {
		return errors.New("wait for a warm container: the runtime has no pool")
	}
	key, reason := r.profileOf(spec, capLimits(mergeLimits(spec.Limits, r.cfg.Defaults), r.cfg.Ceiling))
	if reason != "" {
		return fmt.Errorf("wait for a warm container: the pool cannot serve this spec (%s)", reason)
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		r.Prewarm(spec)
		r.pool.mu.Lock()
		pr, disabled := r.pool.profiles[key], r.pool.disabled
		if r.pool.closed {
			disabled = "it was drained"
		}
		n := 0
		if pr != nil {
			n = len(pr.ready)
		}
		r.pool.mu.Unlock()
		switch {
		case disabled != "":
			return fmt.Errorf("wait for a warm container: the pool is disabled: %s", disabled)
		case n > 0:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for a warm container: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// PoolStats returns a snapshot of the pool; the zero value without one.
func (r *Runtime) PoolStats() PoolStats {
	if r.pool == nil {
		return PoolStats{}
	}
	p := r.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	st := PoolStats{Creating: p.creating, Target: p.target, MemoryBytes: p.memBytes, SlotBytes: p.slotBytes,
		Profiles: len(p.profiles), Created: p.created, CreateFailures: p.failures, Discarded: map[string]uint64{}, Disabled: p.disabled}
	for k, v := range p.discarded {
		st.Discarded[k] = v
	}
	now := time.Now()
	for _, pr := range p.profiles {
		st.Ready += len(pr.ready)
		if len(pr.ready) > 0 {
			st.OldestAge = max(st.OldestAge, now.Sub(pr.ready[0].created))
		}
	}
	return st
}

// measurePool measures what the ready containers hold: each one's cgroup memory, and its share of the
// shim that serves it (the shim's proportional set size over the tasks it serves).
func (r *Runtime) measurePool() {
	p := r.pool
	p.mu.Lock()
	var ready []*slot
	for _, pr := range p.profiles {
		ready = append(ready, pr.ready...)
	}
	if len(ready) == 0 {
		p.memBytes = 0 // nothing ready holds nothing; slotBytes keeps the last estimate
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	var total int64
	shims := map[int]int{} // shim pid: ready containers it serves
	for _, s := range ready {
		total += cgroupMemory(r.cfg.Namespace, s.id)
		if shim := parentPID(int(s.task.Pid())); shim > 1 {
			shims[shim]++
		}
	}
	for shim, n := range shims {
		if all := len(childPIDs(shim)); all > 0 {
			total += procPSS(shim) * int64(n) / int64(all)
		}
	}
	p.mu.Lock()
	p.memBytes = total
	p.slotBytes = max(total/int64(len(ready)), 1<<20)
	p.mu.Unlock()
}

// lateStdin is a pooled container's standard input: it blocks until a call provides its reader.
type lateStdin struct {
	src  chan io.Reader
	r    io.Reader
	once sync.Once
}

func (l *lateStdin) Read(p []byte) (int, error) {
	if l.r == nil {
		r, ok := <-l.src
		if !ok {
			return 0, io.EOF
		}
		l.r = r
	}
	return l.r.Read(p)
}

// provide hands the call's input to the container; at most once.
func (l *lateStdin) provide(r io.Reader) { l.src <- r }

// close ends the input of a container that no call will use (or that a call has claimed already).
func (l *lateStdin) close() { l.once.Do(func() { close(l.src) }) }

// lateWriter is a pooled container's stdout or stderr: it discards until a call sets its writer.
type lateWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lateWriter) set(w io.Writer) {
	l.mu.Lock()
	l.w = w
	l.mu.Unlock()
}

func (l *lateWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	w := l.w
	l.mu.Unlock()
	if w == nil {
		return len(p), nil
	}
	return w.Write(p)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
