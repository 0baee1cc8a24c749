package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tools"
)

// fakeRuntime runs nothing: it records each Spec and either returns at once or blocks until released or
// its context ends (the container is killed), and then remembers why.
type fakeRuntime struct {
	mu      sync.Mutex
	specs   []sandbox.Spec
	killed  []error       // the context's cause for each Run that ended by its context
	block   chan struct{} // nil: return at once
	started chan struct{} // closed when the first Run starts
	err     error
	outcome *sandbox.Outcome // returned instead of a successful run's
}

func (f *fakeRuntime) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	f.mu.Lock()
	f.specs = append(f.specs, spec)
	first := len(f.specs) == 1
	f.mu.Unlock()
	if f.err != nil {
		return sandbox.Outcome{}, f.err
	}
	if first && f.started != nil {
		close(f.started)
	}
	if f.outcome != nil {
		return *f.outcome, nil
	}
	out := sandbox.Outcome{SandboxTime: time.Millisecond, RunTime: time.Millisecond, WorkspaceBytes: -1}
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			f.mu.Lock()
			f.killed = append(f.killed, context.Cause(ctx))
			f.mu.Unlock()
			out.ExitCode, out.Signal = 137, "SIGKILL"
			return out, ctx.Err()
		}
	}
	w := sandbox.NewCapWriter(1 << 10)
	if spec.Stdout != nil {
		io.WriteString(spec.Stdout, "done\n")
	}
	io.WriteString(w, "done\n")
	out.Stdout = w.Captured()
	return out, nil
}

func (f *fakeRuntime) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.specs)
}

func (f *fakeRuntime) kills() []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]error(nil), f.killed...)
}

// fakeLeases is an in-memory lease store whose leases never lapse on their own: a test ends one with
// lapse, or makes renewals fail with renewErr.
type fakeLeases struct {
	mu       sync.Mutex
	held     map[string]bool
	renews   int
	renewErr error
	// hangFirst makes the first renewal wait for its context to end, as a write sent to a server that
	// died does.
	hangFirst bool
}

func newFakeLeases() *fakeLeases { return &fakeLeases{held: map[string]bool{}} }

func (f *fakeLeases) AcquireLease(_ context.Context, id, _ string, _ time.Duration) (queue.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held[id] {
		return nil, queue.ErrExists
	}
	f.held[id] = true
	return &fakeLease{f: f, id: id}, nil
}

func (f *fakeLeases) LeaseHeld(_ context.Context, id string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held[id], nil
}

// hold makes id's lease held by someone else.
func (f *fakeLeases) hold(id string) {
	f.mu.Lock()
	f.held[id] = true
	f.mu.Unlock()
}

// lapse ends a lease as the server does when its TTL passes.
func (f *fakeLeases) lapse(id string) {
	f.mu.Lock()
	delete(f.held, id)
	f.mu.Unlock()
}

func (f *fakeLeases) renewCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.renews
}

type fakeLease struct {
	f  *fakeLeases
	id string
}

