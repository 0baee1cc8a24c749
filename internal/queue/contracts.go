package queue

import (
	"context"
	"io"
	"time"

	"github.com/toolpool/toolpool/internal/call"
)

// The contracts of the queue, one interface per concern, each declared once here. queue/jetstream
// implements each with its own type (jetstream.Records, jetstream.Leases...), all sharing one
// connection; queue/queuetest holds a fake Records and the suite (queuetest.StoreSuite) that runs the same
// tests against it and against JetStream. A consumer that needs only part of a contract declares its own
// narrower interface (one to three of these methods) or embeds the contract.
//
// Common to every method: ctx bounds the call; when ctx ends first the method returns an error that wraps
// ctx's (Wait and FollowOutput say what they return instead), and a write may or may not have been
// applied, as with any lost reply: read again before assuming either. Errors are wrapped ("verb object:
// cause"); test them with errors.Is against this package's errors. Every implementation is safe for
// concurrent use.

// Calls is the work queue of calls, from the dispatchers to the workers.
type Calls interface {
	// Publish enqueues a call. The call id makes it idempotent: a publish retried within the queue's
	// duplicate window (2 minutes) is stored once. It blocks until the queue server stored the call, and
	// tries again while the server does not answer (a leader election), for a bounded time. ErrTooLarge:
	// the call does not fit in one message; ErrTenantFull: the tenant has as many calls queued and
	// running as it may. Neither is worth retrying unchanged.
	Publish(ctx context.Context, c *call.Call) error
	// Consume pulls calls and runs handle for each in its own goroutine, never more than slots at once;
	// handle gets ctx and settles its Delivery (or leaves it to the call's runner elsewhere). It blocks
	// until ctx ends, and then returns nil once every handle it started has returned.
	Consume(ctx context.Context, slots int, handle func(context.Context, Delivery)) error
	// ConsumeWith is Consume with two contexts: fetching stops when fetchCtx ends, while the handlers run
	// on runCtx (a draining worker finishes its calls; cancel runCtx to stop them). It returns once
	// fetching stopped and every handler returned.
	ConsumeWith(fetchCtx, runCtx context.Context, slots int, handle func(context.Context, Delivery)) error
	// PublishTo is Publish onto one worker's own queue (a workspace's resident, Residents): that worker
	// takes it before the shared lanes, and, once the worker stops or its presence lapses, any other
	// worker does, so that a call queued for a worker that died still runs once. worker "" is Publish.
	// The tenant's quota counts the calls of each queue apart.
	PublishTo(ctx context.Context, c *call.Call, worker string) error
}

// Residents is where workspaces live and which workers are alive: it places a workspace's calls on the
// worker that holds its copy (its resident), so that they do not restore it elsewhere. It is placement
// only: the homes (Homes) and the records' compare-and-set keep calls correct wherever they run.
type Residents interface {
	// SetResident records worker as tenant's workspace's resident: it has the workspace's latest copy. A
	// record not written again for an hour is forgotten.
	SetResident(ctx context.Context, tenant, workspace, worker string) error
	// ResidentOf returns the worker recorded as tenant's workspace's resident, "" when none is (alive or
	// not: ask Alive).
	ResidentOf(ctx context.Context, tenant, workspace string) (string, error)
	// Alive reports whether worker is fetching calls: it announced itself within its presence TTL, on the
	// queue server's clock, and did not stop.
	Alive(ctx context.Context, worker string) (bool, error)
}

// Delivery is one call handed to a worker. The worker settles it at most once with Ack, Nak or Term; until
// then it must call InProgress more often than the ack wait, or the queue hands the call to another
// worker. A worker that leaves a delivery unsettled (the call runs elsewhere) lets the queue redeliver it
// after the ack wait unless its runner's heartbeats keep it: acks and heartbeats count for the message, not
// for one delivery of it.
type Delivery interface {
	// Call decodes the delivered call; an error when the message does not decode (Term it).
	Call() (*call.Call, error)
	// Attempt counts deliveries of this call, from 1.
	Attempt() uint64
	// InProgress resets the ack wait. It does not wait for the server.
	InProgress(ctx context.Context) error
	// Ack removes the call from the queue. It waits for the server to confirm.
	Ack(ctx context.Context) error
	// Nak hands the call back for redelivery after delay.
	Nak(ctx context.Context, delay time.Duration) error
	// Term removes a call that must never be delivered again (undecodable, or settled elsewhere).
	Term(ctx context.Context, reason string) error
}

