package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/queuetest"
)

// The tests in this file kill the mutants `make mutants` found surviving in the worker's fencing (the
// baseline, scripts/mutants-baseline.txt, names each), and the classes behind them.

// stolenStore answers the worker's first claim (an update to running) with an error, having written in
// its place the claim of another owner, as edit makes it from the worker's own: another worker's, or
// another attempt's (another start time). A worker that took that record for its own would run the call
// twice.
type stolenStore struct {
	*queuetest.Store
	answer error
	edit   func(*call.Result)
	mu     sync.Mutex
	done   bool
	theirs *call.Result
}

func (s *stolenStore) Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Status != call.StatusRunning || s.done {
		return s.Store.Update(ctx, r, rev)
	}
	s.done = true
	theirs := *r
	s.edit(&theirs)
	if _, err := s.Store.Update(ctx, &theirs, rev); err != nil {
		return 0, err
	}
	s.theirs = &theirs
	return 0, s.answer
}

// TestClaimConfirmationRefusesAnotherOwner: when a claim's write fails and the record shows a running
// claim that is not exactly this one (another worker, another start time, or not running), the worker
// neither runs the call nor writes over that record.
func TestClaimConfirmationRefusesAnotherOwner(t *testing.T) {
	owners := map[string]func(*call.Result){
		"another worker":        func(r *call.Result) { r.Worker = "worker-b" },
		"another start":         func(r *call.Result) { r.StartedAt = r.StartedAt.Add(-time.Second) },
		"a start a tick later":  func(r *call.Result) { r.StartedAt = r.StartedAt.Add(time.Nanosecond) },
		"another worker, later": func(r *call.Result) { r.Worker, r.StartedAt = r.Worker+"x", r.StartedAt.Add(time.Millisecond) },
	}
	for name, edit := range owners {
		for _, answer := range []error{errors.New("nats: timeout"), fmt.Errorf("update: %w", queue.ErrConflict)} {
			t.Run(fmt.Sprintf("%s/%v", name, answer), func(t *testing.T) {
				st := &stolenStore{Store: queuetest.NewStore(), answer: answer, edit: edit}
				rt := &fakeRuntime{}
				w := newTestWorkerWith(t, slowConfig(t), rt, st, WithLeases(newFakeLeases()))
				c := newCall("run_shell", shellArgs)
				st.Put(call.NewResult(c, call.StatusQueued))
				w.Handle(context.Background(), &fakeDelivery{c: c})
				if n := rt.count(); n != 0 {
					t.Fatalf("the worker ran the call %d times on another owner's claim", n)
				}
				got, _ := st.Get(context.Background(), c.ID)
				r := got.Result
				if r.Status != call.StatusRunning || r.Worker != st.theirs.Worker || !r.StartedAt.Equal(st.theirs.StartedAt) {
					t.Fatalf("record %s by %q at %s; want the other owner's claim (%q at %s) left alone",
						r.Status, r.Worker, r.StartedAt, st.theirs.Worker, st.theirs.StartedAt)
				}
			})
		}
	}
}

// TestConfirmClaim pins confirmClaim against every field it compares: the record is this claim only
// when it is running, by this worker, since this claim's start time.
func TestConfirmClaim(t *testing.T) {
	st := queuetest.NewStore()
	w := newTestWorkerWith(t, slowConfig(t), &fakeRuntime{}, st, WithLeases(newFakeLeases()))
	c := newCall("run_shell", shellArgs)
	mine := call.NewResult(c, call.StatusRunning)
	mine.Worker, mine.StartedAt = w.cfg.ID, time.Now().UTC().Truncate(time.Microsecond)
	for name, tc := range map[string]struct {
		edit func(*call.Result)
		ok   bool
	}{
		"this claim":     {func(*call.Result) {}, true},
		"another worker": {func(r *call.Result) { r.Worker = "other" }, false},
		"no worker":      {func(r *call.Result) { r.Worker = "" }, false},
		"earlier start":  {func(r *call.Result) { r.StartedAt = r.StartedAt.Add(-time.Microsecond) }, false},
		"later start":    {func(r *call.Result) { r.StartedAt = r.StartedAt.Add(time.Microsecond) }, false},
		"queued":         {func(r *call.Result) { r.Status = call.StatusQueued }, false},
		"finished":       {func(r *call.Result) { r.Status = call.StatusOK }, false},
	} {
		rec := *mine
		rec.ID = c.ID + "-" + strings.ReplaceAll(name, " ", "-")
		tc.edit(&rec)
		rev := st.Put(&rec)
		claimed := *mine
		claimed.ID = rec.ID
		lease, _ := newFakeLeases().AcquireLease(context.Background(), rec.ID, w.cfg.ID, w.cfg.Lease)
		got, _, err := w.confirmClaim(context.Background(), &claimed, lease, time.Now())
		switch {
		case tc.ok && (err != nil || got != rev):
			t.Errorf("%s: confirmClaim = %d, %v; want revision %d", name, got, err, rev)
		case !tc.ok && !errors.Is(err, queue.ErrConflict):
			t.Errorf("%s: confirmClaim = %d, %v; want a conflict", name, got, err)
		}
	}
	lease, _ := newFakeLeases().AcquireLease(context.Background(), "absent", w.cfg.ID, w.cfg.Lease)
	if _, _, err := w.confirmClaim(context.Background(), &call.Result{ID: "absent"}, lease, time.Now()); err == nil {
		t.Error("confirmClaim of a call without a record: no error")
	}
}
