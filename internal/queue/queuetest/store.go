// Package queuetest holds an in-memory call store for the unit tests of the dispatcher and the worker.
package queuetest

import (
	"context"
	"fmt"
	"sync"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Store is an in-memory call store with what the records bucket gives the dispatcher's and the worker's
// Store: compare-and-set revisions, queue.ErrExists, ErrNotFound and ErrConflict, and Wait woken by every
// change. It keeps copies: callers never share a *call.Result with it. Safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	recs    map[string]queue.Record
	changed chan struct{} // closed and replaced at every change
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{recs: map[string]queue.Record{}, changed: make(chan struct{})}
}

// Put writes r as the call's next revision, whatever the current one is.
func (m *Store) Put(r *call.Result) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.put(r)
}

func (m *Store) put(r *call.Result) uint64 {
	cp := *r
	rev := m.recs[r.ID].Revision + 1
	m.recs[r.ID] = queue.Record{Result: &cp, Revision: rev}
	close(m.changed)
	m.changed = make(chan struct{})
	return rev
}

// Create writes the call's first revision, or fails with queue.ErrExists.
func (m *Store) Create(_ context.Context, r *call.Result) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.recs[r.ID]; ok {
		return 0, fmt.Errorf("create %s: %w", r.ID, queue.ErrExists)
	}
	return m.put(r), nil
}

// Get returns a copy of the call's record, or queue.ErrNotFound.
func (m *Store) Get(_ context.Context, id string) (queue.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.recs[id]
	if !ok {
		return queue.Record{}, fmt.Errorf("get %s: %w", id, queue.ErrNotFound)
	}
	cp := *rec.Result
	return queue.Record{Result: &cp, Revision: rec.Revision}, nil
}

// Update writes r when the call's revision is still rev, or fails with queue.ErrConflict.
func (m *Store) Update(_ context.Context, r *call.Result, rev uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.recs[r.ID].Revision != rev {
		return 0, fmt.Errorf("update %s: %w", r.ID, queue.ErrConflict)
	}
	return m.put(r), nil
}

// Wait returns the call's record once done holds for it, or the latest one with ctx's error.
func (m *Store) Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error) {
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
