package queuetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// StoreSuite runs the behaviour that queue.Records promises against the store newStore returns, one
// subtest per property: the fake Store here and queue/jetstream's Records both run it, so that the fake
// cannot drift from the real thing. newStore is called once per subtest and may return the same store
// each time: every subtest uses call ids of its own.
func StoreSuite(t *testing.T, newStore func(t *testing.T) queue.Records) {
	for _, tc := range []struct {
		name string
		test func(t *testing.T, s queue.Records)
	}{
		{"CreateThenGet", testCreateThenGet},
		{"CreateTakenID", testCreateTakenID},
		{"GetMissing", testGetMissing},
		{"UpdateCompareAndSet", testUpdateCompareAndSet},
		{"UpdateMissing", testUpdateMissing},
		{"UpdateRacing", testUpdateRacing},
		{"RecordsAreCopies", testRecordsAreCopies},
		{"WaitDoneAlready", testWaitDoneAlready},
		{"WaitWakesOnUpdate", testWaitWakesOnUpdate},
		{"WaitMissing", testWaitMissing},
		{"WaitCancelled", testWaitCancelled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.test(t, newStore(t))
		})
	}
}

// suiteTimeout bounds each subtest's calls: a real store answers in milliseconds.
const suiteTimeout = 30 * time.Second

func suiteCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), suiteTimeout)
	t.Cleanup(cancel)
	return ctx
}

