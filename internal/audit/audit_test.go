package audit

import (
	"context"
	"sync"
	"testing"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

type nopStore struct{}

func (nopStore) Create(context.Context, *call.Result) (uint64, error)         { return 1, nil }
func (nopStore) Get(context.Context, string) (queue.Record, error)            { return queue.Record{}, nil }
func (nopStore) Update(context.Context, *call.Result, uint64) (uint64, error) { return 2, nil }
func (nopStore) Wait(context.Context, string, func(*call.Result) bool) (*call.Result, error) {
	return nil, nil
}

type memSink struct {
	mu     sync.Mutex
	events []call.AuditEvent
}

func (m *memSink) Audit(_ context.Context, ev call.AuditEvent) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events = append(m.events, ev)
	return nil
}

func TestAuditedStore(t *testing.T) {
	tests := []struct {
		name   string
		write  func(s *AuditedStore)
		events []string
	}{
		{name: "queued call: a decision", write: func(s *AuditedStore) {
			s.Create(context.Background(), &call.Result{ID: "c1", Status: call.StatusQueued, Decision: &call.Decision{Action: "allow", Rule: "r"}})
		}, events: []string{"accepted/queued/allow"}},
		{name: "denied call: a decision and an outcome", write: func(s *AuditedStore) {
			s.Create(context.Background(), &call.Result{ID: "c1", Status: call.StatusDenied, Decision: &call.Decision{Action: "deny", Rule: "r"}})
		}, events: []string{"accepted/denied/deny", "finished/denied/deny"}},
		{name: "running is not logged, final is", write: func(s *AuditedStore) {
			s.Update(context.Background(), &call.Result{ID: "c1", Status: call.StatusRunning}, 1)
			s.Update(context.Background(), &call.Result{ID: "c1", Status: call.StatusOK}, 2)
		}, events: []string{"finished/ok/"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sink := &memSink{}
			tt.write(Wrap(nopStore{}, sink, nil))
			var got []string
			for _, ev := range sink.events {
				got = append(got, ev.Event+"/"+string(ev.Status)+"/"+ev.Action)
			}
			if len(got) != len(tt.events) {
				t.Fatalf("events %v, want %v", got, tt.events)
			}
			for i := range got {
				if got[i] != tt.events[i] {
					t.Fatalf("events %v, want %v", got, tt.events)
				}
			}
		})
	}
}