func (l *fakeLease) Renew(ctx context.Context) error {
	l.f.mu.Lock()
	if l.f.hangFirst {
		l.f.hangFirst = false
		l.f.mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
	defer l.f.mu.Unlock()
	l.f.renews++
	if !l.f.held[l.id] {
		return queue.ErrConflict
	}
	return l.f.renewErr
}

func (l *fakeLease) Release(context.Context) error { l.f.lapse(l.id); return nil }

// fakeDelivery is delivery number attempt (1 when zero) of c, and records how it was settled ("" when it
// was left unsettled).
type fakeDelivery struct {
	c       *call.Call
	attempt uint64
	mu      sync.Mutex
	settled string
}

func (d *fakeDelivery) Call() (*call.Call, error) { return d.c, nil }
func (d *fakeDelivery) Attempt() uint64 {
	if d.attempt == 0 {
		return 1
	}
	return d.attempt
}
func (d *fakeDelivery) InProgress(context.Context) error         { return nil }
func (d *fakeDelivery) Ack(context.Context) error                { d.set("ack"); return nil }
func (d *fakeDelivery) Nak(context.Context, time.Duration) error { d.set("nak"); return nil }
func (d *fakeDelivery) Term(context.Context, string) error       { d.set("term"); return nil }
func (d *fakeDelivery) set(s string)                             { d.mu.Lock(); d.settled = s; d.mu.Unlock() }
func (d *fakeDelivery) settlement() string                       { d.mu.Lock(); defer d.mu.Unlock(); return d.settled }

// testUID and testGID are the sandbox user the tests' workspaces belong to.
const testUID, testGID = 65532, 65532

// testHeartbeat is short, for tests that want lease renewals; noHeartbeat is long enough that no renewal
// happens within a test, for tests that must see a record change through the watch alone.
const (
	testHeartbeat = 20 * time.Millisecond
	noHeartbeat   = time.Hour
)

// testConfig is a worker config with fast timing: heartbeat 20ms, ack wait 1s, max deliver 10, and a lease
// of a second, so that a loaded machine's scheduling delays never look like a lapsed lease.
func testConfig(t *testing.T) Config {
	return Config{ID: "w1", WorkspacesDir: t.TempDir(), Heartbeat: testHeartbeat, Lease: time.Second, AckWait: time.Second,
		MaxDeliver: 10, UID: testUID, GID: testGID}
}

// newTestWorker is a worker on testConfig changed by edit, with a fresh fakeLeases. A heartbeat raised by
// edit raises the lease and the ack wait with it.
func newTestWorker(t *testing.T, rt sandbox.Runtime, st Store, edit ...func(*Config)) *Worker {
	t.Helper()
	cfg := testConfig(t)
	for _, e := range edit {
		e(&cfg)
	}
	cfg.Lease = max(cfg.Lease, 3*cfg.Heartbeat)
	cfg.AckWait = max(cfg.AckWait, cfg.Lease)
	return newTestWorkerWith(t, cfg, rt, st, WithLeases(newFakeLeases()))
}

func newTestWorkerWith(t *testing.T, cfg Config, rt sandbox.Runtime, st Store, opts ...Option) *Worker {
	t.Helper()
	reg, err := tools.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(cfg, rt, st, reg, slog.New(slog.NewTextHandler(io.Discard, nil)), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func newCall(tool string, args string) *call.Call {
	return &call.Call{ID: call.NewID(), Tenant: "t", Workspace: "ws", Tool: tool, Args: json.RawMessage(args),
		CreatedAt: time.Now(), Limits: call.Limits{TimeoutMS: 10000}}
}

const shellArgs = `{"command":"echo hi"}`

// queuedCall records a queued run_shell call in st and returns it.
func queuedCall(st *queuetest.Store) *call.Call {
	c := newCall("run_shell", shellArgs)
	st.Put(call.NewResult(c, call.StatusQueued))
	return c
}

func TestHandle(t *testing.T) {
	tests := []struct {
		name       string
		tool, args string
		before     func(r *call.Result) // the record as the delivery finds it
		rtErr      error
		leaseHeld  bool // someone holds the call's lease
		wantRuns   int
		wantStatus call.Status
		wantSettle string
	}{
		{name: "queued call runs", tool: "run_shell", args: shellArgs, wantRuns: 1, wantStatus: call.StatusOK, wantSettle: "ack"},
		{name: "final call is not run again", tool: "run_shell", args: shellArgs,
			before: func(r *call.Result) { r.Status, r.FinishedAt = call.StatusOK, time.Now() }, wantStatus: call.StatusOK, wantSettle: "ack"},
		{name: "running call with a live lease is left to its runner", tool: "run_shell", args: shellArgs,
			before: func(r *call.Result) {
				r.Status, r.Worker = call.StatusRunning, "w0"
			}, leaseHeld: true, wantStatus: call.StatusRunning, wantSettle: ""},
		{name: "a runner's clock does not matter: a live lease with a lease_until long past is left alone", tool: "run_shell", args: shellArgs,
			before: func(r *call.Result) {
				r.Status, r.Worker, r.LeaseUntil = call.StatusRunning, "w0", time.Now().Add(-time.Hour)
			}, leaseHeld: true, wantStatus: call.StatusRunning, wantSettle: ""},
		{name: "mutating call whose runner vanished ends lost, whatever its lease_until says", tool: "run_shell", args: shellArgs,
			before: func(r *call.Result) {
				r.Status, r.Worker, r.LeaseUntil = call.StatusRunning, "w0", time.Now().Add(time.Hour)
			}, wantStatus: call.StatusLost, wantSettle: "ack"},
		{name: "a call queued under other arguments (a raced idempotency key) does not run", tool: "run_shell", args: shellArgs,
			before: func(r *call.Result) { r.ArgsDigest = "sha256:other" }, wantStatus: call.StatusError, wantSettle: "ack"},
		{name: "read-only call whose runner vanished runs again", tool: "read_file", args: `{"path":"a"}`,
			before: func(r *call.Result) {
				r.Status, r.Worker, r.LeaseUntil = call.StatusRunning, "w0", time.Now().Add(-time.Second)
			}, wantRuns: 1, wantStatus: call.StatusError /* the fake prints no runner result */, wantSettle: "ack"},
		{name: "call waiting for approval is offered again", tool: "run_shell", args: shellArgs,
			before: func(r *call.Result) { r.Status = call.StatusPendingApproval }, wantStatus: call.StatusPendingApproval, wantSettle: "nak"},
		{name: "cancel requested while queued", tool: "run_shell", args: shellArgs,
			before: func(r *call.Result) { r.CancelRequested = true }, wantStatus: call.StatusCancelled, wantSettle: "ack"},
		{name: "call not started goes back to the queue", tool: "run_shell", args: shellArgs,
			rtErr: fmt.Errorf("%w: create container: boom", sandbox.ErrNotStarted), wantRuns: 1, wantStatus: call.StatusQueued, wantSettle: "nak"},
		{name: "a program missing from the root fails at once, not retried", tool: "run_shell", args: shellArgs,
			rtErr: fmt.Errorf("%w: create task: exec: \"/bin/sh\": no such file or directory", sandbox.ErrNoProgram), wantRuns: 1, wantStatus: call.StatusError, wantSettle: "ack"},
		{name: "runtime failure after start is an internal error", tool: "run_shell", args: shellArgs,
			rtErr: fmt.Errorf("wait task: boom"), wantRuns: 1, wantStatus: call.StatusError, wantSettle: "ack"},
		{name: "an unknown tool fails without a container", tool: "no_such_tool", args: `{}`,
			wantStatus: call.StatusError, wantSettle: "ack"},
		{name: "arguments that do not plan fail without a container", tool: "read_file", args: `{"path":"../x"}`,
			wantStatus: call.StatusError, wantSettle: "ack"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := queuetest.NewStore()
			rt := &fakeRuntime{err: tt.rtErr}
			leases := newFakeLeases()
			w := newTestWorkerWith(t, testConfig(t), rt, st, WithLeases(leases))
			c := newCall(tt.tool, tt.args)
			if tt.leaseHeld {
				leases.hold(c.ID)
			}
			r := call.NewResult(c, call.StatusQueued)
			if tt.before != nil {
				tt.before(r)
			}
			st.Put(r)
			d := &fakeDelivery{c: c}
			w.Handle(context.Background(), d)
			got := st.Result(c.ID)
			if rt.count() != tt.wantRuns || got.Status != tt.wantStatus || d.settlement() != tt.wantSettle {
				t.Fatalf("runs %d status %s settled %s; want %d %s %s (%+v)", rt.count(), got.Status, d.settlement(),
					tt.wantRuns, tt.wantStatus, tt.wantSettle, got.Error)
			}
			if got.Status.Terminal() && (got.FinishedAt.IsZero() || !got.LeaseUntil.IsZero()) {
				t.Errorf("final record finished at %v with lease %v", got.FinishedAt, got.LeaseUntil)
			}
		})
	}
	t.Run("a call with no record is offered again, not run (its record may be on its way)", func(t *testing.T) {
		rt := &fakeRuntime{}
		d := &fakeDelivery{c: newCall("run_shell", shellArgs)}
		newTestWorker(t, rt, queuetest.NewStore()).Handle(context.Background(), d)
		if d.settlement() != "nak" || rt.count() != 0 {
			t.Errorf("settled %q after %d runs, want nak and none", d.settlement(), rt.count())
		}
	})
}

func TestExpiredDeadline(t *testing.T) {
	st := queuetest.NewStore()
	rt := &fakeRuntime{}
	w := newTestWorker(t, rt, st)
	c := newCall("run_shell", shellArgs)
	c.Deadline = time.Now().Add(-time.Second)
	st.Put(call.NewResult(c, call.StatusQueued))
	w.Handle(context.Background(), &fakeDelivery{c: c})
	if got := st.Result(c.ID); rt.count() != 0 || got.Status != call.StatusExpired {
		t.Fatalf("runs %d status %s", rt.count(), got.Status)
	}
}

// TestGiveUp: a call that cannot start is offered again until its last attempt (the delivery before the
// queue's max deliver), then ends with an error the caller can act on, unless it is not this worker's to
// end.
func TestGiveUp(t *testing.T) {
	const maxDeliver = 4
	const maxAttempts = maxDeliver - 1
	notStarted := fmt.Errorf("%w: create container: no space left on device", sandbox.ErrNotStarted)
	tests := []struct {
		name       string
		attempt    uint64
		before     func(r *call.Result)
		leaseHeld  bool                             // someone holds the call's lease
		fail       func(queuetest.Op, string) error // store failures
		shutdown   bool                             // the worker is stopping (ctx cancelled)
		wantRuns   int
		wantStatus call.Status
		wantSettle string
		wantMsg    string
	}{
		{name: "before the last attempt the call is offered again", attempt: maxAttempts - 1,
			wantRuns: 1, wantStatus: call.StatusQueued, wantSettle: "nak"},
		{name: "on the last attempt it ends with an error", attempt: maxAttempts,
			wantRuns: 1, wantStatus: call.StatusError, wantSettle: "ack", wantMsg: "could not start the call in 3 attempts; it did not run"},
		{name: "after the last attempt too", attempt: maxAttempts + 2,
			wantRuns: 1, wantStatus: call.StatusError, wantSettle: "ack", wantMsg: "in 5 attempts"},
		{name: "a call running elsewhere under a live lease is left to its runner", attempt: maxAttempts,
			before: func(r *call.Result) {
				r.Status, r.Worker = call.StatusRunning, "w0"
			}, leaseHeld: true, wantStatus: call.StatusRunning, wantSettle: ""},
		{name: "a call waiting for approval leaves the queue without ending", attempt: maxAttempts,
			before:   func(r *call.Result) { r.Status = call.StatusPendingApproval },
			wantRuns: 0, wantStatus: call.StatusPendingApproval, wantSettle: "ack"},
		{name: "a store that cannot be read on the last attempt ends nothing", attempt: maxAttempts,
			fail:       failOp(queuetest.OpGet, 0),
			wantStatus: call.StatusQueued, wantSettle: "nak"},
		{name: "a worker shutting down on the last attempt gives nothing up", attempt: maxAttempts, shutdown: true,
			fail:       failOp(queuetest.OpGet, 1), // the first read fails, so the call is not started here
			wantStatus: call.StatusQueued, wantSettle: "nak"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := queuetest.NewStore()
			rt := &fakeRuntime{err: notStarted}
			leases := newFakeLeases()
			cfg := testConfig(t)
			cfg.MaxDeliver = maxDeliver
			w := newTestWorkerWith(t, cfg, rt, st, WithLeases(leases))
			c := newCall("run_shell", shellArgs)
			if tt.leaseHeld {
				leases.hold(c.ID)
			}
			r := call.NewResult(c, call.StatusQueued)
			if tt.before != nil {
				tt.before(r)
			}
			st.Put(r)
			st.FailWith(tt.fail)
			ctx, cancel := context.WithCancel(context.Background())
			if tt.shutdown {
				cancel()
			}
			defer cancel()
			d := &fakeDelivery{c: c, attempt: tt.attempt}
			w.Handle(ctx, d)
			got := st.Result(c.ID)
			if rt.count() != tt.wantRuns || got.Status != tt.wantStatus || d.settlement() != tt.wantSettle {
				t.Fatalf("runs %d status %s settled %s; want %d %s %s (%+v)", rt.count(), got.Status, d.settlement(),
					tt.wantRuns, tt.wantStatus, tt.wantSettle, got.Error)
			}
			if tt.wantMsg != "" {
				if got.Error == nil || got.Error.Type != call.ErrInternal || !strings.Contains(got.Error.Message, tt.wantMsg) ||
					got.FinishedAt.IsZero() || !got.LeaseUntil.IsZero() || got.Worker != "" {
					t.Errorf("given up as %+v finished %v lease %v worker %q", got.Error, got.FinishedAt, got.LeaseUntil, got.Worker)
				}
			}
		})
	}
}

// runtimeFunc adapts a function to sandbox.Runtime.
type runtimeFunc func(context.Context, sandbox.Spec) (sandbox.Outcome, error)

func (f runtimeFunc) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	return f(ctx, spec)
}