func newResult(status call.Status) *call.Result {
	return &call.Result{ID: call.NewID(), Tenant: "acme", Tool: "run_shell", Status: status,
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func mustCreate(ctx context.Context, t *testing.T, s queue.Records, r *call.Result) uint64 {
	t.Helper()
	rev, err := s.Create(ctx, r)
	if err != nil {
		t.Fatalf("Create %s: %v", r.ID, err)
	}
	return rev
}

func mustGet(ctx context.Context, t *testing.T, s queue.Records, id string) queue.Record {
	t.Helper()
	rec, err := s.Get(ctx, id)
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	return rec
}

// testCreateThenGet: Create returns a revision, and Get returns the record as written, at that revision.
func testCreateThenGet(t *testing.T, s queue.Records) {
	ctx := suiteCtx(t)
	r := newResult(call.StatusQueued)
	rev := mustCreate(ctx, t, s, r)
	if rev == 0 {
		t.Fatal("Create returned revision 0")
	}
	rec := mustGet(ctx, t, s, r.ID)
	if rec.Revision != rev {
		t.Errorf("Get revision %d, want Create's %d", rec.Revision, rev)
	}
	if got := rec.Result; got.ID != r.ID || got.Tenant != r.Tenant || got.Tool != r.Tool || got.Status != r.Status ||
		!got.CreatedAt.Equal(r.CreatedAt) {
		t.Errorf("Get = %+v, want %+v", got, r)
	}
}

// testCreateTakenID: a second Create of an id is queue.ErrExists and writes nothing.
func testCreateTakenID(t *testing.T, s queue.Records) {
	ctx := suiteCtx(t)
	r := newResult(call.StatusQueued)
	rev := mustCreate(ctx, t, s, r)
	again := *r
	again.Status = call.StatusDenied
	if _, err := s.Create(ctx, &again); !errors.Is(err, queue.ErrExists) {
		t.Fatalf("second Create: %v, want queue.ErrExists", err)
	}
	if rec := mustGet(ctx, t, s, r.ID); rec.Revision != rev || rec.Result.Status != call.StatusQueued {
		t.Errorf("after the refused Create: %s at %d, want queued at %d", rec.Result.Status, rec.Revision, rev)
	}
}

// testGetMissing: Get of an id never created is queue.ErrNotFound.
func testGetMissing(t *testing.T, s queue.Records) {
	if _, err := s.Get(suiteCtx(t), call.NewID()); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("Get of a missing call: %v, want queue.ErrNotFound", err)
	}
}

// testUpdateCompareAndSet: Update at the current revision writes and returns a greater revision; Update at
// a revision the record moved past is queue.ErrConflict and writes nothing.
func testUpdateCompareAndSet(t *testing.T, s queue.Records) {
	ctx := suiteCtx(t)
	r := newResult(call.StatusQueued)
	rev := mustCreate(ctx, t, s, r)
	r.Status = call.StatusRunning
	next, err := s.Update(ctx, r, rev)
	if err != nil {
		t.Fatalf("Update at the current revision: %v", err)
	}
	if next <= rev {
		t.Errorf("Update returned revision %d, want more than %d", next, rev)
	}
	if rec := mustGet(ctx, t, s, r.ID); rec.Revision != next || rec.Result.Status != call.StatusRunning {
		t.Errorf("after Update: %s at %d, want running at %d", rec.Result.Status, rec.Revision, next)
	}
	r.Status = call.StatusOK
	if _, err := s.Update(ctx, r, rev); !errors.Is(err, queue.ErrConflict) {
		t.Fatalf("Update at a stale revision: %v, want queue.ErrConflict", err)
	}
	if rec := mustGet(ctx, t, s, r.ID); rec.Revision != next || rec.Result.Status != call.StatusRunning {
		t.Errorf("after the refused Update: %s at %d, want running at %d", rec.Result.Status, rec.Revision, next)
	}
	if _, err := s.Update(ctx, r, next+1000); !errors.Is(err, queue.ErrConflict) {
		t.Fatalf("Update at a revision never written: %v, want queue.ErrConflict", err)
	}
}

// testUpdateMissing: Update of an id never created, at a revision, is queue.ErrConflict and creates
// nothing. Revision 0 is "no record": Update at 0 writes a call's first record, and is queue.ErrConflict
// once there is one (JetStream's compare-and-set on a key's last revision).
func testUpdateMissing(t *testing.T, s queue.Records) {
	ctx := suiteCtx(t)
	r := newResult(call.StatusRunning)
	if _, err := s.Update(ctx, r, 1); !errors.Is(err, queue.ErrConflict) {
		t.Fatalf("Update of a missing call: %v, want queue.ErrConflict", err)
	}
	if _, err := s.Get(ctx, r.ID); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("Get after the refused Update: %v, want queue.ErrNotFound", err)
	}
	rev, err := s.Update(ctx, r, 0)
	if err != nil {
		t.Fatalf("Update at revision 0 of a missing call: %v, want it written", err)
	}
	if rec := mustGet(ctx, t, s, r.ID); rec.Revision != rev || rec.Result.Status != call.StatusRunning {
		t.Errorf("after Update at 0: %s at %d, want running at %d", rec.Result.Status, rec.Revision, rev)
	}
	if _, err := s.Update(ctx, r, 0); !errors.Is(err, queue.ErrConflict) {
		t.Fatalf("Update at revision 0 of an existing call: %v, want queue.ErrConflict", err)
	}
}

// testUpdateRacing: of writers updating one record at one revision at once, exactly one wins; the others
// get queue.ErrConflict.
func testUpdateRacing(t *testing.T, s queue.Records) {
	ctx := suiteCtx(t)
	r := newResult(call.StatusQueued)
	rev := mustCreate(ctx, t, s, r)
	const writers = 8
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := *r
			mine.Status = call.StatusRunning
			mine.Worker = "worker-" + string(rune('a'+i))
			_, errs[i] = s.Update(ctx, &mine, rev)
		}()
	}
	wg.Wait()
	won := ""
	for i, err := range errs {
		switch {
		case err == nil && won != "":
			t.Errorf("writers %s and %d both won", won, i)
		case err == nil:
			won = "worker-" + string(rune('a'+i))
		case !errors.Is(err, queue.ErrConflict):
			t.Errorf("writer %d: %v, want nil or queue.ErrConflict", i, err)
		}
	}
	if won == "" {
		t.Fatal("no writer won")
	}
	if rec := mustGet(ctx, t, s, r.ID); rec.Result.Worker != won {
		t.Errorf("record written by %q, want the winner %q", rec.Result.Worker, won)
	}
}

