package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

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
		// PREFIX.<lane>.<tenant>, and the workers' own queues, PREFIX_home.<worker>.<tenant> (routed.go).
		Subjects:  []string{cfg.SubjectPrefix + ".*.*", cfg.homeSubjects()},
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
		MaxAge:    cfg.MaxAge,
		MaxBytes:  cfg.MaxBytes,
		Discard:   jetstream.DiscardNew,
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
	if _, err := js.CreateOrUpdateStream(ctx, leaderReadBucket(cfg.Bucket, "toolpool call records by id", 1, cfg.ResultTTL, cfg.Replicas)); err != nil {
		return explainCreate("bucket "+cfg.Bucket, cfg.Replicas, err)
	}
	// Released and lapsed leases leave markers (a server-side TTL per key); nothing in this bucket needs to
	// live an hour.
	leases := leaderReadBucket(cfg.leaseBucket(), "toolpool leases of running calls, each with a server-side TTL", 1, time.Hour, cfg.Replicas)
	leases.AllowMsgTTL, leases.SubjectDeleteMarkerTTL = true, time.Hour
	if _, err := js.CreateOrUpdateStream(ctx, leases); err != nil {
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
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        cfg.liveStream(),
		Description: "toolpool output of running calls, for readers who join late (dropped when a call ends)",
		Subjects:    []string{cfg.SubjectPrefix + "_output.*"}, // PREFIX_output.<call id>
		Storage:     jetstream.FileStorage,
		MaxBytes:    cfg.LiveMaxBytes,
		MaxAge:      cfg.LiveMaxAge,
		Discard:     jetstream.DiscardOld,
		Replicas:    cfg.Replicas,
	}); err != nil {
		return explainCreate("stream "+cfg.liveStream(), cfg.Replicas, err)
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

// provisionState creates the approvals and state buckets and the audit stream.
func provisionState(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	if _, err := js.CreateOrUpdateStream(ctx, leaderReadBucket(cfg.approvalsBucket(), "toolpool calls waiting for approval, by tenant.id", 1, cfg.ResultTTL, cfg.Replicas)); err != nil {
		return fmt.Errorf("create bucket %s: %w", cfg.approvalsBucket(), err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, leaderReadBucket(cfg.stateBucket(), "toolpool shared state (approve-always rules)", 5, 0, cfg.Replicas)); err != nil {
		return fmt.Errorf("create bucket %s: %w", cfg.stateBucket(), err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: cfg.auditStream(), Description: "toolpool audit log: every decision and every outcome",
		Subjects: []string{cfg.SubjectPrefix + "_audit.*"}, Storage: jetstream.FileStorage,
		MaxAge: 90 * 24 * time.Hour, MaxBytes: 4 << 30, Discard: jetstream.DiscardOld, Replicas: cfg.Replicas,
	}); err != nil {
		return fmt.Errorf("create stream %s: %w", cfg.auditStream(), err)
	}
	return nil
}

// leaderReadBucket is the stream of a key-value bucket as nats.go's CreateKeyValue makes it (history
// revisions per key, ttl for every key, 0 for none), with one difference: direct gets are off, so every
// read is answered by the stream's leader. A direct get may be answered by any replica, and a replica that
// has just restarted answers "not found" or an old revision until it catches up: a dispatcher then told a
// client that an accepted call does not exist, or that a call waiting for approval waits for nothing, and
// a judge reading "no lease" would call a running call lost. Every bucket of toolpool holds state that a
// reader must see as written, so every bucket is made this way; a bucket made by an earlier version with
// direct gets on is updated in place.
func leaderReadBucket(bucket, description string, history int64, ttl time.Duration, replicas int) jetstream.StreamConfig {
	duplicates := 2 * time.Minute
	if ttl > 0 && ttl < duplicates {
		duplicates = ttl
	}
	return jetstream.StreamConfig{
		Name:              "KV_" + bucket,
		Description:       description,
		Subjects:          []string{"$KV." + bucket + ".>"},
		MaxMsgsPerSubject: history,
		MaxBytes:          -1,
		MaxMsgSize:        -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		MaxAge:            ttl,
		Storage:           jetstream.FileStorage,
		Replicas:          replicas,
		AllowRollup:       true,
		DenyDelete:        true,
		Duplicates:        duplicates,
		Discard:           jetstream.DiscardNew,
		AllowDirect:       false,
	}
}