// TestRuntimeUnavailable: a call whose tenant must run under a runtime this worker lacks ends at once with a
// final error that names the runtime and what to install; it is neither retried nor run under another.
func TestRuntimeUnavailable(t *testing.T) {
	st := queuetest.NewStore()
	var asked []string
	rt := runtimeFunc(func(_ context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
		asked = append(asked, spec.Runtime)
		return sandbox.Outcome{}, fmt.Errorf("%w: runtime %q: this worker offers only runc", sandbox.ErrNoRuntime, spec.Runtime)
	})
	w := newTestWorker(t, rt, st)
	c := newCall("run_shell", shellArgs)
	c.Limits.Runtime = "gvisor"
	st.Put(call.NewResult(c, call.StatusQueued))
	d := &fakeDelivery{c: c}
	w.Handle(context.Background(), d)
	r := st.Result(c.ID)
	if len(asked) != 1 || asked[0] != "gvisor" {
		t.Errorf("the runtime was asked for %q, want once for gvisor", asked)
	}
	if r.Status != call.StatusError || r.Error == nil || r.Error.Type != call.ErrRuntimeUnavailable || d.settlement() != "ack" {
		t.Fatalf("status %s error %+v settled %s; want a final runtime_unavailable error", r.Status, r.Error, d.settlement())
	}
	for _, want := range []string{`"gvisor"`, "make gvisor", "never run under another runtime"} {
		if !strings.Contains(r.Error.Message, want) {
			t.Errorf("message %q does not say %q", r.Error.Message, want)
		}
	}
}