// Backlog is the calls the queue still holds that may need settling by someone other than a worker: what
// the dispatchers' reconciler reads. Every method is safe to run in every dispatcher at once.
type Backlog interface {
	// Exhausted hands fn, one at a time, up to max calls whose deliveries ran out since the last call of
	// Exhausted by any dispatcher. fn returns whether the call is settled; when it returns false the call
	// is offered again after retry. A call whose message is gone already is not offered. It does not
	// wait for calls to run out: it returns once it handed fn what there was.
	Exhausted(ctx context.Context, max int, retry time.Duration, fn func(context.Context, Stuck) bool) error
	// Stale hands fn each delivered call queued inFlightAge ago or longer and each never delivered call
	// queued waitingAge ago or longer, by the queue server's clock; it reads a bounded number of messages
	// per pass. The error joins what it could not read; fn was called for the rest.
	Stale(ctx context.Context, inFlightAge, waitingAge time.Duration, fn func(context.Context, Stuck)) error
	// Remove deletes the message at seq (Stuck.Seq) from the queue, its call settled; a message removed
	// already is not an error.
	Remove(ctx context.Context, seq uint64) error
}

// Records is the durable record of every call, by call id, moved through its statuses by compare-and-set
// on its revision. Every read returns a copy: no caller shares memory with the store or another caller.
type Records interface {
	// Create stores the first record of a call (r.ID) and returns its revision. ErrExists: the id is
	// taken, and nothing is written.
	Create(ctx context.Context, r *call.Result) (uint64, error)
	// Get reads a call's record and its revision. ErrNotFound: there is none.
	Get(ctx context.Context, id string) (Record, error)
	// Update replaces the call's record if it is still at revision rev, and returns the new revision,
	// greater than rev. ErrConflict: the record moved on since rev (or never was at rev), and nothing is
	// written; Get it again and decide again. Revision 0 is "no record": Update at 0 writes the first
	// record of a call that has none, and is ErrConflict when it has one.
	Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error)
	// Wait blocks until done holds for the call's record and returns that record. done is called with the
	// current record first, then after writes to it (not necessarily after each one: it sees the latest).
	// When ctx ends first it returns the latest record it read and ctx's error. When there is no such
	// call it returns nil and ErrNotFound at once; a read failure of the first read is returned likewise.
	Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error)
}

// Lease is a worker's hold on a running call, kept on the queue server's clock: the server forgets it once
// it goes a TTL without renewal, whatever any client's clock says. Safe for concurrent use.
type Lease interface {
	// Renew extends the lease by its TTL from now (server time). ErrConflict: the lease lapsed or another
	// holder took it; the caller must stop the call and record nothing.
	Renew(ctx context.Context) error
	// Release gives the lease up; releasing a lease that lapsed is not an error. It is idempotent.
	Release(ctx context.Context) error
}

// Leases is the leases of running calls, one per call id, judged on the queue server's clock.
type Leases interface {
	// AcquireLease takes call id's lease for holder for ttl (at least a second). ErrExists: another
	// holder has it. A lease that lapsed but was not removed yet is taken over. The caller must Release
	// the Lease or let it lapse.
	AcquireLease(ctx context.Context, id, holder string, ttl time.Duration) (Lease, error)
	// LeaseHeld reports whether anyone holds call id's lease: false once it was released or lapsed on the
	// server's clock, and for a call that never had one.
	LeaseHeld(ctx context.Context, id string) (bool, error)
}

// Homes is the workspaces' homes, one per tenant and workspace: a worker holds a workspace's home while
// it runs a call that may change the workspace, so that such calls run one at a time across every
// worker, whichever dispatcher queued them. A home is a Lease, kept on the queue server's clock: it lapses
// when its holder goes a TTL without renewing it (the worker died), and the next call takes it elsewhere.
type Homes interface {
	// AcquireHome takes the home of tenant's workspace for holder (one word) for ttl (at least a second).
	// ErrExists: another acquisition holds it, of another worker or of holder itself (each call takes
	// its own). A home that lapsed but was not removed yet is taken over. The caller must Release the
	// Lease or let it lapse.
	AcquireHome(ctx context.Context, tenant, workspace, holder string, ttl time.Duration) (Lease, error)
	// HomeOf returns who holds tenant's workspace's home: "" when nobody does (released, lapsed on the
	// server's clock, or never taken).
	HomeOf(ctx context.Context, tenant, workspace string) (string, error)
}

// Outputs is the store of outputs too large for a record (and of workspace transfers), by object name
// (OutputName for a call's outputs). Objects are kept as long as the records.
type Outputs interface {
	// PutOutput stores what r yields under name, replacing any object of that name, and returns its
	// size. It streams r in chunks, never holding it whole, and blocks until the store has it all; a ctx
	// without a deadline is bounded by the implementation (minutes).
	PutOutput(ctx context.Context, name string, r io.Reader) (int64, error)
	// ReadOutput returns up to limit bytes of object name from offset on (limit < 0: to the end).
	// ErrNotFound: no such object (it expired with its record, or was never stored).
	ReadOutput(ctx context.Context, name string, offset, limit int64) ([]byte, error)
	// OpenOutput returns a reader of object name from offset on, which streams it; the caller closes it.
	// ErrNotFound: no such object. ctx bounds the reading too, not only the opening.
	OpenOutput(ctx context.Context, name string, offset int64) (io.ReadCloser, error)
	// DeleteOutput removes object name; a missing object is not an error.
	DeleteOutput(ctx context.Context, name string) error
}

