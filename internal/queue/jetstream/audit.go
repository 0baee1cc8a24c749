package jetstream

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Audit is the audit log: a stream with one subject per tenant, kept 90 days. It implements queue.Audit.
// Safe for concurrent use; it lives as long as its Conn.
type Audit struct{ *session }

var _ queue.Audit = (*Audit)(nil)

// Audit appends an event to the tenant's audit log.
func (c *Audit) Audit(ctx context.Context, ev call.AuditEvent) error {
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
func (c *Audit) ReadAudit(ctx context.Context, tenant string, since time.Time, limit int) ([]call.AuditEvent, error) {
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
