package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolpool/toolpool/internal/call"
	"github.com/toolpool/toolpool/internal/queue"
)

// Approvals is the calls parked for approval: one key per call, "<tenant>.<id>", in the approvals
// bucket, kept ResultTTL. It implements queue.Approvals. Safe for concurrent use; it lives as long as its
// Conn.
type Approvals struct{ *session }

var _ queue.Approvals = (*Approvals)(nil)

func (c *Approvals) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := c.js.KeyValue(ctx, c.cfg.approvalsBucket())
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", c.cfg.approvalsBucket(), err)
	}
	return kv, nil
}

// PutPending parks a call for approval.
func (c *Approvals) PutPending(ctx context.Context, p *call.Pending) error {
	kv, err := c.bucket(ctx)
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
func (c *Approvals) GetPending(ctx context.Context, tenant, id string) (*call.Pending, error) {
	kv, err := c.bucket(ctx)
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
func (c *Approvals) ListPending(ctx context.Context, tenant string) ([]*call.Pending, error) {
	kv, err := c.bucket(ctx)
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
func (c *Approvals) DeletePending(ctx context.Context, tenant, id string) error {
	kv, err := c.bucket(ctx)
	if err != nil {
		return err
	}
	if err := kv.Purge(ctx, tenant+"."+id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("remove pending call %s: %w", id, err)
	}
	return nil
}
