package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Names of the approvals bucket, the state bucket and the audit stream, derived from Config.Bucket and
// Config.Stream.
func (c Config) approvalsBucket() string { return c.Bucket + "_approvals" }
func (c Config) stateBucket() string     { return c.Bucket + "_state" }
func (c Config) auditStream() string     { return c.Stream + "_AUDIT" }
func (c Config) auditSubject(tenant string) string {
	return c.SubjectPrefix + "_audit." + tenant
}

// provisionState creates the approvals and state buckets and the audit stream.
func provisionState(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: cfg.approvalsBucket(), Description: "toolpool calls waiting for approval, by tenant.id",
		History: 1, TTL: cfg.ResultTTL, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
	}); err != nil {
		return fmt.Errorf("create bucket %s: %w", cfg.approvalsBucket(), err)
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: cfg.stateBucket(), Description: "toolpool shared state (approve-always rules)",
		History: 5, Storage: jetstream.FileStorage, Replicas: cfg.Replicas,
	}); err != nil {
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

func (c *Conn) approvals(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := c.js.KeyValue(ctx, c.cfg.approvalsBucket())
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", c.cfg.approvalsBucket(), err)
	}
	return kv, nil
}

// PutPending parks a call for approval.
func (c *Conn) PutPending(ctx context.Context, p *call.Pending) error {
	kv, err := c.approvals(ctx)
	if err != nil {
		return err
	}
	data, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encode pending call: %w", err)
	}
	if _, err := kv.Put(ctx, p.Call.Tenant+"."+p.Call.ID, data); err != nil {
		return fmt.Errorf("park call %s: %w", p.Call.ID, err)
	}
	return nil
}

// GetPending reads a parked call; queue.ErrNotFound if there is none.
func (c *Conn) GetPending(ctx context.Context, tenant, id string) (*call.Pending, error) {
	kv, err := c.approvals(ctx)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, tenant+"."+id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("get pending call %s: %w", id, queue.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get pending call %s: %w", id, err)
	}
	var p call.Pending
	if err := json.Unmarshal(e.Value(), &p); err != nil {
		return nil, fmt.Errorf("decode pending call %s: %w", id, err)
	}
	return &p, nil
}

// ListPending returns a tenant's parked calls.
func (c *Conn) ListPending(ctx context.Context, tenant string) ([]*call.Pending, error) {
	kv, err := c.approvals(ctx)
	if err != nil {
		return nil, err
	}
	lister, err := kv.ListKeysFiltered(ctx, tenant+".*")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("list pending calls: %w", err)
	}
	defer lister.Stop()
	var out []*call.Pending
	for key := range lister.Keys() {
		e, err := kv.Get(ctx, key)
		if err != nil {
			continue // removed meanwhile
		}
		var p call.Pending
		if json.Unmarshal(e.Value(), &p) == nil {
			out = append(out, &p)
		}
	}
	return out, nil
}

// DeletePending removes a parked call.
func (c *Conn) DeletePending(ctx context.Context, tenant, id string) error {
	kv, err := c.approvals(ctx)
	if err != nil {
		return err
	}
	if err := kv.Purge(ctx, tenant+"."+id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("remove pending call %s: %w", id, err)
	}
	return nil
}

// UpdateState changes a named blob of shared state by compare-and-set: it reads the current value (nil
// when there is none), stores what edit returns, and starts over when another writer changed the blob
// meanwhile, so that concurrent writers (every dispatcher replica) never lose each other's changes. An
// error from edit is returned as it is and nothing is stored.
func (c *Conn) UpdateState(ctx context.Context, key string, edit func(old []byte) ([]byte, error)) error {
	kv, err := c.js.KeyValue(ctx, c.cfg.stateBucket())
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", c.cfg.stateBucket(), err)
	}
	for attempt := 0; ; attempt++ {
		var old []byte
		var rev uint64
		e, err := kv.Get(ctx, key)
		switch {
		case err == nil:
			old, rev = e.Value(), e.Revision()
		case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
			if e != nil {
				rev = e.Revision()
			}
		default:
			return fmt.Errorf("read state %s: %w", key, err)
		}
		next, err := edit(old)
		if err != nil {
			return err
		}
		_, err = kv.Update(ctx, key, next, rev)
		if err == nil {
			return nil
		}
		if !isWrongSequence(err) || attempt >= 20 {
			return fmt.Errorf("update state %s: %w", key, err)
		}
	}
}

// WatchState calls onChange with the blob's current value (if any) and with every later value, until ctx
// ends. It returns once the watch is set up.
func (c *Conn) WatchState(ctx context.Context, key string, onChange func([]byte)) error {
	kv, err := c.js.KeyValue(ctx, c.cfg.stateBucket())
	if err != nil {
		return fmt.Errorf("open bucket %s: %w", c.cfg.stateBucket(), err)
	}
	w, err := kv.Watch(ctx, key, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("watch state %s: %w", key, err)
	}
	go func() {
		defer w.Stop()
		for e := range w.Updates() {
			if e != nil {
				onChange(e.Value())
			}
		}
	}()
	return nil
}

// Audit appends an event to the tenant's audit log.
func (c *Conn) Audit(ctx context.Context, ev call.AuditEvent) error {
	data, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode audit event: %w", err)
	}
	if _, err := c.js.Publish(ctx, c.cfg.auditSubject(ev.Tenant), data); err != nil {
		return fmt.Errorf("append audit event for call %s: %w", ev.CallID, err)
	}
	return nil
}

// ReadAudit returns up to limit of a tenant's audit events since the given time, oldest first.
func (c *Conn) ReadAudit(ctx context.Context, tenant string, since time.Time, limit int) ([]call.AuditEvent, error) {
	cons, err := c.js.OrderedConsumer(ctx, c.cfg.auditStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{c.cfg.auditSubject(tenant)},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &since,
	})
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	n := min(int(info.NumPending), limit)
	var out []call.AuditEvent
	for len(out) < n {
		batch, err := cons.Fetch(n-len(out), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return out, fmt.Errorf("read audit log: %w", err)
		}
		got := 0
		for msg := range batch.Messages() {
			got++
			var ev call.AuditEvent
			if json.Unmarshal(msg.Data(), &ev) == nil {
				out = append(out, ev)
			}
		}
		if got == 0 {
			break
		}
	}
	return out, nil
}
