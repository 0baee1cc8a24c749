// Package jetstream implements internal/queue on NATS JetStream, and is the only package that imports
// nats.go. Calls go through a durable work-queue stream, one subject per tenant; each call's state lives in
// a key-value bucket under its id and moves by compare-and-set.
package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Config configures a connection and the stream and bucket it uses.
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
	// AckWait is how long a worker may go without a heartbeat before its call is redelivered.
	AckWait time.Duration `yaml:"ack_wait"`
	// MaxDeliver bounds redeliveries of one call.
	MaxDeliver int `yaml:"max_deliver"`
	// MaxAge and MaxBytes bound the queue; a call older than MaxAge is dropped from it unrun.
	MaxAge   time.Duration `yaml:"max_age"`
	MaxBytes int64         `yaml:"max_bytes"`
	// MaxPendingPerTenant bounds one tenant's calls in the queue (waiting or running); the server refuses
	// more, and Publish returns queue.ErrTenantFull.
	MaxPendingPerTenant int64 `yaml:"max_pending_per_tenant"`
	// ResultTTL is how long call records are kept.
	ResultTTL time.Duration `yaml:"result_ttl"`
	// Replicas is the stream and bucket replication factor (3 on a clustered NATS).
	Replicas int `yaml:"replicas"`
	// Provision makes Connect create or update the streams and the bucket with this Config. The dispatcher
	// provisions; workers only bind to what exists, so that their defaults never overwrite the
	// operator's limits.
	Provision bool `yaml:"-"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Name: "toolpool", Stream: "TOOLPOOL_CALLS", SubjectPrefix: "toolpool.calls", Bucket: "toolpool_calls",
		Consumer: "workers", AckWait: 30 * time.Second, MaxDeliver: 10, MaxAge: 24 * time.Hour,
		MaxBytes: 1 << 30, MaxPendingPerTenant: 1000, ResultTTL: 7 * 24 * time.Hour, Replicas: 1,
	}
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	switch {
	case c.URL == "":
		return errors.New("nats url is empty")
	case c.AckWait < time.Second:
		return fmt.Errorf("ack wait %s is below 1s", c.AckWait)
	case c.MaxDeliver < 1:
		return fmt.Errorf("max deliver %d is below 1", c.MaxDeliver)
	case c.MaxPendingPerTenant < 1:
		return fmt.Errorf("max pending per tenant %d is below 1", c.MaxPendingPerTenant)
	case c.Replicas < 1 || c.Replicas > 5:
		return fmt.Errorf("replicas %d is outside 1..5", c.Replicas)
	}
	return nil
}

// Conn is a connection to JetStream with the calls stream and the records bucket. Safe for concurrent use.
type Conn struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream
	kv  jetstream.KeyValue

	watchOnce sync.Once
	watchErr  error
	mu        sync.Mutex
	waiters   map[string]map[chan *call.Result]struct{}
	closeOnce sync.Once
	stopWatch context.CancelFunc
}

// Connect connects to NATS and creates or updates the stream, the workers' consumer and the bucket. The
// caller must Close the Conn.
func Connect(ctx context.Context, cfg Config) (_ *Conn, retErr error) {
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
	var kv jetstream.KeyValue
	if cfg.Provision {
		kv, err = provision(ctx, js, cfg)
	} else {
		kv, err = bind(ctx, js, &cfg)
	}
	if err != nil {
		return nil, err
	}
	return &Conn{cfg: cfg, nc: nc, js: js, kv: kv, waiters: map[string]map[chan *call.Result]struct{}{}}, nil
}

// provision creates or updates the calls stream, the advisories stream and the records bucket.
func provision(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.KeyValue, error) {
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "toolpool calls waiting for a worker",
		Subjects:    []string{cfg.SubjectPrefix + ".*"},
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
		// Workers create the per-tenant consumers; they read these so that the dispatcher's config is
		// the one source of the delivery settings.
		Metadata: map[string]string{metaAckWait: cfg.AckWait.String(), metaMaxDeliver: strconv.Itoa(cfg.MaxDeliver)},
	})
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", cfg.Stream, err)
	}
	// Max-deliveries advisories are plain NATS messages, lost when nobody listens: keep them in a stream.
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.Stream + "_ADVISORIES",
		Description: "toolpool calls that exhausted their deliveries",
		Subjects:    []string{"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + cfg.Stream + ".>"},
		Storage:     jetstream.FileStorage,
		MaxAge:      7 * 24 * time.Hour,
		MaxMsgs:     100000,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("create advisories stream: %w", err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "toolpool call records by id",
		History:     1,
		TTL:         cfg.ResultTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("create bucket %s: %w", cfg.Bucket, err)
	}
	if err := provisionState(ctx, js, cfg); err != nil {
		return nil, err
	}
	return kv, nil
}

// Stream metadata keys that carry the consumers' delivery settings from the dispatcher to the workers.
const (
	metaAckWait    = "toolpool.ack_wait"
	metaMaxDeliver = "toolpool.max_deliver"
)

// bind looks up the stream and bucket a dispatcher provisioned, and takes the delivery settings from the
// stream's metadata into cfg.
func bind(ctx context.Context, js jetstream.JetStream, cfg *Config) (jetstream.KeyValue, error) {
	s, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("find stream %s (is a dispatcher up on this NATS?): %w", cfg.Stream, err)
	}
	meta := s.CachedInfo().Config.Metadata
	if d, err := time.ParseDuration(meta[metaAckWait]); err == nil && d > 0 {
		cfg.AckWait = d
	}
	if n, err := strconv.Atoi(meta[metaMaxDeliver]); err == nil && n > 0 {
		cfg.MaxDeliver = n
	}
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("find bucket %s (is a dispatcher up on this NATS?): %w", cfg.Bucket, err)
	}
	return kv, nil
}

// Close drains nothing and closes the connection. It is idempotent.
func (c *Conn) Close() {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		if c.stopWatch != nil {
			c.stopWatch()
		}
		c.mu.Unlock()
		c.nc.Close()
	})
}

// AckWait is the ack wait of the workers' consumers: how often a running call must be heartbeated.
func (c *Conn) AckWait() time.Duration { return c.cfg.AckWait }

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

// Publish enqueues a call on its tenant's subject. The call id is the message id, so a publish retried
// within the duplicate window is stored once.
func (c *Conn) Publish(ctx context.Context, cl *call.Call) error {
	data, err := json.Marshal(cl)
	if err != nil {
		return fmt.Errorf("encode call %s: %w", cl.ID, err)
	}
	msg := nats.NewMsg(c.cfg.SubjectPrefix + "." + cl.Tenant)
	msg.Data = data
	msg.Header.Set(jetstream.MsgIDHeader, cl.ID)
	if cl.TraceParent != "" {
		msg.Header.Set("traceparent", cl.TraceParent)
	}
	if _, err := c.js.PublishMsg(ctx, msg); err != nil {
		if strings.Contains(err.Error(), "maximum messages per subject exceeded") {
			return fmt.Errorf("publish call %s: %w", cl.ID, queue.ErrTenantFull)
		}
		return fmt.Errorf("publish call %s: %w", cl.ID, err)
	}
	return nil
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
	if errors.Is(err, jetstream.ErrKeyNotFound) {
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

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// Wait returns the call's record once done(record) is true, or the latest record when ctx ends (with ctx's
// error). It watches the bucket through one shared watcher, so a waiting request costs no server state.
func (c *Conn) Wait(ctx context.Context, id string, done func(*call.Result) bool) (*call.Result, error) {
	if err := c.startWatch(); err != nil {
		return nil, err
	}
	ch := make(chan *call.Result, 8)
	c.mu.Lock()
	if c.waiters[id] == nil {
		c.waiters[id] = map[chan *call.Result]struct{}{}
	}
	c.waiters[id][ch] = struct{}{}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.waiters[id], ch)
		if len(c.waiters[id]) == 0 {
			delete(c.waiters, id)
		}
		c.mu.Unlock()
	}()
	// Read after registering, so that an update between the two is not missed.
	rec, err := c.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	latest := rec.Result
	// A slow waiter may miss updates its full channel could not take; poll as a backstop.
	poll := time.NewTicker(2 * time.Second)
	defer poll.Stop()
	for !done(latest) {
		select {
		case r := <-ch:
			latest = r
		case <-poll.C:
			if rec, err := c.Get(ctx, id); err == nil {
				latest = rec.Result
			}
		case <-ctx.Done():
			return latest, ctx.Err()
		}
	}
	return latest, nil
}

func (c *Conn) startWatch() error {
	c.watchOnce.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		w, err := c.kv.WatchAll(ctx, jetstream.UpdatesOnly(), jetstream.IgnoreDeletes())
		if err != nil {
			cancel()
			c.watchErr = fmt.Errorf("watch bucket %s: %w", c.cfg.Bucket, err)
			return
		}
		c.mu.Lock()
		c.stopWatch = cancel
		c.mu.Unlock()
		go c.fanOut(w)
	})
	return c.watchErr
}

func (c *Conn) fanOut(w jetstream.KeyWatcher) {
	defer w.Stop()
	for e := range w.Updates() {
		if e == nil {
			continue
		}
		c.mu.Lock()
		chans := c.waiters[e.Key()]
		if len(chans) == 0 {
			c.mu.Unlock()
			continue
		}
		var r call.Result
		if err := json.Unmarshal(e.Value(), &r); err != nil {
			c.mu.Unlock()
			continue
		}
		for ch := range chans {
			select {
			case ch <- &r:
			default: // the waiter's poll catches up
			}
		}
		c.mu.Unlock()
	}
}

// Consume pulls calls and runs handle for each in its own goroutine, never more than slots at once. It
// fetches one call per free slot, so that no buffered message ages toward its ack wait, and it takes turns
// among the tenants that have calls waiting, so that one tenant's flood does not starve the others: each
// tenant has its own subject and durable consumer. A subscription to the calls' subjects wakes an idle
// loop as soon as a call is published. Consume returns when ctx ends, after every handle it started has
// returned; handle gets ctx too and must settle its Delivery.
func (c *Conn) Consume(ctx context.Context, slots int, handle func(context.Context, queue.Delivery)) error {
	return c.ConsumeWith(ctx, ctx, slots, handle)
}

// ConsumeWith is Consume with separate contexts: fetching stops when fetchCtx ends, while the handlers run
// on runCtx, so that a draining worker finishes its calls (cancel runCtx after a grace period to stop
// them). It returns once fetching stopped and every handler returned.
func (c *Conn) ConsumeWith(fetchCtx, runCtx context.Context, slots int, handle func(context.Context, queue.Delivery)) error {
	bell := make(chan struct{}, 1)
	sub, err := c.nc.Subscribe(c.cfg.SubjectPrefix+".*", func(*nats.Msg) {
		select {
		case bell <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe to call subjects: %w", err)
	}
	defer sub.Unsubscribe()

	free := make(chan struct{}, slots)
	for range slots {
		free <- struct{}{}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	f := &fairFetcher{conn: c, consumers: map[string]jetstream.Consumer{}}
	for {
		select {
		case <-fetchCtx.Done():
			return nil
		case <-free:
		}
		msg, err := f.next(fetchCtx)
		if msg == nil {
			free <- struct{}{}
			if err != nil && fetchCtx.Err() == nil {
				// The server is unreachable or restarting: back off briefly.
				select {
				case <-fetchCtx.Done():
				case <-time.After(250 * time.Millisecond):
				}
				continue
			}
			// Nothing waiting: sleep until a publish rings, or poll again in a while (redeliveries ring no
			// bell).
			select {
			case <-fetchCtx.Done():
			case <-bell:
			case <-time.After(time.Second):
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { free <- struct{}{} }()
			handle(runCtx, delivery{msg})
		}()
	}
}

// consumerInactiveThreshold is how long a tenant's consumer lives without fetches.
const consumerInactiveThreshold = 24 * time.Hour

// fairFetcher takes one message at a time, round-robin over the tenants with messages in the stream.
type fairFetcher struct {
	conn      *Conn
	consumers map[string]jetstream.Consumer // by tenant
	tenants   []string                      // tenants with messages, as last read
	turn      int
}

// next returns the next message in tenant rotation, or nil when no tenant has one ready.
func (f *fairFetcher) next(ctx context.Context) (jetstream.Msg, error) {
	if f.turn >= len(f.tenants) {
		if err := f.refresh(ctx); err != nil {
			return nil, err
		}
		f.turn = 0
	}
	for f.turn < len(f.tenants) {
		tenant := f.tenants[f.turn]
		f.turn++
		cons, err := f.consumer(ctx, tenant)
		if err != nil {
			return nil, err
		}
		batch, err := cons.FetchNoWait(1)
		if err != nil {
			delete(f.consumers, tenant) // the server may have removed it as inactive: make it again next time
			return nil, fmt.Errorf("fetch call of tenant %s: %w", tenant, err)
		}
		for msg := range batch.Messages() {
			return msg, nil
		}
	}
	return nil, nil
}

// refresh reads which tenants have messages in the stream, in a stable order.
func (f *fairFetcher) refresh(ctx context.Context) error {
	s, err := f.conn.js.Stream(ctx, f.conn.cfg.Stream)
	if err != nil {
		return fmt.Errorf("get stream %s: %w", f.conn.cfg.Stream, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(f.conn.cfg.SubjectPrefix+".*"))
	if err != nil {
		return fmt.Errorf("read stream %s: %w", f.conn.cfg.Stream, err)
	}
	f.tenants = f.tenants[:0]
	for subj := range info.State.Subjects {
		f.tenants = append(f.tenants, strings.TrimPrefix(subj, f.conn.cfg.SubjectPrefix+"."))
	}
	slices.Sort(f.tenants)
	return nil
}

// consumer returns the tenant's durable consumer, creating it on first use.
func (f *fairFetcher) consumer(ctx context.Context, tenant string) (jetstream.Consumer, error) {
	if cons, ok := f.consumers[tenant]; ok {
		return cons, nil
	}
	cfg := f.conn.cfg
	cons, err := f.conn.js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{
		Durable:       cfg.Consumer + "_" + tenant,
		Description:   "toolpool workers, tenant " + tenant,
		FilterSubject: cfg.SubjectPrefix + "." + tenant,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    cfg.MaxDeliver,
		MaxAckPending: -1,
		Replicas:      cfg.Replicas,
		// A tenant that goes quiet does not keep a consumer forever; its next call makes a new one.
		InactiveThreshold: consumerInactiveThreshold,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer for tenant %s: %w", tenant, err)
	}
	f.consumers[tenant] = cons
	return cons, nil
}

type delivery struct{ msg jetstream.Msg }

func (d delivery) Call() (*call.Call, error) {
	var c call.Call
	if err := json.Unmarshal(d.msg.Data(), &c); err != nil {
		return nil, fmt.Errorf("decode call: %w", err)
	}
	if tp := d.msg.Headers().Get("traceparent"); tp != "" && c.TraceParent == "" {
		c.TraceParent = tp
	}
	return &c, nil
}

func (d delivery) Attempt() uint64 {
	md, err := d.msg.Metadata()
	if err != nil {
		return 1
	}
	return md.NumDelivered
}

func (d delivery) InProgress(ctx context.Context) error { return d.msg.InProgress() }
func (d delivery) Ack(ctx context.Context) error        { return d.msg.DoubleAck(ctx) }
func (d delivery) Nak(ctx context.Context, delay time.Duration) error {
	return d.msg.NakWithDelay(delay)
}
func (d delivery) Term(ctx context.Context, reason string) error { return d.msg.TermWithReason(reason) }

// QueueState is the number of calls waiting for a worker (delivered and running calls not counted) and
// the age of the oldest of them.
type QueueState struct {
	Pending   uint64
	OldestAge time.Duration
}

// State reads the queue's depth and the age of its oldest waiting call from JetStream: per tenant, the
// undelivered count of its consumer (or every message, when no worker made the consumer yet) and the
// first message past what the consumer delivered. It costs a few API calls per tenant with calls.
func (c *Conn) State(ctx context.Context) (QueueState, error) {
	s, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return QueueState{}, fmt.Errorf("get stream %s: %w", c.cfg.Stream, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(c.cfg.SubjectPrefix+".*"))
	if err != nil {
		return QueueState{}, fmt.Errorf("read stream %s: %w", c.cfg.Stream, err)
	}
	consumers := map[string]*jetstream.ConsumerInfo{}
	lister := s.ListConsumers(ctx)
	for ci := range lister.Info() {
		if ci.Config.FilterSubject != "" {
			consumers[ci.Config.FilterSubject] = ci
		}
	}
	if err := lister.Err(); err != nil {
		return QueueState{}, fmt.Errorf("list consumers: %w", err)
	}
	var st QueueState
	now := time.Now()
	for subj, count := range info.State.Subjects {
		pending, from := count, uint64(1)
		if ci, ok := consumers[subj]; ok {
			pending, from = ci.NumPending, ci.Delivered.Stream+1
		}
		if pending == 0 {
			continue
		}
		st.Pending += pending
		if msg, err := s.GetMsg(ctx, from, jetstream.WithGetMsgSubject(subj)); err == nil {
			st.OldestAge = max(st.OldestAge, now.Sub(msg.Time))
		}
	}
	return st, nil
}
