package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
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

// fakeDelivery records how it was settled.
type fakeDelivery struct {
	c       *call.Call
	mu      sync.Mutex
	settled string
}

func (d *fakeDelivery) Call() (*call.Call, error)                { return d.c, nil }
func (d *fakeDelivery) Attempt() uint64                          { return 1 }
func (d *fakeDelivery) InProgress(context.Context) error         { return nil }
func (d *fakeDelivery) Ack(context.Context) error                { d.set("ack"); return nil }
func (d *fakeDelivery) Nak(context.Context, time.Duration) error { d.set("nak"); return nil }
func (d *fakeDelivery) Term(context.Context, string) error       { d.set("term"); return nil }
func (d *fakeDelivery) set(s string)                             { d.mu.Lock(); d.settled = s; d.mu.Unlock() }

func newTestWorker(t *testing.T, rt sandbox.Runtime, st Store) *Worker {
	t.Helper()
	reg, err := tools.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{ID: "w1", WorkspacesDir: t.TempDir(), Heartbeat: 20 * time.Millisecond, UID: 65532, GID: 65532},
		rt, st, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
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
		wantRuns   int
		wantStatus call.Status
		wantSettle string
	}{
		{name: "queued call runs", tool: "run_shell", args: shellArgs, wantRuns: 1, wantStatus: call.StatusOK, wantSettle: "ack"},
		{name: "final call is not run again", tool: "run_shell", args: shellArgs,
			before: func(r *call.Result) { r.Status = call.StatusOK }, wantStatus: call.StatusOK, wantSettle: "ack"},
		{name: "running call with a live lease is left to its runner", tool: "run_shell", args: shellArgs,
			before: func(r *call.Result) {
				r.Status, r.Worker, r.LeaseUntil = call.StatusRunning, "w0", time.Now().Add(time.Hour)
			}, wantStatus: call.StatusRunning, wantSettle: "nak"},
		{name: "mutating call whose runner vanished ends lost", tool: "run_shell", args: shellArgs,
			before: func(r *call.Result) {
				r.Status, r.Worker, r.LeaseUntil = call.StatusRunning, "w0", time.Now().Add(-time.Second)
			}, wantStatus: call.StatusLost, wantSettle: "ack"},
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
			w := newTestWorker(t, rt, st)
			c := newCall(tt.tool, tt.args)
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

// runtimeFunc adapts a function to sandbox.Runtime.
type runtimeFunc func(context.Context, sandbox.Spec) (sandbox.Outcome, error)

func (f runtimeFunc) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	return f(ctx, spec)
}

// TestRuntimeUnavailable: a call whose tenant must run under a runtime this worker lacks ends at once with a
// final error that names the runtime and what to install; it is neither retried nor run under another.
func TestRuntimeUnavailable(t *testing.T) {
	st := newMemStore()
	var asked []string
	rt := runtimeFunc(func(_ context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
		asked = append(asked, spec.Runtime)
		return sandbox.Outcome{}, fmt.Errorf("%w: runtime %q: this worker offers only runc", sandbox.ErrNoRuntime, spec.Runtime)
	})
	w := newTestWorker(t, rt, st)
	c := newCall("run_shell", shellArgs)
	c.Limits.Runtime = "gvisor"
	st.put(call.NewResult(c, call.StatusQueued))
	d := &fakeDelivery{c: c}
	w.Handle(context.Background(), d)
	got, _ := st.Get(context.Background(), c.ID)
	r := got.Result
	if len(asked) != 1 || asked[0] != "gvisor" {
		t.Errorf("the runtime was asked for %q, want once for gvisor", asked)
	}
	if r.Status != call.StatusError || r.Error == nil || r.Error.Type != call.ErrRuntimeUnavailable || d.settled != "ack" {
		t.Fatalf("status %s error %+v settled %s; want a final runtime_unavailable error", r.Status, r.Error, d.settled)
	}
	for _, want := range []string{`"gvisor"`, "make gvisor", "never run under another runtime"} {
		if !strings.Contains(r.Error.Message, want) {
			t.Errorf("message %q does not say %q", r.Error.Message, want)
		}
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
	st.put(call.NewResult(c, call.StatusQueued))
	d := &fakeDelivery{c: c}
	done := make(chan struct{})
	go func() { w.Handle(context.Background(), d); close(done) }()
	<-rt.started
	rec, _ := st.Get(context.Background(), c.ID)
	rec.Result.CancelRequested = true
	asked := time.Now()
	if _, err := st.Update(context.Background(), rec.Result, rec.Revision); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the call was not cancelled")
	}
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
	st.put(call.NewResult(c, call.StatusQueued))
	d := &fakeDelivery{c: c}
	done := make(chan struct{})
	go func() { w.Handle(context.Background(), d); close(done) }()
	<-rt.started
	rec, _ := st.Get(context.Background(), c.ID)
	rec.Result.Fail(call.StatusLost, call.ErrLost, "taken over")
	if _, err := st.Update(context.Background(), rec.Result, rec.Revision); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the fenced runner kept running")
	}
	got, _ := st.Get(context.Background(), c.ID)
	if got.Result.Status != call.StatusLost {
		t.Fatalf("the fenced runner overwrote the record: %s", got.Result.Status)
	}
}

// TestLeaseRenewed: a call that runs for many heartbeats keeps a lease in the future.
func TestLeaseRenewed(t *testing.T) {
	st := newMemStore()
	rt := &fakeRuntime{block: make(chan struct{}), started: make(chan struct{})}
	w := newTestWorker(t, rt, st)
	c := newCall("run_shell", shellArgs)
	st.put(call.NewResult(c, call.StatusQueued))
	done := make(chan struct{})
	go func() { w.Handle(context.Background(), &fakeDelivery{c: c}); close(done) }()
	<-rt.started
	first, _ := st.Get(context.Background(), c.ID)
	later := first
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && !later.Result.LeaseUntil.After(first.Result.LeaseUntil); {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		st.Wait(ctx, c.ID, func(r *call.Result) bool { return r.LeaseUntil.After(first.Result.LeaseUntil) })
		cancel()
		later, _ = st.Get(context.Background(), c.ID)
	}
	close(rt.block)
	<-done
	if !later.Result.LeaseUntil.After(first.Result.LeaseUntil) || later.Result.Status != call.StatusRunning {
		t.Fatalf("lease not renewed: %s then %s (%s)", first.Result.LeaseUntil, later.Result.LeaseUntil, later.Result.Status)
	}
	final, _ := st.Get(context.Background(), c.ID)
	if final.Result.Status != call.StatusOK || !final.Result.LeaseUntil.IsZero() {
		t.Fatalf("final %s lease %s", final.Result.Status, final.Result.LeaseUntil)
	}
}