// failOp returns a store failure for op: every one when after is 0, else only the first after of them.
func failOp(op queuetest.Op, after int) func(queuetest.Op, string) error {
	var mu sync.Mutex
	n := 0
	return func(o queuetest.Op, _ string) error {
		if o != op {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		n++
		if after == 0 || n <= after {
			return errors.New("nats: timeout")
		}
		return nil
	}
}

// TestCancelRunningCall: a cancel request reaches the running call through the watch on its record (lease
// renewals never read the record) and kills its container, also when the watch's first read failed.
func TestCancelRunningCall(t *testing.T) {
	for _, tt := range []struct {
		name string
		fail func(queuetest.Op, string) error
	}{
		{"the watch sees the request", nil},
		{"the watch's first read failed (NATS electing a leader) and is tried again", failOp(queuetest.OpWait, 1)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := queuetest.NewStore()
			st.FailWith(tt.fail)
			rt := &fakeRuntime{block: make(chan struct{}), started: make(chan struct{})}
			w := newTestWorker(t, rt, st)
			c := queuedCall(st)
			d, done := handleBlocked(w, rt, c)
			r := st.Result(c.ID)
			r.CancelRequested = true
			st.Put(r)
			waitDone(t, done, "the cancelled call was not killed")
			got := st.Result(c.ID)
			if got.Status != call.StatusCancelled || got.Error.Type != call.ErrCancelled || !strings.Contains(got.Error.Message, "cancelled while it ran") ||
				d.settlement() != "ack" {
				t.Fatalf("status %s %+v settled %s", got.Status, got.Error, d.settlement())
			}
			if kills := rt.kills(); len(kills) != 1 || !errors.Is(kills[0], errCancelRequested) {
				t.Errorf("the container was killed for %v, want one kill for the cancel request", kills)
			}
		})
	}
}

