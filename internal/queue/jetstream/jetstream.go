// Package jetstream implements internal/queue on NATS JetStream, and is the only package that imports
// nats.go. Calls go through a durable work-queue stream, one subject per tenant, spread over a fixed set
// of lanes (one durable consumer each); each call's state lives in a key-value bucket under its id and
// moves by compare-and-set; leases of running calls are keys with a server-side TTL; outputs too large for
// a record live in an object store.
package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
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

// Conn is a connection to JetStream with the calls stream and the records bucket. Safe for concurrent use.
type Conn struct {
	cfg    Config
	nc     *nats.Conn
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	leases jetstream.KeyValue
	outs   jetstream.ObjectStore
	clock  clock
	live   liveTopics

	closeOnce sync.Once
	stop      context.CancelFunc
	bg        sync.WaitGroup
}

// Connect connects to NATS and creates or updates (with Provision) or looks up the streams, consumers and
// buckets. The caller must Close the Conn.
func Connect(ctx context.Context, cfg Config, opts ...Option) (_ *Conn, retErr error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("validate nats config: %w", err)
	}
	nc, err := nats.Connect(cfg.URL, nats.Name(cfg.Name), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(false))
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
	c := &Conn{cfg: cfg, nc: nc, js: js, clock: clock{local: time.Now}}
	for _, o := range opts {
		o(c)
	}
	if c.kv, err = js.KeyValue(ctx, cfg.Bucket); err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", cfg.Bucket, err)
	}
	if c.leases, err = js.KeyValue(ctx, cfg.leaseBucket()); err != nil {
		return nil, fmt.Errorf("open bucket %s (a dispatcher of this version provisions it): %w", cfg.leaseBucket(), err)
	}
	if c.outs, err = js.ObjectStore(ctx, cfg.outputBucket()); err != nil {
		return nil, fmt.Errorf("open object store %s (a dispatcher of this version provisions it): %w", cfg.outputBucket(), err)
	}
	if err := c.syncClock(ctx); err != nil {
		return nil, err
	}
	bgCtx, stop := context.WithCancel(context.Background())
	c.stop = stop
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		c.keepClock(bgCtx)
	}()
	return c, nil
}

// Names of the objects derived from Config.Bucket and Config.Stream.
func (c Config) leaseBucket() string       { return c.Bucket + "_leases" }
func (c Config) outputBucket() string      { return c.Bucket + "_outputs" }
func (c Config) advisoryStream() string    { return c.Stream + "_ADVISORIES" }
func (c Config) laneConsumer(l int) string { return c.Consumer + "_lane" + strconv.Itoa(l) }
func (c Config) laneFilter(l int) string   { return c.SubjectPrefix + "." + strconv.Itoa(l) + ".*" }
func (c Config) bellSubject(l int) string  { return c.SubjectPrefix + "_ready." + strconv.Itoa(l) }

// reconcilerConsumer is the durable consumer of the advisories stream that every dispatcher shares.
const reconcilerConsumer = "reconciler"

// LaneOf is the lane of a tenant's calls among lanes: a hash of its name.
func LaneOf(tenant string, lanes int) int {
	h := fnv.New32a()
	h.Write([]byte(tenant))
	return int(h.Sum32() % uint32(lanes))
}

// Stream metadata keys that carry the delivery settings from the dispatcher to the workers.
const (
	metaAckWait    = "toolpool.ack_wait"
	metaMaxDeliver = "toolpool.max_deliver"
	metaLanes      = "toolpool.lanes"
)