// testRecordsAreCopies: neither the Result a caller wrote nor one it read shares memory with the store.
func testRecordsAreCopies(t *testing.T, s queue.Records) {
	ctx := suiteCtx(t)
	r := newResult(call.StatusQueued)
	r.Stored = map[string]string{"k": "v"}
	mustCreate(ctx, t, s, r)
	r.Status = call.StatusOK
	r.Stored["k"] = "changed by the writer"
	got := mustGet(ctx, t, s, r.ID).Result
	if got.Status != call.StatusQueued || got.Stored["k"] != "v" {
		t.Fatalf("after the writer changed its Result: %s %v, want queued {k: v}", got.Status, got.Stored)
	}
	got.Stored["k"] = "changed by a reader"
	if again := mustGet(ctx, t, s, r.ID).Result; again.Stored["k"] != "v" {
		t.Errorf("after a reader changed its Result: %v, want {k: v}", again.Stored)
	}
}

// testWaitDoneAlready: Wait returns at once when done holds for the current record.
func testWaitDoneAlready(t *testing.T, s queue.Records) {
	ctx := suiteCtx(t)
	r := newResult(call.StatusOK)
	mustCreate(ctx, t, s, r)
	got, err := s.Wait(ctx, r.ID, func(r *call.Result) bool { return r.Status.Terminal() })
	if err != nil || got == nil || got.Status != call.StatusOK {
		t.Fatalf("Wait on a final record: %+v, %v; want it at once", got, err)
	}
}

// testWaitWakesOnUpdate: Wait blocks until an Update makes done true, and returns that record.
func testWaitWakesOnUpdate(t *testing.T, s queue.Records) {
	ctx := suiteCtx(t)
	r := newResult(call.StatusQueued)
	rev := mustCreate(ctx, t, s, r)
	type answer struct {
		r   *call.Result
		err error
	}
	waited := make(chan answer, 1)
	go func() {
		got, err := s.Wait(ctx, r.ID, func(r *call.Result) bool { return r.Status.Terminal() })
		waited <- answer{got, err}
	}()
	r.Status = call.StatusRunning
	rev, err := s.Update(ctx, r, rev)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-waited:
		t.Fatalf("Wait returned %+v, %v before the record was final", a.r, a.err)
	case <-time.After(50 * time.Millisecond):
	}
	r.Status, r.Output = call.StatusOK, "done"
	if _, err := s.Update(ctx, r, rev); err != nil {
		t.Fatal(err)
	}
	a := <-waited
	if a.err != nil || a.r == nil || a.r.Status != call.StatusOK || a.r.Output != "done" {
		t.Fatalf("Wait: %+v, %v; want the final record", a.r, a.err)
	}
}

// testWaitMissing: Wait on an id never created returns nil and queue.ErrNotFound at once.
func testWaitMissing(t *testing.T, s queue.Records) {
	got, err := s.Wait(suiteCtx(t), call.NewID(), func(*call.Result) bool { return false })
	if got != nil || !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("Wait on a missing call: %+v, %v; want nil, queue.ErrNotFound", got, err)
	}
}

// testWaitCancelled: when ctx ends before done holds, Wait returns the latest record and ctx's error.
func testWaitCancelled(t *testing.T, s queue.Records) {
	ctx := suiteCtx(t)
	r := newResult(call.StatusQueued)
	rev := mustCreate(ctx, t, s, r)
	r.Status = call.StatusRunning
	if _, err := s.Update(ctx, r, rev); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	got, err := s.Wait(wctx, r.ID, func(r *call.Result) bool { return r.Status.Terminal() })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its deadline: %v, want context.DeadlineExceeded", err)
	}
	if got == nil || got.Status != call.StatusRunning {
		t.Fatalf("Wait past its deadline returned %+v, want the latest record (running)", got)
	}
}
