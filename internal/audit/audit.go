// Package audit records every policy decision and every call outcome in the audit log. It is a decorator
// around the call records (queue.Records): whoever writes a call's first record (a decision) or its final one (an outcome),
// dispatcher or worker, writes the audit event too, so each event is recorded by exactly one writer.
package audit

import (
	"context"
	"time"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Sink appends events to the audit log: the writing half of queue.Audit.
type Sink interface {
	Audit(ctx context.Context, ev call.AuditEvent) error
}

// AuditedStore is call records (queue.Records) that write an audit event after every successful write of
// a first or final record. An audit failure never fails the write: it goes to onError. The records'
// contract is next's.
type AuditedStore struct {
	queue.Records
	sink    Sink
	onError func(error)
}

// Wrap decorates next. onError may be nil.
func Wrap(next queue.Records, sink Sink, onError func(error)) *AuditedStore {
	if onError == nil {
		onError = func(error) {}
	}
	return &AuditedStore{Records: next, sink: sink, onError: onError}
}

// Create writes the first record and logs the decision ("accepted"), and the outcome when the first
// record is final already (denied).
func (s *AuditedStore) Create(ctx context.Context, r *call.Result) (uint64, error) {
	rev, err := s.Records.Create(ctx, r)
	if err != nil {
		return rev, err
	}
	s.emit(ctx, "accepted", r, "")
	if r.Status.Terminal() {
		s.emit(ctx, "finished", r, "")
	}
	return rev, nil
}

// Update writes a record and logs the outcome when the record is final.
func (s *AuditedStore) Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error) {
	next, err := s.Records.Update(ctx, r, rev)
	if err != nil {
		return next, err
	}
	if r.Status.Terminal() {
		s.emit(ctx, "finished", r, "")
	}
	return next, nil
}

// Record logs an event that is not a store write (an approver's decision).
func (s *AuditedStore) Record(ctx context.Context, event string, r *call.Result, actor string) {
	s.emit(ctx, event, r, actor)
}

func (s *AuditedStore) emit(ctx context.Context, event string, r *call.Result, actor string) {
	ev := call.AuditEvent{
		Time: time.Now().UTC(), Event: event, Tenant: r.Tenant, CallID: r.ID, Tool: r.Tool, Workspace: r.Workspace,
		ArgsDigest: r.ArgsDigest, Status: r.Status, Worker: r.Worker, Actor: actor,
	}
	if r.Decision != nil {
		ev.Action, ev.Rule = r.Decision.Action, r.Decision.Rule
	}
	if r.Error != nil {
		ev.ErrorType = r.Error.Type
	}
	if r.Status.Terminal() {
		ev.DurationMS = r.Timing.TotalMS
		ev.Egress = r.Egress // hosts, decisions and byte counts; never a credential's secret
	}
	if err := s.sink.Audit(context.WithoutCancel(ctx), ev); err != nil {
		s.onError(err)
	}
}