// provision creates or updates the calls stream, its lane consumers, the advisories stream and its
// consumer, and the buckets. Every consumer takes its replicas from its stream as the server reports it.
func provision(ctx context.Context, js jetstream.JetStream, cfg *Config) error {
	if old, err := js.Stream(ctx, cfg.Stream); err == nil {
		if n, err := strconv.Atoi(old.CachedInfo().Config.Metadata[metaLanes]); err == nil && n > cfg.Lanes {
			return fmt.Errorf("queue lanes %d is below the %d the stream %s has: lanes may only grow (calls queued in the higher lanes would never be served); set queue.lanes to %d or more",
				cfg.Lanes, n, cfg.Stream, n)
		}
	}
	calls, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "toolpool calls waiting for a worker",
		Subjects:    []string{cfg.SubjectPrefix + ".*.*"}, // PREFIX.<lane>.<tenant>
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		MaxAge:      cfg.MaxAge,
		MaxBytes:    cfg.MaxBytes,
		Discard:     jetstream.DiscardNew,
		// One subject per tenant: the per-subject cap is the tenant's quota of queued and running calls.
		MaxMsgsPerSubject:    cfg.MaxPendingPerTenant,
		DiscardNewPerSubject: true,
		Duplicates:           2 * time.Minute,
		Replicas:             cfg.Replicas,
		AllowDirect:          true,
		// Workers read these so that the dispatcher's config is the one source of the delivery settings.
		Metadata: map[string]string{metaAckWait: cfg.AckWait.String(), metaMaxDeliver: strconv.Itoa(cfg.MaxDeliver),
			metaLanes: strconv.Itoa(cfg.Lanes)},
	})
	if err != nil {
		return explainCreate("stream "+cfg.Stream, cfg.Replicas, err)
	}
	replicas := calls.CachedInfo().Config.Replicas
	for l := range cfg.Lanes {
		if _, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{
			Durable:       cfg.laneConsumer(l),
			Description:   fmt.Sprintf("toolpool workers, lane %d of %d", l, cfg.Lanes),
			FilterSubject: cfg.laneFilter(l),
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       cfg.AckWait,
			MaxDeliver:    cfg.MaxDeliver,
			MaxAckPending: -1,
			Replicas:      replicas,
		}); err != nil {
			return explainCreate("consumer "+cfg.laneConsumer(l), replicas, err)
		}
	}
	// Max-deliveries advisories are plain NATS messages, lost when nobody listens: keep them in a stream,
	// which the dispatchers' reconciler reads through one shared durable consumer.
	adv, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.advisoryStream(),
		Description: "toolpool calls that exhausted their deliveries",
		Subjects:    []string{"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + cfg.Stream + ".>"},
		Storage:     jetstream.FileStorage,
		MaxAge:      7 * 24 * time.Hour,
		MaxMsgs:     100000,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return explainCreate("stream "+cfg.advisoryStream(), cfg.Replicas, err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, cfg.advisoryStream(), jetstream.ConsumerConfig{
		Durable:     reconcilerConsumer,
		Description: "toolpool dispatchers settling calls whose deliveries ran out",
		AckPolicy:   jetstream.AckExplicitPolicy,
		AckWait:     time.Minute,
		MaxDeliver:  -1,
		Replicas:    adv.CachedInfo().Config.Replicas,
	}); err != nil {
		return explainCreate("consumer "+reconcilerConsumer, cfg.Replicas, err)
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "toolpool call records by id",
		History:     1,
		TTL:         cfg.ResultTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	}); err != nil {
		return explainCreate("bucket "+cfg.Bucket, cfg.Replicas, err)
	}
	// The leases bucket is a key-value bucket made by hand, to turn direct gets off: a direct get may be
	// answered by a replica that has not yet applied a lease, and a judge that reads "no lease" from it
	// would call a running call lost. Without direct gets every read goes to the stream's leader.
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:              "KV_" + cfg.leaseBucket(),
		Description:       "toolpool leases of running calls, each with a server-side TTL",
		Subjects:          []string{"$KV." + cfg.leaseBucket() + ".>"},
		MaxMsgsPerSubject: 1,
		MaxBytes:          -1,
		MaxMsgSize:        -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		// Released and lapsed leases leave markers; nothing in this bucket needs to live an hour.
		MaxAge:                 time.Hour,
		Storage:                jetstream.FileStorage,
		Replicas:               cfg.Replicas,
		AllowRollup:            true,
		DenyDelete:             true,
		Duplicates:             2 * time.Minute,
		Discard:                jetstream.DiscardNew,
		AllowMsgTTL:            true,
		SubjectDeleteMarkerTTL: time.Hour,
		AllowDirect:            false,
	}); err != nil {
		return explainCreate("bucket "+cfg.leaseBucket(), cfg.Replicas, err)
	}
	if _, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      cfg.outputBucket(),
		Description: "toolpool call outputs too large for a record",
		TTL:         cfg.ResultTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	}); err != nil {
		return explainCreate("object store "+cfg.outputBucket(), cfg.Replicas, err)
	}
	return provisionState(ctx, js, *cfg)
}

// provisionWait bounds how long Connect repeats a provision that a NATS cluster still forming refused.
const provisionWait = 30 * time.Second