// blindStore is a Store whose Wait sees no change until its context ends: the guard's watch is blind, so
// only the lease renewal can notice a record that changed.
type blindStore struct{ *queuetest.Store }

func (s blindStore) Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestFencing: when the call stops being this worker's while it runs, the worker kills the container and
// records nothing over the other writer's state, whether it sees that through the watch on the record or
// through a lease renewal that the server refuses. A cancel request comes through the watch.
func TestFencing(t *testing.T) {
	takeovers := []struct {
		name      string
		change    func(r *call.Result)
		lapse     bool // the worker's lease lapsed first, as it must before anyone takes the call
		wantCause error
		want      func(t *testing.T, got *call.Result)
	}{
		{"another worker declared the call lost", func(r *call.Result) {
			r.Fail(call.StatusLost, call.ErrLost, "taken over")
		}, true, errFenced, func(t *testing.T, got *call.Result) {
			if got.Status != call.StatusLost || got.Error.Message != "taken over" {
				t.Errorf("the fenced runner overwrote the record: %s %+v", got.Status, got.Error)
			}
		}},
		{"another worker claimed the call", func(r *call.Result) {
			r.Worker, r.LeaseUntil = "w2", time.Now().Add(time.Hour)
		}, true, errFenced, func(t *testing.T, got *call.Result) {
			if got.Status != call.StatusRunning || got.Worker != "w2" {
				t.Errorf("the fenced runner overwrote w2's claim: %s by %s", got.Status, got.Worker)
			}
		}},
		{"the call was ended while its lease lived", func(r *call.Result) {
			r.Fail(call.StatusExpired, call.ErrTimeout, "ended elsewhere")
		}, false, errFenced, func(t *testing.T, got *call.Result) {
			if got.Status != call.StatusExpired || got.Error.Message != "ended elsewhere" {
				t.Errorf("the fenced runner overwrote the final record: %s %+v", got.Status, got.Error)
			}
		}},
		{"a cancel was requested", func(r *call.Result) { r.CancelRequested = true }, false, errCancelRequested,
			func(t *testing.T, got *call.Result) {
				if got.Status != call.StatusCancelled || got.Worker != "w1" {
					t.Errorf("status %s by %s, want cancelled by w1", got.Status, got.Worker)
				}
			}},
	}
	paths := []struct {
		name      string
		heartbeat time.Duration
		store     func(*queuetest.Store) Store
		cancels   bool // a cancel request can be seen on this path
	}{
		{"seen by the watch", noHeartbeat, func(s *queuetest.Store) Store { return s }, true},
		{"seen by the lease renewal", testHeartbeat, func(s *queuetest.Store) Store { return blindStore{s} }, false},
	}
	for _, path := range paths {
		for _, tk := range takeovers {
			if !tk.lapse && !path.cancels {
				continue
			}
			t.Run(path.name+"/"+tk.name, func(t *testing.T) {
				st := queuetest.NewStore()
				rt := &fakeRuntime{block: make(chan struct{}), started: make(chan struct{})}
				leases := newFakeLeases()
				cfg := testConfig(t)
				cfg.Heartbeat = path.heartbeat
				cfg.Lease, cfg.AckWait = max(cfg.Lease, 3*cfg.Heartbeat), max(cfg.AckWait, 3*cfg.Heartbeat)
				w := newTestWorkerWith(t, cfg, rt, path.store(st), WithLeases(leases))
				c := queuedCall(st)
				d, done := handleBlocked(w, rt, c)
				if tk.lapse {
					leases.lapse(c.ID)
				}
				r := st.Result(c.ID)
				tk.change(r)
				st.Put(r)
				waitDone(t, done, "the runner kept running")
				if kills := rt.kills(); len(kills) != 1 || !errors.Is(kills[0], tk.wantCause) {
					t.Errorf("the container was killed for %v, want %v", kills, tk.wantCause)
				}
				want := "ack"
				if tk.wantCause == errFenced {
					want = "" // the record's new owner settles the delivery
				}
				if d.settlement() != want {
					t.Errorf("settled %q, want %q", d.settlement(), want)
				}
				tk.want(t, st.Result(c.ID))
			})
		}
	}
}

