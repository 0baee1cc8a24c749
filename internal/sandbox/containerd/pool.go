package containerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox"
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
	// poolTick is how often the pool resizes, retires old containers and measures its memory.
	poolTick = time.Second
	// refillDelay is how long after a claim the pool starts the container that replaces it.
	refillDelay = 100 * time.Millisecond
)

// pool is the warm pool: it keeps containers ready for calls, each used by one call and then destroyed.
// It sizes itself (poolsize.go), has its slotMaker create and destroy the containers, and hands the oldest
// ready one of a profile to the call that claims it (take); the claiming Run owns it from then on. It
// creates nothing until Start and stops for good at Close. Its methods are safe for concurrent use.
type pool struct {
	cfg   PoolConfig
	slots slotMaker
	wake  chan struct{}
	// after runs f after d (time.AfterFunc; tests record it).
	after func(d time.Duration, f func()) *time.Timer
	done  sync.WaitGroup // the manager and every creation in progress

	closeOnce sync.Once // Close's work, which every caller waits for

	mu        sync.Mutex
	stop      context.CancelFunc // ends the manager; nil until Start
	started   bool
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

// newPool returns a pool of cfg's containers, made and destroyed by slots. It creates nothing until Start.
func newPool(cfg PoolConfig, slots slotMaker) *pool {
	cfg = cfg.withDefaults()
	return &pool{cfg: cfg, slots: slots, wake: make(chan struct{}, 1), after: time.AfterFunc, profiles: map[profileKey]*profile{},
		slotBytes: defaultSlotBytes, discarded: map[string]uint64{}}
}

// Start starts the pool's manager, which fills the pool and keeps it at its target until Close. The
// manager runs on a context that keeps ctx's values but not its cancellation: Close, not ctx, stops it.
// It does not block. A second Start, or a Start after Close, does nothing.
func (p *pool) Start(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started || p.closed {
		return
	}
	p.started = true
	mctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	p.stop = stop
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		p.manage(mctx)
	}()
}

// Close stops the pool for good and starts the destruction of every ready container (slotMaker.destroy,
// in the background). Calls that hold a claimed container keep it until they end; later claims get none
// (ColdDraining). It blocks until the manager and the creations in flight have ended and every ready
// container's destruction has begun. Idempotent, and a caller that finds the pool being closed by another
// waits until that one is done: otherwise the Runtime's Close, racing the worker's DrainPool, could close
// the client while the creations in flight were still to be removed, and their containers and shims would
// outlive the worker.
func (p *pool) Close() {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		stop := p.stop
		p.mu.Unlock()
		if stop != nil {
			stop()
		}
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
			p.slots.destroy(s)
		}
	})
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

// disable stops the pool from serving calls, for a reason an operator must fix.
func (p *pool) disable(why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.disabled == "" {
		p.disabled = why
	}
}

// prewarm makes the pool keep a container of profile key ready, as if a call of it had just been made
// (without counting a claim), and wakes the manager. Beyond MaxProfiles it does nothing.
func (p *pool) prewarm(key profileKey) {
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

// readyOf returns how many containers of profile key are ready, and why the pool serves no call when it
// does not (PoolStats.Disabled, or "it was drained" once closed).
func (p *pool) readyOf(key profileKey) (n int, disabled string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, disabled := p.profiles[key], p.disabled
	if p.closed {
		disabled = "it was drained"
	}
	if pr != nil {
		n = len(pr.ready)
	}
	return n, disabled
}

// manage keeps the pool at its target until ctx ends: every tick, or when a claim wakes it, it
// retires containers past MaxAge and beyond the target and starts creations for what is missing. It
// measures the pool's memory every few ticks. It blocks.
func (p *pool) manage(ctx context.Context) {
	t := time.NewTicker(poolTick)
	defer t.Stop()
	measured := time.Time{}
	for {
		now := time.Now()
		if now.Sub(measured) >= 5*poolTick {
			p.measure()
			measured = now
		}
		for _, s := range p.plan(now) {
			p.slots.destroy(s)
		}
		for _, key := range p.toCreate(now) {
			p.done.Add(1)
			go func() {
				defer p.done.Done()
				p.fill(ctx, key)
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

// fill creates one container for profile key and adds it to the pool (or destroys it, when the pool
// closed or the profile was forgotten meanwhile).
func (p *pool) fill(ctx context.Context, key profileKey) {
	// A creation runs to its end even when the pool stops meanwhile (Close waits for it and destroys
	// what it made): one cut short would leave a task, a shim and a cgroup that no one knows of.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	s, err := p.slots.create(cctx, key)
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
		p.slots.destroy(s)
	}
	p.poke()
}