// whileClusterForms runs try until it succeeds, fails for another reason than a cluster whose peers are
// still joining or electing (clusterForming), or wait or ctx runs out; it returns try's last error. On a
// fresh cluster, or one whose server just restarted, JetStream refuses to place a stream for a moment
// ("no suitable peers for placement, peer offline"), or does not answer at all while it has no meta
// leader (a request that times out). try must be safe to repeat: provision creates or updates.
func whileClusterForms(ctx context.Context, wait time.Duration, try func() error) error {
	deadline := time.Now().Add(wait)
	for pause := 100 * time.Millisecond; ; pause = min(2*pause, 2*time.Second) {
		err := try()
		if err == nil || ctx.Err() != nil || !clusterForming(err) || time.Now().Add(pause).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
	}
}

// clusterForming reports whether err is JetStream saying it cannot place or serve a stream for now: a
// peer offline (10005 with "peer offline"; without it, the cluster has too few servers for the
// replicas, which waiting does not change) or the JetStream system temporarily unavailable (10008).
func clusterForming(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
		return true // no answer: no meta leader yet (whileClusterForms stops when its own ctx ends)
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case 10005:
		return strings.Contains(apiErr.Description, "peer offline")
	case 10008:
		return true
	}
	return false
}

// explainCreate wraps a failure to create a JetStream object, saying what to change when the cause is a
// replication factor the servers cannot give.
func explainCreate(what string, replicas int, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case 10074 /* replicas > 1 not supported in non-clustered mode */, 10005 /* no suitable peers */, 10023 /* insufficient resources */ :
			return fmt.Errorf("create %s with %d replicas: %w (queue.replicas must not exceed the JetStream servers of the NATS cluster: set it to 1 for a single server, 3 for a 3-server cluster)", what, replicas, err)
		}
	}
	return fmt.Errorf("create %s: %w", what, err)
}

// bind looks up the stream a dispatcher provisioned, and takes the delivery settings and the replication
// factor from it into cfg.
func bind(ctx context.Context, js jetstream.JetStream, cfg *Config) error {
	s, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return fmt.Errorf("find stream %s (is a dispatcher up on this NATS?): %w", cfg.Stream, err)
	}
	info := s.CachedInfo()
	meta := info.Config.Metadata
	if d, err := time.ParseDuration(meta[metaAckWait]); err == nil && d > 0 {
		cfg.AckWait = d
	}
	if n, err := strconv.Atoi(meta[metaMaxDeliver]); err == nil && n > 0 {
		cfg.MaxDeliver = n
	}
	n, err := strconv.Atoi(meta[metaLanes])
	if err != nil || n < 1 {
		return fmt.Errorf("stream %s has no lanes in its metadata: it was made by an older dispatcher; start a dispatcher of this version first", cfg.Stream)
	}
	cfg.Lanes = n
	cfg.Replicas = info.Config.Replicas
	return nil
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

// subject is the calls subject of a tenant: PREFIX.<lane>.<tenant>.
func (c *Conn) subject(tenant string) (string, int) {
	l := LaneOf(tenant, c.cfg.Lanes)
	return c.cfg.SubjectPrefix + "." + strconv.Itoa(l) + "." + tenant, l
}

// Publish enqueues a call on its tenant's subject in its lane. The call id is the message id, so a publish
// retried within the duplicate window (2 minutes) is stored once. A call larger than the server's
// maximum message is refused with queue.ErrTooLarge, a tenant at its quota with queue.ErrTenantFull.
func (c *Conn) Publish(ctx context.Context, cl *call.Call) error {
	data, err := json.Marshal(cl)
	if err != nil {
		return fmt.Errorf("encode call %s: %w", cl.ID, err)
	}
	subject, lane := c.subject(cl.Tenant)
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set(jetstream.MsgIDHeader, cl.ID)
	if cl.TraceParent != "" {
		msg.Header.Set("traceparent", cl.TraceParent)
	}
	if size := int64(len(data) + 512); size > c.nc.MaxPayload() {
		return fmt.Errorf("publish call %s of %d bytes (the server takes %d): %w", cl.ID, len(data), c.nc.MaxPayload(), queue.ErrTooLarge)
	}
	if err := c.publish(ctx, msg); err != nil {
		if strings.Contains(err.Error(), "maximum messages per subject exceeded") {
			return fmt.Errorf("publish call %s: %w", cl.ID, queue.ErrTenantFull)
		}
		return fmt.Errorf("publish call %s: %w", cl.ID, err)
	}
	// Wake idle workers of this lane: an empty core message, lost harmlessly when nobody listens.
	_ = c.nc.Publish(c.cfg.bellSubject(lane), nil)
	return nil
}