// TestShutdownKillsTheRunningCall: when the worker's context ends (the drain's grace period is over), the
// running call's container is killed and the call ends cancelled with a message to call again.
func TestShutdownKillsTheRunningCall(t *testing.T) {
	st := queuetest.NewStore()
	rt := &fakeRuntime{block: make(chan struct{}), started: make(chan struct{})}
	w := newTestWorker(t, rt, st)
	c := queuedCall(st)
	ctx, cancel := context.WithCancel(context.Background())
	d := &fakeDelivery{c: c}
	done := make(chan struct{})
	go func() { w.Handle(ctx, d); close(done) }()
	<-rt.started
	cancel()
	waitDone(t, done, "the call outlived the worker's context")
	got := st.Result(c.ID)
	if got.Status != call.StatusCancelled || !strings.Contains(got.Error.Message, "the worker shut down while the call ran") || d.settlement() != "ack" {
		t.Fatalf("status %s %+v settled %s", got.Status, got.Error, d.settlement())
	}
}

// TestRecordRetriesTransientFailures: a final result survives a store that fails for a while (NATS
// restarting): the worker retries the write instead of losing the result.
func TestRecordRetriesTransientFailures(t *testing.T) {
	st := queuetest.NewStore()
	rt := &fakeRuntime{}
	w := newTestWorker(t, rt, st)
	c := queuedCall(st)
	var mu sync.Mutex
	updates := 0
	st.FailWith(func(op queuetest.Op, _ string) error {
		if op != queuetest.OpUpdate {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		updates++
		if updates == 2 || updates == 3 { // the claim passes; the first two writes of the result fail
			return errors.New("nats: no responders available for request")
		}
		return nil
	})
	d := &fakeDelivery{c: c}
	w.Handle(context.Background(), d)
	if got := st.Result(c.ID); got.Status != call.StatusOK || d.settlement() != "ack" || updates != 4 {
		t.Fatalf("status %s settled %s after %d updates; want ok, ack, 4", got.Status, d.settlement(), updates)
	}
}

// TestEgressNotConfigured: a worker with nowhere to serve a call's egress proxy does not start a web_fetch
// call; it offers it again, for a worker that can.
func TestEgressNotConfigured(t *testing.T) {
	st := queuetest.NewStore()
	rt := &fakeRuntime{}
	w := newTestWorker(t, rt, st)
	c := newCall("web_fetch", `{"url":"https://example.com/"}`)
	st.Put(call.NewResult(c, call.StatusQueued))
	d := &fakeDelivery{c: c}
	w.Handle(context.Background(), d)
	if rt.count() != 0 || d.settlement() != "nak" || st.Result(c.ID).Status != call.StatusQueued {
		t.Errorf("runs %d settled %s status %s", rt.count(), d.settlement(), st.Result(c.ID).Status)
	}
}

// TestLeaseRenewed: a call that runs for many heartbeats keeps renewing its lease, and releases it when
// it is recorded.
func TestLeaseRenewed(t *testing.T) {
	st := queuetest.NewStore()
	rt := &fakeRuntime{block: make(chan struct{}), started: make(chan struct{})}
	leases := newFakeLeases()
	w := newTestWorkerWith(t, testConfig(t), rt, st, WithLeases(leases))
	c := queuedCall(st)
	_, done := handleBlocked(w, rt, c)
	for deadline := time.Now().Add(30 * time.Second); leases.renewCount() < 5; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals in 30s with a 20ms heartbeat", leases.renewCount())
		}
	}
	close(rt.block)
	waitDone(t, done, "the call did not finish")
	final := st.Result(c.ID)
	if final.Status != call.StatusOK || !final.LeaseUntil.IsZero() {
		t.Fatalf("final %s lease %s", final.Status, final.LeaseUntil)
	}
	if held, _ := leases.LeaseHeld(context.Background(), c.ID); held {
		t.Fatal("the lease outlived the recorded result")
	}
}

