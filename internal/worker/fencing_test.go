package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
	"github.com/toolpool/toolpool/internal/sandbox"
)

// handleBlocked hands the recorded call c to w in the background and returns once rt started it: the
// delivery, and a channel closed when Handle returned.
func handleBlocked(w *Worker, rt *fakeRuntime, c *call.Call) (*fakeDelivery, <-chan struct{}) {
	d := &fakeDelivery{c: c}
	done := make(chan struct{})
	go func() { w.Handle(context.Background(), d); close(done) }()
	<-rt.started
	return d, done
}

// TestLeaseNotRenewedInTimeRecordsNothing: a worker that cannot renew its lease (NATS unreachable, the
// worker frozen) kills its call once the lease's local deadline passes, records nothing and leaves the
// delivery to whoever judges the call after the lease lapses on the server.
func TestLeaseNotRenewedInTimeRecordsNothing(t *testing.T) {
	st := queuetest.NewStore()
	rt := &fakeRuntime{block: make(chan struct{}), started: make(chan struct{})}
	leases := newFakeLeases()
	leases.renewErr = errors.New("nats: timeout")
	cfg := testConfig(t)
	cfg.Heartbeat, cfg.Lease = 100*time.Millisecond, time.Second // a renewal missed by scheduling alone is not a lapse
	w := newTestWorkerWith(t, cfg, rt, st, WithLeases(leases))
	c := queuedCall(st)
	d, done := handleBlocked(w, rt, c)
	waitDone(t, done, "the call kept running with a lease it could not renew")
	got, _ := st.Get(context.Background(), c.ID)
	if got.Result.Status != call.StatusRunning || d.settlement() != "" {
		t.Fatalf("status %s settled %q; want running (nothing recorded) and the delivery left", got.Result.Status, d.settlement())
	}
}

// slowConfig has a lease long enough for a test that encodes megabytes under the race detector.
func slowConfig(t *testing.T) Config {
	cfg := testConfig(t)
	cfg.Heartbeat, cfg.Lease, cfg.AckWait = 100*time.Millisecond, 2*time.Second, 3*time.Second
	return cfg
}

// memOutputs is an in-memory output store.
type memOutputs struct {
	mu   sync.Mutex
	objs map[string][]byte
	err  error
}

func (m *memOutputs) PutOutput(_ context.Context, name string, r io.Reader) (int64, error) {
	if m.err != nil {
		return 0, m.err
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.objs[name] = b
	return int64(len(b)), nil
}

func (m *memOutputs) DeleteOutput(_ context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objs, name)
	return nil
}

// bigRuntime prints n bytes of b on stdout.
type bigRuntime struct {
	b byte
	n int
}

func (r bigRuntime) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Outcome, error) {
	w := sandbox.NewCapWriter(int64(r.n))
	w.Write(bytes.Repeat([]byte{r.b}, r.n))
	return sandbox.Outcome{Stdout: w.Captured()}, nil
}

// TestLargeOutputGoesToTheOutputStore: 1 MiB of NUL bytes (6 MiB as JSON) is stored outside the record,
// which names the object, keeps only small fields, and the object holds every byte.
func TestLargeOutputGoesToTheOutputStore(t *testing.T) {
	st := queuetest.NewStore()
	outs := &memOutputs{objs: map[string][]byte{}}
	w := newTestWorkerWith(t, slowConfig(t), bigRuntime{0, 1 << 20}, st, WithLeases(newFakeLeases()), WithOutputs(outs))
	c := newCall("run_shell", shellArgs)
	c.Limits.OutputBytes = 2 << 20
	st.Put(call.NewResult(c, call.StatusQueued))
	w.Handle(context.Background(), &fakeDelivery{c: c})
	got, _ := st.Get(context.Background(), c.ID)
	r := got.Result
	if r.Status != call.StatusOK || r.Stdout != "" || r.Stored["stdout"] == "" {
		t.Fatalf("status %s, %d bytes of stdout inline, stored %v", r.Status, len(r.Stdout), r.Stored)
	}
	if !strings.HasPrefix(r.Stored["stdout"], c.ID+"/") {
		t.Errorf("object %q is not named by the call", r.Stored["stdout"])
	}
	if b := outs.objs[r.Stored["stdout"]]; !bytes.Equal(b, make([]byte, 1<<20)) {
		t.Fatalf("stored %d bytes, want 1 MiB of NUL", len(b))
	}
	if n := encodedLen(r.Output) + encodedLen(r.Stderr); n > 64<<10 {
		t.Errorf("%d bytes of output left inline", n)
	}
}

