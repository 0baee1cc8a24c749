// Package queue declares how calls travel between dispatchers and workers and where their state lives:
// a durable work queue of calls, a durable record per call that moves through its statuses by
// compare-and-set, a lease per running call kept on the queue server's clock, a store for outputs too
// large for a record, live output, parked approvals, shared state and the audit log. Its contracts, one
// interface per concern, are in contracts.go; this file holds the errors and the values they exchange.
// queue/jetstream implements them on NATS JetStream; queue/queuetest holds a fake Records and the suite
// that holds both to one behaviour. Consumers narrow a contract to the methods they use.
package queue

import (
	"errors"
	"strconv"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// Errors of the contracts (contracts.go), wrapped: test them with errors.Is.
var (
	// ErrNotFound: no record has that id.
	ErrNotFound = errors.New("call not found")
	// ErrConflict: the record (or lease) changed since the revision the caller read; read it again.
	ErrConflict = errors.New("call record changed concurrently")
	// ErrExists: a record (or lease) with that id exists already.
	ErrExists = errors.New("call exists already")
	// ErrTenantFull: the tenant has as many calls queued and running as it may.
	ErrTenantFull = errors.New("tenant has too many calls in flight")
	// ErrTooLarge: the call does not fit in one queue message; send smaller arguments.
	ErrTooLarge = errors.New("call is larger than a queue message may be")
)

// Record is a call's durable state and the revision it was read at, for compare-and-set updates.
type Record struct {
	Result   *call.Result
	Revision uint64
}

// OutputName names the stored copy of one output field ("output", "stdout", "stderr") or whole stream
// ("full-stdout", "full-stderr") of one execution
// of a call: the call's id, the record revision at which the execution claimed the call, and the stream.
// Two executions of a call (a read-only call run again after its worker vanished) never share a name, so
// a late writer cannot overwrite what the recorded one stored.
func OutputName(callID string, claim uint64, stream string) string {
	return callID + "/" + strconv.FormatUint(claim, 10) + "/" + stream
}

// Stuck is a call whose message the queue still holds and that may need settling by someone other than
// a worker: a delivered call that has been in the queue for long, a waiting call past any deadline, or
// a call the queue stopped delivering.
type Stuck struct {
	// Call is the call as queued; nil when the message does not decode.
	Call *call.Call
	// Seq is the message's position in the queue, for Remove.
	Seq uint64
	// Queued is when the message was stored, on the queue server's clock.
	Queued time.Time
	// Delivered: a worker has been handed the call at least once.
	Delivered bool
	// Exhausted: the queue delivered the call as often as it may and will not deliver it again.
	Exhausted bool
	// Deliveries counts the deliveries when Exhausted.
	Deliveries uint64
}

// Chunk is a piece of one output stream ("stdout" or "stderr") of a running call, published as the
// container prints it. Chunks are retained while the call runs, within bounds: a reader that is behind
// what is retained knows it by Offset; the full stream is kept in the output store once the call ends.
type Chunk struct {
	Stream string
	// Offset is the position of Data's first byte in its stream.
	Offset int64
	Data   []byte
	// Attempt is the delivery of the call whose run printed the chunk (call.Result's Attempt; 0: not
	// known). A later attempt's output starts again from byte 0.
	Attempt uint64
}

// End is the position just past the chunk in its stream.
func (c Chunk) End() int64 { return c.Offset + int64(len(c.Data)) }
