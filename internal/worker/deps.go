// What the worker is built on, declared where it is consumed: the call records, leases and output objects
// of the queue server, which cmd/worker picks the implementations of.

package worker

import (
	"context"
	"io"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Store is the durable record of each call, updated by compare-and-set: queue.Records without Create,
// which a worker uses only through Creator.
type Store interface {
	Get(ctx context.Context, id string) (queue.Record, error)
	Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error)
	// Wait returns the record once done is true for it, or the latest one with ctx's error.
	Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error)
}

// Leases are the claims of running calls, kept on the queue server's clock: a lease that goes its TTL
// without renewal is gone, whatever any worker's clock says. The worker uses the whole of the queue's
// Leases contract.
type Leases = queue.Leases

// Outputs keeps output fields too large for a record, by object name (queue.OutputName): the writing
// half of queue.Outputs.
type Outputs interface {
	// PutOutput stores what r yields under name and returns its size.
	PutOutput(ctx context.Context, name string, r io.Reader) (int64, error)
	// DeleteOutput removes an object; a missing one is not an error.
	DeleteOutput(ctx context.Context, name string) error
}

// Creator writes a call's first record, for a call whose dispatcher queued it and stopped before it
// recorded it: the Create of queue.Records.
type Creator interface {
	Create(ctx context.Context, r *call.Result) (uint64, error)
}
