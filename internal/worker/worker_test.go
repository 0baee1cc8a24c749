package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/sandbox"
	"github.com/toolpool/toolpool/internal/tools"
)

// memStore is an in-memory Store with compare-and-set revisions and change notification.
type memStore struct {
	mu      sync.Mutex
	recs    map[string]queue.Record
	changed chan struct{}
}

func newMemStore() *memStore {
	return &memStore{recs: map[string]queue.Record{}, changed: make(chan struct{})}
}

func (m *memStore) put(r *call.Result) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cp := *r
	m.recs[r.ID] = queue.Record{Result: &cp, Revision: m.recs[r.ID].Revision + 1}
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *memStore) Get(_ context.Context, id string) (queue.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.recs[id]
	if !ok {
		return queue.Record{}, queue.ErrNotFound
	}
	cp := *rec.Result
	return queue.Record{Result: &cp, Revision: rec.Revision}, nil
}

func (m *memStore) Update(_ context.Context, r *call.Result, rev uint64) (uint64, error) {
	m.mu.Lock()
	cur := m.recs[r.ID]
	if cur.Revision != rev {
		m.mu.Unlock()
		return 0, fmt.Errorf("update %s: %w", r.ID, queue.ErrConflict)
	}
	m.mu.Unlock()
	m.put(r)
	return rev + 1, nil
}

func (m *memStore) Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error) {
	for {
		m.mu.Lock()
		ch := m.changed
		m.mu.Unlock()
		rec, err := m.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if done(rec.Result) {
			return rec.Result, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return rec.Result, ctx.Err()
		}
	}
}

// fakeRuntime runs nothing: it counts runs and blocks until released or cancelled.
type fakeRuntime struct {
	mu      sync.Mutex
	runs    int
	block   chan struct{} // nil: return at once
	started chan struct{}
	err     error
}

func (f *fakeRuntime) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	f.mu.Lock()
	f.runs++
	f.mu.Unlock()
	if f.err != nil {
		return sandbox.Outcome{}, f.err
	}
	if f.started != nil {
		close(f.started)
	}
	out := sandbox.Outcome{SandboxTime: time.Millisecond, RunTime: time.Millisecond}
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			out.ExitCode = 137
			return out, ctx.Err()
		}
	}
	w := sandbox.NewCapWriter(1 << 10)
	io.WriteString(w, "done\n")
	out.Stdout = w.Captured()
	return out, nil
}

func (f *fakeRuntime) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.runs
}

// fakeLeases is an in-memory lease store whose leases never lapse on their own: a test ends one with
// lapse, or makes renewals fail with renewErr.
type fakeLeases struct {
	mu       sync.Mutex
	held     map[string]bool
	renews   int
	renewErr error
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

func (l *fakeLease) Renew(context.Context) error {
	l.f.mu.Lock()
	defer l.f.mu.Unlock()
	l.f.renews++
	if !l.f.held[l.id] {
		return queue.ErrConflict
	}
	return l.f.renewErr
}

func (l *fakeLease) Release(context.Context) error { l.f.lapse(l.id); return nil }

// fakeDelivery records how it was settled ("" when it was left unsettled).
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

// testConfig is a worker config with fast timing: heartbeat 20ms, ack wait 1s, max deliver 10, and a lease
// of a second, so that a loaded machine's scheduling delays never look like a lapsed lease.
func testConfig(t *testing.T) Config {
	return Config{ID: "w1", WorkspacesDir: t.TempDir(), Heartbeat: 20 * time.Millisecond, Lease: time.Second, AckWait: time.Second,
		MaxDeliver: 10, UID: 65532, GID: 65532}
}

func newTestWorker(t *testing.T, rt sandbox.Runtime, st Store, opts ...Option) *Worker {
	t.Helper()
	return newTestWorkerWith(t, testConfig(t), rt, st, append([]Option{WithLeases(newFakeLeases())}, opts...)...)
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
			before: func(r *call.Result) { r.Status = call.StatusOK }, wantStatus: call.StatusOK, wantSettle: "ack"},
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
		{name: "cancel requested while queued", tool: "run_shell", args: shellArgs,
			before: func(r *call.Result) { r.CancelRequested = true }, wantStatus: call.StatusCancelled, wantSettle: "ack"},
		{name: "call not started goes back to the queue", tool: "run_shell", args: shellArgs,
			rtErr: fmt.Errorf("%w: create container: boom", sandbox.ErrNotStarted), wantRuns: 1, wantStatus: call.StatusQueued, wantSettle: "nak"},
		{name: "a program missing from the root fails at once, not retried", tool: "run_shell", args: shellArgs,
			rtErr: fmt.Errorf("%w: create task: exec: \"/bin/sh\": no such file or directory", sandbox.ErrNoProgram), wantRuns: 1, wantStatus: call.StatusError, wantSettle: "ack"},
		{name: "runtime failure after start is an internal error", tool: "run_shell", args: shellArgs,
			rtErr: fmt.Errorf("wait task: boom"), wantRuns: 1, wantStatus: call.StatusError, wantSettle: "ack"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := newMemStore()
			rt := &fakeRuntime{err: tt.rtErr}
			leases := newFakeLeases()
			w := newTestWorkerWith(t, testConfig(t), rt, st, WithLeases(leases))
			c := newCall(tt.tool, tt.args)
			if tt.leaseHeld {
				leases.held[c.ID] = true
			}
			r := call.NewResult(c, call.StatusQueued)
			if tt.before != nil {
				tt.before(r)
			}
			st.put(r)
			d := &fakeDelivery{c: c}
			w.Handle(context.Background(), d)
			got, _ := st.Get(context.Background(), c.ID)
			if rt.count() != tt.wantRuns || got.Result.Status != tt.wantStatus || d.settled != tt.wantSettle {
				t.Fatalf("runs %d status %s settled %s; want %d %s %s (%+v)", rt.count(), got.Result.Status, d.settled,
					tt.wantRuns, tt.wantStatus, tt.wantSettle, got.Result.Error)
			}
		})
	}
}

