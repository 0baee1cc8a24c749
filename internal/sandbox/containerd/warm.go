package containerd

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/sandbox/sandboxinit"
)

// The warm-run path: a call claims a ready container of its profile from the pool and binds what could not
// be bound ahead (its workspace on the container's slot, its limits, and its request, which the init
// acknowledges before it runs the program), and the Runtime's face of the pool (DrainPool, Prewarm,
// WaitWarm, PoolStats).

// DrainPool stops the warm pool for good: it creates no more containers and destroys every ready one (in
// the background; Close waits for their removal). Calls that hold a claimed container keep it until they
// end; later calls run cold (ColdDraining). A worker calls it when it starts draining, so that a worker on
// its way out holds no idle containers. It blocks until the creations in flight have ended and every
// ready container's removal has begun, also when another DrainPool or Close is draining the pool at the
// same time. Without a pool it does nothing; calling it again does nothing.
func (r *Runtime) DrainPool() {
	if r.pool != nil {
		r.pool.Close()
	}
}

// Prewarm makes the pool keep a container ready for calls like spec, as if one had just been made, so that
// the first of them is warm. It does not block. Without a pool, or for a spec the pool cannot serve, it
// does nothing.
func (r *Runtime) Prewarm(spec sandbox.Spec) {
	if r.pool == nil {
		return
	}
	key, reason := r.slots.profileOf(spec, capLimits(mergeLimits(spec.Limits, r.cfg.Defaults), r.cfg.Ceiling))
	if reason != "" {
		return
	}
	r.pool.prewarm(key)
}

// WaitWarm prewarms spec's profile and blocks until a container of it is ready, ctx ends or the pool
// cannot serve spec.
func (r *Runtime) WaitWarm(ctx context.Context, spec sandbox.Spec) error {
	if r.pool == nil {
		return errors.New("wait for a warm container: the runtime has no pool")
	}
	key, reason := r.slots.profileOf(spec, capLimits(mergeLimits(spec.Limits, r.cfg.Defaults), r.cfg.Ceiling))
	if reason != "" {
		return fmt.Errorf("wait for a warm container: the pool cannot serve this spec (%s)", reason)
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		r.Prewarm(spec)
		n, disabled := r.pool.readyOf(key)
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
	return r.pool.stats()
}

// runWarm runs spec in a pooled container when the pool can serve it. A non-empty reason means that
// nothing of the call ran and the caller is to run it cold; the container, if one was claimed, is
// destroyed either way.
func (r *Runtime) runWarm(ctx context.Context, spec sandbox.Spec, lim sandbox.Limits) (out sandbox.Outcome, reason string, err error) {
	out.WorkspaceBytes = -1
	key, reason := r.slots.profileOf(spec, lim)
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
		r.slots.destroy(e)
	}
	if s == nil {
		return out, reason, nil
	}
	if err := r.begin(spec.ID, false); err != nil {
		if !r.pool.giveBack(s) {
			r.slots.destroy(s)
		}
		return out, "", fmt.Errorf("%w: %w", sandbox.ErrNotStarted, err)
	}
	defer r.end(spec.ID)
	// From here the container is this call's: it is destroyed when the call is over, whatever happens.
	bound := false
	defer func() { r.slots.retire(s, bound) }()
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
		id, err := bindWorkspace(s.hostDir, spec.WorkspaceDir, spec.WorkspaceReadOnly)
		if err != nil {
			return fallBack()
		}
		bound, req.Workspace = true, &id
		if needsMasks(spec) {
			if err := r.maskWorkspace(s.hostDir, spec); err != nil {
				return out, "", err // cold would fail alike; the container is destroyed, nothing ran
			}
			clock.done("hide")
		}
		clock.done("bind_workspace")
	}
	if err := s.updateLimits(ctx, lim); err != nil {
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