// publishRetryFor bounds how long a publish that got no answer is tried again: longer than a stream
// leader election (4 to 9 seconds), so that losing a server does not refuse calls for that long.
const publishRetryFor = 20 * time.Second

// publish stores msg in the calls stream, trying again while the server does not answer (a leader
// election, a reconnect). Trying again is safe: the message id makes the stream keep one copy. An answer
// that refuses the message is final.
func (c *Conn) publish(ctx context.Context, msg *nats.Msg) error {
	deadline := time.Now().Add(publishRetryFor)
	backoff := 250 * time.Millisecond
	for {
		_, err := c.js.PublishMsg(ctx, msg)
		var apiErr *jetstream.APIError
		if err == nil || errors.As(err, &apiErr) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// Create stores the first record of a call; queue.ErrExists if the id is taken.
func (c *Conn) Create(ctx context.Context, r *call.Result) (uint64, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("encode call %s: %w", r.ID, err)
	}
	rev, err := c.kv.Create(ctx, r.ID, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("create call %s: %w", r.ID, queue.ErrExists)
	}
	if err != nil {
		return 0, fmt.Errorf("create call %s: %w", r.ID, err)
	}
	return rev, nil
}

// Get reads a call's record; queue.ErrNotFound if there is none.
func (c *Conn) Get(ctx context.Context, id string) (queue.Record, error) {
	e, err := c.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return queue.Record{}, fmt.Errorf("get call %s: %w", id, queue.ErrNotFound)
	}
	if err != nil {
		return queue.Record{}, fmt.Errorf("get call %s: %w", id, err)
	}
	var r call.Result
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return queue.Record{}, fmt.Errorf("decode call %s: %w", id, err)
	}
	return queue.Record{Result: &r, Revision: e.Revision()}, nil
}

// Update replaces a call's record if it is still at revision rev; queue.ErrConflict otherwise.
func (c *Conn) Update(ctx context.Context, r *call.Result, rev uint64) (uint64, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("encode call %s: %w", r.ID, err)
	}
	next, err := c.kv.Update(ctx, r.ID, data, rev)
	if isWrongSequence(err) {
		return 0, fmt.Errorf("update call %s at revision %d: %w", r.ID, rev, queue.ErrConflict)
	}
	if err != nil {
		return 0, fmt.Errorf("update call %s: %w", r.ID, err)
	}
	return next, nil
}

// isWrongSequence reports a failed compare-and-set. A single server answers 10071; a replicated stream
// answers 10164 for the same conflict.
func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// waitRereads are the delays of Wait's first reads after its first; waitPoll spaces those that follow.
var waitRereads, waitPoll = []time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond, 500 * time.Millisecond}, 2 * time.Second

// Wait returns the call's record once done(record) is true, or the latest record when ctx ends (with ctx's
// error). It listens to the one key's updates with a core subscription (no server state beyond the
// interest) and reads the record again on each, so it costs nothing for other calls' updates.
//
// The server routes a published update to core subscribers before its stream stores it, so an update
// routed just before the subscription and stored just after the first read rings no bell. Wait reads
// again soon after it starts (waitRereads) to see such an update within milliseconds; later, a poll
// every waitPoll backs up notifications lost to a reconnect.
func (c *Conn) Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error) {
	bell := make(chan struct{}, 1)
	sub, err := c.nc.Subscribe("$KV."+c.cfg.Bucket+"."+id, func(*nats.Msg) {
		select {
		case bell <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, fmt.Errorf("watch call %s: %w", id, err)
	}
	defer sub.Unsubscribe()
	// Read after subscribing, so that an update between the two is not missed.
	rec, err := c.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	latest := rec.Result
	reread := time.NewTimer(waitRereads[0])
	defer reread.Stop()
	for n := 1; !done(latest); {
		select {
		case <-bell:
		case <-reread.C:
			next := waitPoll
			if n < len(waitRereads) {
				next = waitRereads[n]
				n++
			}
			reread.Reset(next)
		case <-ctx.Done():
			return latest, ctx.Err()
		}
		if rec, err := c.Get(ctx, id); err == nil {
			latest = rec.Result
		}
	}
	return latest, nil
}