func TestExpiredDeadline(t *testing.T) {
	st := newMemStore()
	rt := &fakeRuntime{}
	w := newTestWorker(t, rt, st)
	c := newCall("run_shell", shellArgs)
	c.Deadline = time.Now().Add(-time.Second)
	st.put(call.NewResult(c, call.StatusQueued))
	w.Handle(context.Background(), &fakeDelivery{c: c})
	got, _ := st.Get(context.Background(), c.ID)
	if rt.count() != 0 || got.Result.Status != call.StatusExpired {
		t.Fatalf("runs %d status %s", rt.count(), got.Result.Status)
	}
}

// TestCancelRunningCall: a cancel request reaches the running call through the record and kills it fast.
func TestCancelRunningCall(t *testing.T) {
	st := newMemStore()
	rt := &fakeRuntime{block: make(chan struct{}), started: make(chan struct{})}
	w := newTestWorker(t, rt, st)
	c := newCall("run_shell", shellArgs)
	d, done := handleBlocked(w, st, rt, c)
	rec, _ := st.Get(context.Background(), c.ID)
	rec.Result.CancelRequested = true
	asked := time.Now()
	if _, err := st.Update(context.Background(), rec.Result, rec.Revision); err != nil {
		t.Fatal(err)
	}
	returned(t, done, rt, "the call was not cancelled")
	if took := time.Since(asked); took > time.Second {
		t.Errorf("cancel took %s", took)
	}
	got, _ := st.Get(context.Background(), c.ID)
	if got.Result.Status != call.StatusCancelled || d.settled != "ack" {
		t.Fatalf("status %s settled %s", got.Result.Status, d.settled)
	}
}

// TestFencedRunnerRecordsNothing: when another writer takes the record (a second worker decided the call
// was lost), the first runner kills its call and does not overwrite the final state.
func TestFencedRunnerRecordsNothing(t *testing.T) {
	st := newMemStore()
	rt := &fakeRuntime{block: make(chan struct{}), started: make(chan struct{})}
	w := newTestWorker(t, rt, st)
	c := newCall("run_shell", shellArgs)
	_, done := handleBlocked(w, st, rt, c)
	rec, _ := st.Get(context.Background(), c.ID)
	rec.Result.Fail(call.StatusLost, call.ErrLost, "taken over")
	if _, err := st.Update(context.Background(), rec.Result, rec.Revision); err != nil {
		t.Fatal(err)
	}
	returned(t, done, rt, "the fenced runner kept running")
	got, _ := st.Get(context.Background(), c.ID)
	if got.Result.Status != call.StatusLost {
		t.Fatalf("the fenced runner overwrote the record: %s", got.Result.Status)
	}
}

// TestLeaseRenewed: a call that runs for many heartbeats keeps renewing its lease, and releases it when
// it is recorded.
func TestLeaseRenewed(t *testing.T) {
	st := newMemStore()
	rt := &fakeRuntime{block: make(chan struct{}), started: make(chan struct{})}
	leases := newFakeLeases()
	w := newTestWorkerWith(t, testConfig(t), rt, st, WithLeases(leases))
	c := newCall("run_shell", shellArgs)
	_, done := handleBlocked(w, st, rt, c)
	for deadline := time.Now().Add(5 * time.Second); leases.renewCount() < 5; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals in 5s with a 20ms heartbeat", leases.renewCount())
		}
	}
	close(rt.block)
	<-done
	final, _ := st.Get(context.Background(), c.ID)
	if final.Result.Status != call.StatusOK || !final.Result.LeaseUntil.IsZero() {
		t.Fatalf("final %s lease %s", final.Result.Status, final.Result.LeaseUntil)
	}
	if held, _ := leases.LeaseHeld(context.Background(), c.ID); held {
		t.Fatal("the lease outlived the recorded result")
	}
}
