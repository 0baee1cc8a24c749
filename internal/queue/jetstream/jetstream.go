// Package jetstream implements internal/queue's contracts on NATS JetStream, and is the only package that
// imports nats.go. Calls go through a durable work-queue stream, one subject per tenant, spread over a
// fixed set of lanes (one durable consumer each); each call's state lives in a key-value bucket under its
// id and moves by compare-and-set; leases of running calls are keys with a server-side TTL; outputs too
// large for a record live in an object store.
//
// A Conn opens the one connection and the streams and buckets, and hands out one type per concern, each
// in its own file and all sharing the connection: Calls (calls.go, consume.go), Backlog (backlog.go),
// Records (records.go), Leases (lease.go), Outputs (output.go), Live (live.go), Approvals
// (approvals.go), SharedState (state.go) and Audit (audit.go). Provisioning is in provision.go.
package jetstream

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Config configures a connection and the streams and buckets it uses.
type Config struct {
	URL string `yaml:"-"`
	// Name identifies this client to the server ("dispatcher", "worker-host1").
	Name string `yaml:"-"`
	// Stream, SubjectPrefix, Bucket and Consumer name the JetStream objects; the defaults fit one toolpool
	// per NATS account.
	Stream        string `yaml:"stream"`
	SubjectPrefix string `yaml:"subject_prefix"`
	Bucket        string `yaml:"bucket"`
	Consumer      string `yaml:"consumer"`
	// Lanes is how many durable consumers share the calls: each tenant's calls go to one lane (by a hash
	// of its name), and workers take turns among the lanes. Tenants in different lanes never wait for
	// each other; tenants that share a lane are served in order of arrival. It may grow, never shrink.
	Lanes int `yaml:"lanes"`
	// AckWait is how long a worker may go without a heartbeat before its call is redelivered.
	AckWait time.Duration `yaml:"ack_wait"`
	// MaxDeliver bounds deliveries of one call; workers give a call up one delivery before it.
	MaxDeliver int `yaml:"max_deliver"`
	// MaxAge and MaxBytes bound the queue; a call older than MaxAge is dropped from it unrun.
	MaxAge   time.Duration `yaml:"max_age"`
	MaxBytes int64         `yaml:"max_bytes"`
	// MaxPendingPerTenant bounds one tenant's calls in the queue (waiting or running); the server refuses
	// more, and Publish returns queue.ErrTenantFull.
	MaxPendingPerTenant int64 `yaml:"max_pending_per_tenant"`
	// ResultTTL is how long call records and their stored outputs are kept.
	ResultTTL time.Duration `yaml:"result_ttl"`
	// LiveMaxBytes and LiveMaxAge bound the live stream, which keeps running calls' output chunks so that
	// a reader joining late replays them: all calls' chunks together take at most LiveMaxBytes (the
	// oldest go first), and none is kept longer than LiveMaxAge. A call's chunks are dropped when it ends
	// (its full output is in the output store). A reader behind what is kept is told so, and reads the
	// rest from the output store when the call ends.
	LiveMaxBytes int64         `yaml:"live_max_bytes"`
	LiveMaxAge   time.Duration `yaml:"live_max_age"`
	// Replicas is the replication factor of every stream, bucket and consumer (3 on a clustered NATS).
	Replicas int `yaml:"replicas"`
	// Provision makes Connect create or update the streams, consumers and buckets with this Config. The
	// dispatcher provisions; workers only bind to what exists, so that their defaults never overwrite the
	// operator's limits.
	Provision bool `yaml:"-"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Name: "toolpool", Stream: "TOOLPOOL_CALLS", SubjectPrefix: "toolpool.calls", Bucket: "toolpool_calls",
		Consumer: "workers", Lanes: 16, AckWait: 30 * time.Second, MaxDeliver: 10, MaxAge: 24 * time.Hour,
		MaxBytes: 1 << 30, MaxPendingPerTenant: 1000, ResultTTL: 7 * 24 * time.Hour, Replicas: 1,
		LiveMaxBytes: 1 << 30, LiveMaxAge: time.Hour,
	}
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	switch {
	case c.URL == "":
		return errors.New("nats url is empty")
	case c.AckWait < time.Second:
		return fmt.Errorf("queue ack_wait %s is below 1s", c.AckWait)
	case c.MaxDeliver < 3:
		return fmt.Errorf("queue max_deliver %d is below 3: workers give a call up one delivery before the last, and need one before that to try", c.MaxDeliver)
	case c.MaxPendingPerTenant < 1:
		return fmt.Errorf("queue max_pending_per_tenant %d is below 1", c.MaxPendingPerTenant)
	case c.Replicas < 1 || c.Replicas > 5:
		return fmt.Errorf("queue replicas %d is outside 1..5", c.Replicas)
	case c.Lanes < 1 || c.Lanes > 1024:
		return fmt.Errorf("queue lanes %d is outside 1..1024", c.Lanes)
	case c.ResultTTL < time.Minute:
		return fmt.Errorf("queue result_ttl %s is below 1m", c.ResultTTL)
	case c.LiveMaxBytes < 1<<20:
		return fmt.Errorf("queue live_max_bytes %d is below 1 MiB (1048576): live readers would replay almost nothing", c.LiveMaxBytes)
	case c.LiveMaxAge < time.Minute:
		return fmt.Errorf("queue live_max_age %s is below 1m: set it to at least the longest call's timeout", c.LiveMaxAge)
	}
	return nil
}

// Option configures optional behaviour of a Conn.
type Option func(*Conn)

// WithLocalClock makes the Conn read local time from now instead of time.Now: the clock whose offset from
// the server's Now corrects. Tests inject a skewed clock here.
func WithLocalClock(now func() time.Time) Option {
	return func(c *Conn) { c.clock.local = now }
}

// session is what every concern's type shares: the configuration (as bound or provisioned), the one
// connection and the server clock's estimate. It is never changed after Connect returns.
type session struct {
	cfg   Config
	nc    *nats.Conn
	js    jetstream.JetStream
	clock *clock
}

// Conn is a connection to JetStream with the streams and buckets opened: it hands out the per-concern
// types (Records, Leases, Outputs...), which share it and live as long as it, and it owns the connection:
// Close ends them all. Safe for concurrent use.
type Conn struct {
	*session

	calls     *Calls
	backlog   *Backlog
	records   *Records
	leases    *Leases
	outputs   *Outputs
	live      *Live
	approvals *Approvals
	state     *SharedState
	audit     *Audit
	ckptState
	headsState

	closeOnce sync.Once
	stop      context.CancelFunc
	bg        sync.WaitGroup
}

// clientPing is how often a connection asks its server whether it is alive.
const clientPing = 2 * time.Second

// Connect connects to NATS and creates or updates (with Provision) or looks up the streams, consumers and
// buckets. The caller must Close the Conn.
func Connect(ctx context.Context, cfg Config, opts ...Option) (_ *Conn, retErr error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validate nats config: %w", err)
	}
	// A server that freezes (SIGSTOP, a partition) keeps its connections open and silent: with nats.go's
	// default pings (every 2 minutes) a worker stayed on it, could not renew its leases, and its calls
	// ended lost although it lived. Pings every clientPing, two unanswered, leave such a server in about
	// three of them, well inside a lease, for another server of the cluster.
	nc, err := nats.Connect(cfg.URL, nats.Name(cfg.Name), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(false), nats.PingInterval(clientPing), nats.MaxPingsOutstanding(2))
	if err != nil {
		return nil, fmt.Errorf("connect nats at %s: %w", cfg.URL, err)
	}
	defer func() {
		if retErr != nil {
			nc.Close()
		}
	}()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("open jetstream: %w", err)
	}
	if cfg.Provision {
		err = whileClusterForms(ctx, provisionWait, func() error { return provision(ctx, js, &cfg) })
	} else {
		err = bind(ctx, js, &cfg)
	}
	if err != nil {
		return nil, err
	}
	s := &session{cfg: cfg, nc: nc, js: js, clock: &clock{local: time.Now}}
	c := &Conn{session: s}
	for _, o := range opts {
		o(c)
	}
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", cfg.Bucket, err)
	}
	leases, err := js.KeyValue(ctx, cfg.leaseBucket())
	if err != nil {
		return nil, fmt.Errorf("open bucket %s (a dispatcher of this version provisions it): %w", cfg.leaseBucket(), err)
	}
	outs, err := js.ObjectStore(ctx, cfg.outputBucket())
	if err != nil {
		return nil, fmt.Errorf("open object store %s (a dispatcher of this version provisions it): %w", cfg.outputBucket(), err)
	}
	c.calls = &Calls{session: s}
	c.backlog = &Backlog{session: s}
	c.records = &Records{session: s, kv: kv}
	c.leases = &Leases{session: s, kv: leases}
	c.outputs = &Outputs{session: s, store: outs}
	c.live = &Live{session: s}
	c.approvals = &Approvals{session: s}
	c.state = &SharedState{session: s}
	c.audit = &Audit{session: s}
	if err := s.syncClock(ctx); err != nil {
		return nil, err
	}
	bgCtx, stop := context.WithCancel(context.Background())
	c.stop = stop
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		s.keepClock(bgCtx)
	}()
	return c, nil
}

// Calls is the calls queue: publishing and consuming calls.
func (c *Conn) Calls() *Calls { return c.calls }

// Backlog is the calls the queue holds that may need settling by a dispatcher.
func (c *Conn) Backlog() *Backlog { return c.backlog }

// Records is the call records.
func (c *Conn) Records() *Records { return c.records }

// Leases is the leases of running calls.
func (c *Conn) Leases() *Leases { return c.leases }

// Outputs is the store of outputs too large for a record.
func (c *Conn) Outputs() *Outputs { return c.outputs }

// Live is the live output of running calls.
func (c *Conn) Live() *Live { return c.live }

// Approvals is the calls parked for approval.
func (c *Conn) Approvals() *Approvals { return c.approvals }

// SharedState is the named blobs of state every dispatcher shares.
func (c *Conn) SharedState() *SharedState { return c.state }

// Audit is the audit log.
func (c *Conn) Audit() *Audit { return c.audit }

// Names of the objects derived from Config.Bucket and Config.Stream.
func (c Config) leaseBucket() string       { return c.Bucket + "_leases" }
func (c Config) approvalsBucket() string   { return c.Bucket + "_approvals" }
func (c Config) stateBucket() string       { return c.Bucket + "_state" }
func (c Config) auditStream() string       { return c.Stream + "_AUDIT" }
func (c Config) outputBucket() string      { return c.Bucket + "_outputs" }
func (c Config) checkpointBucket() string  { return c.Bucket + "_checkpoints" }
func (c Config) headsBucket() string       { return c.Bucket + "_heads" }
func (c Config) advisoryStream() string    { return c.Stream + "_ADVISORIES" }
func (c Config) liveStream() string        { return c.Stream + "_LIVE" }
func (c Config) laneConsumer(l int) string { return c.Consumer + "_lane" + strconv.Itoa(l) }
func (c Config) laneFilter(l int) string   { return c.SubjectPrefix + "." + strconv.Itoa(l) + ".*" }
func (c Config) bellSubject(l int) string  { return c.SubjectPrefix + "_ready." + strconv.Itoa(l) }

// A worker's own queue (routed.go): its subjects PREFIX_home.<worker>.<tenant>, its consumer, its bell.
func (c Config) homeSubjects() string { return c.SubjectPrefix + "_home.*.*" }
func (c Config) homeSubject(worker, tenant string) string {
	return c.SubjectPrefix + "_home." + token(worker) + "." + tenant
}
func (c Config) homeFilter(worker string) string {
	return c.SubjectPrefix + "_home." + token(worker) + ".*"
}
func (c Config) homeConsumerPrefix() string        { return c.Consumer + "_home_" }
func (c Config) homeConsumer(worker string) string { return c.homeConsumerPrefix() + token(worker) }
func (c Config) homeBell(worker string) string {
	return c.SubjectPrefix + "_home_ready." + token(worker)
}
func (c Config) auditSubject(tenant string) string {
	return c.SubjectPrefix + "_audit." + tenant
}

// reconcilerConsumer is the durable consumer of the advisories stream that every dispatcher shares.
const reconcilerConsumer = "reconciler"

// LaneOf is the lane of a tenant's calls among lanes: a hash of its name.
func LaneOf(tenant string, lanes int) int {
	h := fnv.New32a()
	h.Write([]byte(tenant))
	return int(h.Sum32() % uint32(lanes))
}

// Close stops the background work and closes the connection. It is idempotent.
func (c *Conn) Close() {
	c.closeOnce.Do(func() {
		c.stop()
		c.bg.Wait()
		c.nc.Close()
	})
}

// AckWait is the ack wait of the workers' consumers: how often a running call must be heartbeated.
func (c *Conn) AckWait() time.Duration { return c.cfg.AckWait }

// MaxDeliver is how often the queue delivers one call at most.
func (c *Conn) MaxDeliver() int { return c.cfg.MaxDeliver }

// MaxMessage is the largest queue message the server accepts, in bytes.
func (c *Conn) MaxMessage() int64 { return c.nc.MaxPayload() }

// Ready reports whether the connection is up.
func (c *Conn) Ready(ctx context.Context) error {
	if !c.nc.IsConnected() {
		return fmt.Errorf("check nats: %s", c.nc.Status())
	}
	if _, err := c.js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("check jetstream: %w", err)
	}
	return nil
}

// isWrongSequence reports a failed compare-and-set. A single server answers 10071; a replicated stream
// answers 10164 for the same conflict.
func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// readBackAnswered reports whether the read of a key that follows a refused compare-and-set answered,
// with the key's entry or with its absence (gerr is that read's error). Only then is the refusal known
// not to be of the caller's own earlier write, applied but its reply lost: a read that failed (a slow
// server, the caller's deadline spent by the write) leaves the outcome unknown, which is not a conflict.
func readBackAnswered(gerr error) bool {
	return gerr == nil || errors.Is(gerr, jetstream.ErrKeyNotFound) || errors.Is(gerr, jetstream.ErrKeyDeleted)
}