// TestLargeOutputCutWhenTheStoreFails: when the output store cannot take an output, the record still
// fits, says the output was cut, and the call's result is not lost.
func TestLargeOutputCutWhenTheStoreFails(t *testing.T) {
	st := queuetest.NewStore()
	outs := &memOutputs{objs: map[string][]byte{}, err: errors.New("object store down")}
	w := newTestWorkerWith(t, slowConfig(t), bigRuntime{'x', 1 << 20}, st, WithLeases(newFakeLeases()), WithOutputs(outs))
	w.cfg.InlineBytes = 64 << 10
	c := newCall("run_shell", shellArgs)
	c.Limits.OutputBytes = 2 << 20
	st.Put(call.NewResult(c, call.StatusQueued))
	withShortOutputRetry(t)
	w.Handle(context.Background(), &fakeDelivery{c: c})
	r, _ := st.Get(context.Background(), c.ID)
	if r.Result.Status != call.StatusOK || !r.Result.Truncated || len(r.Result.Stdout) > 64<<10 ||
		!strings.Contains(r.Result.Stdout, "could not store the rest") {
		t.Fatalf("status %s truncated %v, %d bytes inline", r.Result.Status, r.Result.Truncated, len(r.Result.Stdout))
	}
}

func withShortOutputRetry(t *testing.T) {
	t.Helper()
	// The store's failure is retried for outputRetryFor; a failing fake fails at once every time, so the
	// retries only cost the backoff. Keep the test short by cancelling nothing: the bound is 30s of
	// 50ms..2s backoffs, too long for a unit test, so the test swaps the bound.
	old := outputRetryForTest
	outputRetryForTest = 100 * time.Millisecond
	t.Cleanup(func() { outputRetryForTest = old })
}

// TestQueuedButNeverRecorded: a call whose dispatcher stopped between queueing and recording it is left
// for the first deliveries (the record may be on its way), then recorded by the worker and run.
func TestQueuedButNeverRecorded(t *testing.T) {
	st := queuetest.NewStore()
	rt := &fakeRuntime{}
	w := newTestWorkerWith(t, testConfig(t), rt, st, WithLeases(newFakeLeases()), WithCreator(st))
	c := newCall("run_shell", shellArgs)
	early := &fakeDelivery{c: c, attempt: 1}
	w.Handle(context.Background(), early)
	if early.settlement() != "nak" || rt.count() != 0 {
		t.Fatalf("first delivery without a record: settled %q, %d runs", early.settlement(), rt.count())
	}
	late := &fakeDelivery{c: c, attempt: adoptAfter}
	w.Handle(context.Background(), late)
	got, err := st.Get(context.Background(), c.ID)
	if err != nil || got.Result.Status != call.StatusOK || late.settlement() != "ack" || rt.count() != 1 {
		t.Fatalf("later delivery: %v %+v settled %q runs %d", err, got.Result, late.settlement(), rt.count())
	}
}

// TestConfigRefusesSettingsThatDisagree: the worker's timing is checked against the queue's, with a
// message that says what to change.
func TestConfigRefusesSettingsThatDisagree(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"heartbeat close to the ack wait", func(c *Config) { c.Heartbeat, c.AckWait = 5*time.Second, 10*time.Second }, "raise the dispatcher's queue.ack_wait"},
		{"lease longer than the ack wait", func(c *Config) { c.Lease = 2 * time.Second }, "lower the lease"},
		{"lease shorter than two heartbeats", func(c *Config) { c.Lease = 30 * time.Millisecond }, "at least two heartbeats"},
		{"max deliver too small", func(c *Config) { c.MaxDeliver = 2 }, "queue.max_deliver"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			tt.edit(&cfg)
			if cfg.Lease == 0 {
				cfg.Lease = 3 * cfg.Heartbeat
			}
			if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate: %v, want it to say %q", err, tt.want)
			}
		})
	}
}

