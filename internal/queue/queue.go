// Package queue declares how calls travel between dispatchers and workers and where their state lives:
// a durable work queue of calls, and a durable record per call that moves through its statuses by
// compare-and-set. queue/jetstream implements both on NATS JetStream.
package queue

import (
	"context"
	"errors"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// Errors of a Store.
var (
	// ErrNotFound: no record has that id.
	ErrNotFound = errors.New("call not found")
	// ErrConflict: the record changed since the revision the caller read; read it again.
	ErrConflict = errors.New("call record changed concurrently")
	// ErrExists: a record with that id exists already.
	ErrExists = errors.New("call exists already")
	// ErrTenantFull: the tenant has as many calls queued and running as it may.
	ErrTenantFull = errors.New("tenant has too many calls in flight")
)

// Delivery is one call handed to a worker. The worker settles it exactly once with Ack or Term; until then
// it must call InProgress more often than the ack wait, or the queue hands the call to another worker.
type Delivery interface {
	// Call decodes the delivered call.
	Call() (*call.Call, error)
	// Attempt counts deliveries of this call, from 1.
	Attempt() uint64
	InProgress(ctx context.Context) error
	// Ack removes the call from the queue.
	Ack(ctx context.Context) error
	// Nak hands the call back for redelivery after delay.
	Nak(ctx context.Context, delay time.Duration) error
	// Term removes a call that must never be delivered again (undecodable, or settled elsewhere).
	Term(ctx context.Context, reason string) error
}

// Record is a call's durable state and the revision it was read at, for compare-and-set updates.
type Record struct {
	Result   *call.Result
	Revision uint64
}