// Live is the live output of running calls. Chunks are kept in the queue server, per call, while the call
// runs (bounded by bytes and age), so that a reader joining at any moment replays what it does not have
// yet and then follows what is printed after; the full output is in Outputs once the call ends, and takes
// over from there.
type Live interface {
	// PublishChunk sends one chunk of call callID's output to the call's retained output. It does not
	// wait for the server, but may block briefly while the connection's buffer drains; a chunk the server
	// could not take is missing for readers, who see the gap in Offset. ch.Data is the caller's again once
	// it returns: it is never kept.
	PublishChunk(ctx context.Context, callID string, ch Chunk) error
	// FollowOutput delivers call callID's output from its first byte retained on the returned channel:
	// first what is retained, then every chunk published later, until ctx ends, when the channel is
	// closed. Per stream, chunks come in order, none twice, and each starts where the previous one ended
	// (a chunk resent is trimmed to what is new); a chunk whose Offset is past the previous chunk's End
	// (or past 0, for the first) means the bytes in between are not retained (the call printed more than
	// the retention bounds, or the server did not take them): they are only in Outputs, once the call
	// ends. A reader resuming skips what it has itself: it knows which attempt its position is of. A slow
	// receiver loses nothing: at most buffer chunks wait for it, and delivery waits while the channel is
	// full (the publisher never does). A call run again (its worker lost) prints from byte 0 again: a
	// chunk of an attempt later than the chunks delivered before starts every stream over (from then on,
	// chunks of that attempt from their first byte retained), and a chunk of an earlier attempt than one
	// delivered is dropped.
	FollowOutput(ctx context.Context, callID string, buffer int) (<-chan Chunk, error)
	// Follow calls emit with the bytes of each chunk of call callID's output, from its first byte retained
	// to the chunks published later, in order and from one goroutine; it blocks until ctx ends and then
	// returns nil. Bytes not retained are replaced by a note that says how many are missing; the reports
	// of the call's image pull (stream call.StreamPull) come as lines for people (call.PullProgress's
	// String); a call run again gets a note that its output starts over, then the new attempt's output.
	Follow(ctx context.Context, callID string, emit func(chunk string)) error
	// EndOutput drops call callID's retained chunks. The worker calls it once the call's output is in
	// Outputs and its final record is written, so that a reader who sees the call ended reads Outputs, and
	// one still following sees no chunk after it. A call with no chunks is not an error.
	EndOutput(ctx context.Context, callID string) error
}

// Approvals is the calls parked until a person approves or denies them, by tenant and call id.
type Approvals interface {
	// PutPending parks a call, replacing any parked call of the same tenant and id.
	PutPending(ctx context.Context, p *call.Pending) error
	// GetPending reads a parked call. ErrNotFound: there is none.
	GetPending(ctx context.Context, tenant, id string) (*call.Pending, error)
	// ListPending returns a tenant's parked calls ("*": every tenant's), in no set order; none is not an
	// error.
	ListPending(ctx context.Context, tenant string) ([]*call.Pending, error)
	// DeletePending removes a parked call; a missing one is not an error.
	DeletePending(ctx context.Context, tenant, id string) error
}

// SharedState is named blobs of state that every dispatcher replica shares (the approve-always rules).
type SharedState interface {
	// UpdateState stores what edit makes of the current value of key (nil when there is none), by
	// compare-and-set: when another writer changed it meanwhile, it calls edit again on the new value,
	// so that concurrent writers never lose each other's changes. An error from edit is returned as it
	// is, and nothing is stored.
	UpdateState(ctx context.Context, key string, edit func(old []byte) ([]byte, error)) error
	// WatchState calls onChange with key's current value (if any) and with every later value, from one
	// goroutine, until ctx ends. It returns once the watch is set up.
	WatchState(ctx context.Context, key string, onChange func([]byte)) error
}

// Audit is the audit log: every policy decision and every call outcome, per tenant, kept for months.
type Audit interface {
	// Audit appends an event to the tenant's (ev.Tenant) audit log, and blocks until it is stored.
	Audit(ctx context.Context, ev call.AuditEvent) error
	// ReadAudit returns up to limit of a tenant's audit events since the given time, oldest first. On a
	// failure part way it returns the events read so far with the error.
	ReadAudit(ctx context.Context, tenant string, since time.Time, limit int) ([]call.AuditEvent, error)
}