// lossyStore applies the first claim (an update to running) but answers it with an error, as a write
// whose reply was lost in a leader election.
type lossyStore struct {
	*queuetest.Store
	answer error // what the applied claim answers
	mu     sync.Mutex
	lost   bool
}

func (s *lossyStore) Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error) {
	next, err := s.Store.Update(ctx, r, rev)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && r.Status == call.StatusRunning && !s.lost {
		s.lost = true
		return 0, s.answer
	}
	return next, err
}

// TestClaimWhoseReplyWasLost: a claim that was applied though its writer heard no answer (or heard the
// conflict of its own retried write) is recognised as the worker's own: the call runs once and is
// recorded, not left running for someone to call lost.
func TestClaimWhoseReplyWasLost(t *testing.T) {
	for _, answer := range []error{errors.New("nats: timeout"), fmt.Errorf("update: %w", queue.ErrConflict)} {
		st := &lossyStore{Store: queuetest.NewStore(), answer: answer}
		rt := &fakeRuntime{}
		w := newTestWorkerWith(t, slowConfig(t), rt, st, WithLeases(newFakeLeases()))
		c := newCall("run_shell", shellArgs)
		st.Put(call.NewResult(c, call.StatusQueued))
		d := &fakeDelivery{c: c}
		w.Handle(context.Background(), d)
		got, _ := st.Get(context.Background(), c.ID)
		if got.Result.Status != call.StatusOK || rt.count() != 1 || d.settlement() != "ack" {
			t.Fatalf("claim answered %v: status %s, %d runs, settled %q", answer, got.Result.Status, rt.count(), d.settlement())
		}
	}
}

// staleStore answers the first Wait with the record as it was before the claim, as a read from a
// replica that lags does.
type staleStore struct {
	*queuetest.Store
	once   sync.Once
	served chan struct{} // closed once the stale record was answered
}

func (s *staleStore) Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error) {
	var stale *call.Result
	s.once.Do(func() {
		rec, _ := s.Store.Get(ctx, id)
		stale = rec.Result
		stale.Status, stale.Worker = call.StatusQueued, ""
	})
	if stale != nil && done(stale) {
		close(s.served)
		return stale, nil
	}
	return s.Store.Wait(ctx, id, done)
}

// TestStaleReadDoesNotFence: a read that shows the record as it was before the claim does not stop the
// call while the worker's lease lives; the call runs to its result.
func TestStaleReadDoesNotFence(t *testing.T) {
	st := &staleStore{Store: queuetest.NewStore(), served: make(chan struct{})}
	rt := &fakeRuntime{block: make(chan struct{}), started: make(chan struct{})}
	leases := newFakeLeases()
	w := newTestWorkerWith(t, slowConfig(t), rt, st, WithLeases(leases))
	c := queuedCall(st.Store)
	d, done := handleBlocked(w, rt, c)
	<-st.served
	// A fenced call ends at once; a live one keeps renewing its lease.
	renews := leases.renewCount()
	for leases.renewCount() < renews+3 {
		select {
		case <-done:
			t.Fatal("a stale read fenced a live claim")
		case <-time.After(10 * time.Millisecond):
		}
	}
	close(rt.block)
	<-done
	got, _ := st.Get(context.Background(), c.ID)
	if got.Result.Status != call.StatusOK || d.settlement() != "ack" {
		t.Fatalf("status %s settled %q: a stale read fenced a live claim", got.Result.Status, d.settlement())
	}
}

// finalLossyStore applies the first final write of a call but answers it with an error, as a write
// whose reply was lost in a leader election; its retry then meets its own write (a conflict).
type finalLossyStore struct {
	*queuetest.Store
	mu   sync.Mutex
	lost bool
}