// TestLeaseRenewalUnanswered: a renewal that is never answered (sent to a NATS server that then died) is
// given up after a few heartbeats and tried again, so the call keeps its lease instead of being stopped at
// the lease's deadline.
func TestLeaseRenewalUnanswered(t *testing.T) {
	st := queuetest.NewStore()
	rt := &fakeRuntime{block: make(chan struct{}), started: make(chan struct{})}
	leases := newFakeLeases()
	leases.hangFirst = true
	w := newTestWorkerWith(t, testConfig(t), rt, st, WithLeases(leases))
	c := queuedCall(st)
	_, done := handleBlocked(w, rt, c)
	for deadline := time.Now().Add(30 * time.Second); leases.renewCount() < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals in 30s after an unanswered one", leases.renewCount())
		}
	}
	close(rt.block)
	waitDone(t, done, "the call did not finish")
	if final := st.Result(c.ID); final.Status != call.StatusOK {
		t.Fatalf("final %s (%+v), want ok: the call was stopped", final.Status, final.Error)
	}
}

// waitDone waits for done, failing the test with msg if it takes longer than a slow machine ever needs.
func waitDone(t *testing.T, done <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal(msg)
	}
}

// TestDeliveryBeforeItsRecord: a first delivery that finds no record (the dispatcher queues a call before
// it records it) waits for the record and runs the call, instead of going back to the queue.
func TestDeliveryBeforeItsRecord(t *testing.T) {
	st := queuetest.NewStore()
	rt := &fakeRuntime{}
	w := newTestWorker(t, rt, st)
	c := newCall("run_shell", shellArgs)
	recordAt(st, c, 2) // the dispatcher records the call after the worker's first read missed it
	d := &fakeDelivery{c: c}
	w.Handle(context.Background(), d)
	if got := st.Result(c.ID); got == nil || got.Status != call.StatusOK || d.settlement() != "ack" || rt.count() != 1 {
		t.Fatalf("record %+v settled %q after %d runs; want the call run once and acked", got, d.settlement(), rt.count())
	}
}

