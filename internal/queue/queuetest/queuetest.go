// Package queuetest holds an in-memory call store (Store, a queue.Records) for tests of the services
// built on internal/queue's contracts (dispatcher.Store, worker.Store and the decorators around them), and
// StoreSuite, the tests of queue.Records that both that fake and queue/jetstream pass. It is imported by
// tests only.
package queuetest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Op names a Store method, for FailWith.
type Op string

// The operations of a Store.
const (
	OpCreate Op = "create"
	OpGet    Op = "get"
	OpUpdate Op = "update"
	OpWait   Op = "wait"
)

// Store is an in-memory queue.Records with queue/jetstream's semantics, held to them by StoreSuite: Create
// refuses a taken id (queue.ErrExists), Get of an unknown id is queue.ErrNotFound, Update is a
// compare-and-set on the revision (queue.ErrConflict), and Wait wakes on every write. Records are kept as JSON, as the real store keeps
// them, so that no caller shares memory with the store or with another caller. Safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	recs    map[string]stored
	changed chan struct{}
	fail    func(op Op, id string) error
	writes  int
}

type stored struct {
	data []byte
	rev  uint64
}

// NewStore returns an empty Store.
func NewStore() *Store {
	return &Store{recs: map[string]stored{}, changed: make(chan struct{})}
}

// FailWith makes every later operation first ask fail, with the operation and the call id: a non-nil
// error is returned by that operation, which then changes nothing. nil removes the hook.
func (s *Store) FailWith(fail func(op Op, id string) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = fail
}

func (s *Store) check(op Op, id string) error {
	s.mu.Lock()
	fail := s.fail
	s.mu.Unlock()
	if fail == nil {
		return nil
	}
	if err := fail(op, id); err != nil {
		return fmt.Errorf("%s call %s: %w", op, id, err)
	}
	return nil
}

// Put writes r whatever the record's revision (a test's setup, or another writer taking the record) and
// returns the new revision.
func (s *Store) Put(r *call.Result) uint64 {
	data, err := json.Marshal(r)
	if err != nil {
		panic(fmt.Sprintf("encode call %s: %v", r.ID, err)) // a Result always encodes
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.write(r.ID, data)
}

// write stores data under id at the next revision and wakes the waiters. s.mu must be held.
func (s *Store) write(id string, data []byte) uint64 {
	rev := s.recs[id].rev + 1
	s.recs[id] = stored{data: data, rev: rev}
	s.writes++
	close(s.changed)
	s.changed = make(chan struct{})
	return rev
}

// Writes counts the successful writes (Create, Update and Put) so far.
func (s *Store) Writes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes
}

// Create stores the first record of a call; queue.ErrExists if the id is taken.
func (s *Store) Create(_ context.Context, r *call.Result) (uint64, error) {
	return s.set(OpCreate, r, func(_ stored, exists bool) error {
		if exists {
			return fmt.Errorf("create call %s: %w", r.ID, queue.ErrExists)
		}
		return nil
	})
}

// Get reads a call's record; queue.ErrNotFound if there is none.
func (s *Store) Get(_ context.Context, id string) (queue.Record, error) {
	if err := s.check(OpGet, id); err != nil {
		return queue.Record{}, err
	}
	return s.get(id)
}

func (s *Store) get(id string) (queue.Record, error) {
	s.mu.Lock()
	st, ok := s.recs[id]
	s.mu.Unlock()
	if !ok {
		return queue.Record{}, fmt.Errorf("get call %s: %w", id, queue.ErrNotFound)
	}
	var r call.Result
	if err := json.Unmarshal(st.data, &r); err != nil {
		return queue.Record{}, fmt.Errorf("decode call %s: %w", id, err)
	}
	return queue.Record{Result: &r, Revision: st.rev}, nil
}

// Update replaces a call's record if it is still at revision rev; queue.ErrConflict otherwise. Revision 0
// is no record: Update at 0 writes the first record of a call that has none, as JetStream does.
func (s *Store) Update(_ context.Context, r *call.Result, rev uint64) (uint64, error) {
	return s.set(OpUpdate, r, func(cur stored, exists bool) error {
		if exists && cur.rev != rev || !exists && rev != 0 {
			return fmt.Errorf("update call %s at revision %d: %w", r.ID, rev, queue.ErrConflict)
		}
		return nil
	})
}

// set writes r after the injected failure of op, if any, and cond, which sees the current record under
// the lock, let it.
func (s *Store) set(op Op, r *call.Result, cond func(cur stored, exists bool) error) (uint64, error) {
	if err := s.check(op, r.ID); err != nil {
		return 0, err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("encode call %s: %w", r.ID, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, exists := s.recs[r.ID]
	if err := cond(cur, exists); err != nil {
		return 0, err
	}
	return s.write(r.ID, data), nil
}

// Wait returns the call's record once done(record) is true, or the latest record with ctx's error when ctx
// ends first.
func (s *Store) Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error) {
	if err := s.check(OpWait, id); err != nil {
		return nil, err
	}
	return s.wait(ctx, id, done)
}

// WaitFor is Wait for a test's own use: no injected failure applies, and it returns nil when ctx ends
// before done is true or when there is no such call.
func (s *Store) WaitFor(ctx context.Context, id string, done func(*call.Result) bool) *call.Result {
	r, err := s.wait(ctx, id, done)
	if err != nil {
		return nil
	}
	return r
}

func (s *Store) wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error) {
	for {
		s.mu.Lock()
		changed := s.changed
		s.mu.Unlock()
		rec, err := s.get(id)
		if err != nil {
			return nil, err
		}
		if done(rec.Result) {
			return rec.Result, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return rec.Result, ctx.Err()
		}
	}
}

// Result returns the call's current record, or nil when there is none. No injected failure applies.
func (s *Store) Result(id string) *call.Result {
	rec, err := s.get(id)
	if err != nil {
		return nil
	}
	return rec.Result
}

// IDs returns the ids of every record, sorted.
func (s *Store) IDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.recs))
	for id := range s.recs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