func (s *finalLossyStore) Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error) {
	next, err := s.Store.Update(ctx, r, rev)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && r.Status.Terminal() && !s.lost {
		s.lost = true
		return 0, errors.New("nats: timeout")
	}
	return next, err
}

// TestFinalWriteWhoseReplyWasLost: a final result that was recorded though its writer heard no answer
// is the worker's own: the delivery is acknowledged and the outputs the record names stay (they were
// deleted as if nothing had been recorded, so the call's stdout could never be read).
func TestFinalWriteWhoseReplyWasLost(t *testing.T) {
	st := &finalLossyStore{Store: queuetest.NewStore()}
	outs := &memOutputs{objs: map[string][]byte{}}
	w := newTestWorkerWith(t, slowConfig(t), bigRuntime{'x', 1 << 20}, st, WithLeases(newFakeLeases()), WithOutputs(outs))
	c := newCall("run_shell", shellArgs)
	c.Limits.OutputBytes = 2 << 20
	st.Put(call.NewResult(c, call.StatusQueued))
	d := &fakeDelivery{c: c}
	w.Handle(context.Background(), d)
	got, _ := st.Get(context.Background(), c.ID)
	r := got.Result
	if r.Status != call.StatusOK || r.Stored["stdout"] == "" || d.settlement() != "ack" {
		t.Fatalf("status %s, stored %v, settled %q", r.Status, r.Stored, d.settlement())
	}
	outs.mu.Lock()
	defer outs.mu.Unlock()
	if len(outs.objs[r.Stored["stdout"]]) != 1<<20 {
		t.Fatalf("the recorded result names stdout %q, which the worker deleted", r.Stored["stdout"])
	}
}

// electionStore applies the claim but answers it with an error, then fails every read for a while, as a
// records bucket does while it elects a leader after its leader was killed mid-claim.
type electionStore struct {
	*queuetest.Store
	readsFailUntil time.Time
	mu             sync.Mutex
	lost           bool
}

func (s *electionStore) Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error) {
	next, err := s.Store.Update(ctx, r, rev)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && r.Status == call.StatusRunning && !s.lost {
		s.lost = true
		s.readsFailUntil = time.Now().Add(2 * time.Second)
		return 0, errors.New("nats: timeout")
	}
	return next, err
}

func (s *electionStore) Get(ctx context.Context, id string) (queue.Record, error) {
	s.mu.Lock()
	failing := time.Now().Before(s.readsFailUntil)
	s.mu.Unlock()
	if failing {
		return queue.Record{}, errors.New("nats: no responders available for request")
	}
	return s.Store.Get(ctx, id)
}

// TestClaimConfirmedAfterALongElection: a claim whose write was applied but unanswered, and whose record
// cannot be read back for longer than the lease (the records bucket electing a leader), keeps its lease
// alive while it waits: the call then runs and is recorded ok. The claim's lease lapsed while it waited,
// so the call was stopped the moment it started and later judged lost, its worker alive (TestCluster,
// after every read of a record went to the bucket's leader).
func TestClaimConfirmedAfterALongElection(t *testing.T) {
	st := &electionStore{Store: queuetest.NewStore()}
	rt := &fakeRuntime{}
	leases := newFakeLeases()
	cfg := testConfig(t)
	cfg.Heartbeat, cfg.Lease, cfg.AckWait = 200*time.Millisecond, time.Second, 3*time.Second
	w := newTestWorkerWith(t, cfg, rt, st, WithLeases(leases))
	c := newCall("run_shell", shellArgs)
	st.Put(call.NewResult(c, call.StatusQueued))
	d := &fakeDelivery{c: c}
	w.Handle(context.Background(), d)
	got, _ := st.Store.Get(context.Background(), c.ID)
	if got.Result.Status != call.StatusOK || rt.count() != 1 || d.settlement() != "ack" {
		t.Fatalf("status %s, %d runs, settled %q: the claim's lease lapsed while its record could not be read",
			got.Result.Status, rt.count(), d.settlement())
	}
}