// TestRecordWaitSchedule: a delivery that beats its record reads again soon (the dispatcher records a
// call right after it queues it) and keeps reading for about half a second, with fewer reads as it waits;
// a record written at the last read is found, and one written later leaves the delivery to the queue.
func TestRecordWaitSchedule(t *testing.T) {
	var total time.Duration
	for i, d := range recordPolls {
		if i > 0 && d < recordPolls[i-1] {
			t.Errorf("poll %d (%s) is shorter than the one before", i, d)
		}
		total += d
	}
	if recordPolls[0] > 5*time.Millisecond || total < 400*time.Millisecond || total > 600*time.Millisecond {
		t.Fatalf("first read again after %s, %s in all; want at most 5ms, about 500ms", recordPolls[0], total)
	}
	for _, tt := range []struct {
		name     string
		recordAt int // the read (1-based) before which the record appears
		want     string
	}{
		{"at the last read", 1 + len(recordPolls), "ack"},
		{"after the last read", 2 + len(recordPolls), "nak"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := queuetest.NewStore()
			rt := &fakeRuntime{}
			w := newTestWorker(t, rt, st)
			c := newCall("run_shell", shellArgs)
			gets := recordAt(st, c, tt.recordAt)
			d := &fakeDelivery{c: c}
			w.Handle(context.Background(), d)
			if d.settlement() != tt.want {
				t.Fatalf("settled %q after %d reads, want %q", d.settlement(), gets(), tt.want)
			}
		})
	}
}

// recordAt makes st record c as queued just before the n-th read of its record (the first is 1), as a
// dispatcher that records the call after a worker looked for it; it returns the count of reads so far.
func recordAt(st *queuetest.Store, c *call.Call, n int) (reads func() int) {
	var mu sync.Mutex
	gets := 0
	st.FailWith(func(op queuetest.Op, id string) error {
		if op != queuetest.OpGet || id != c.ID {
			return nil
		}
		mu.Lock()
		gets++
		at := gets
		mu.Unlock()
		if at == n {
			st.Put(call.NewResult(c, call.StatusQueued))
		}
		return nil
	})
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return gets
	}
}

// TestLeaseRenewalLostAtTheProductionRatio: with the lease at three heartbeats (the production ratio: 5 s
// and 15 s), a renewal that is never answered (its server killed or frozen mid-request) is tried again in
// time: the call is not stopped. It was: the unanswered attempt ran until the claim's deadline.
func TestLeaseRenewalLostAtTheProductionRatio(t *testing.T) {
	st := queuetest.NewStore()
	rt := &fakeRuntime{block: make(chan struct{}), started: make(chan struct{})}
	leases := newFakeLeases()
	leases.hangFirst = true
	cfg := testConfig(t)
	cfg.Heartbeat, cfg.Lease, cfg.AckWait = time.Second, 3*time.Second, 3*time.Second
	w := newTestWorkerWith(t, cfg, rt, st, WithLeases(leases))
	c := queuedCall(st)
	_, done := handleBlocked(w, rt, c)
	for deadline := time.Now().Add(30 * time.Second); leases.renewCount() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals in 30s after an unanswered one", leases.renewCount())
		}
		select {
		case <-done:
			t.Fatalf("the call ended after an unanswered renewal: %+v", st.Result(c.ID))
		default:
		}
	}
	close(rt.block)
	waitDone(t, done, "the call did not finish")
	if final := st.Result(c.ID); final.Status != call.StatusOK {
		t.Fatalf("final %s (%+v), want ok: the call was stopped", final.Status, final.Error)
	}
}
