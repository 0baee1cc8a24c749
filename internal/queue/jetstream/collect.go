package jetstream

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/toolpool/toolpool/internal/queue"
)

// AcquireCollect takes, for holder and ttl, the lease that lets one worker collect tenant's checkpoint
// garbage (internal/checkpoint's Collect): key collect.<tenant> (base64url) in the leases bucket, judged on
// the server's clock like a call's. Held for the whole period between two collections and never released,
// it makes the workers of a pool collect each tenant once per period between them. queue.ErrExists:
// another worker holds it. The leases bucket keeps nothing longer than an hour, so neither does this.
func (s *Leases) AcquireCollect(ctx context.Context, tenant, holder string, ttl time.Duration) (queue.Lease, error) {
	if strings.ContainsAny(holder, " \t\n") || holder == "" {
		return nil, fmt.Errorf("acquire collect lease of tenant %s: holder %q must be one word", tenant, holder)
	}
	l, err := s.AcquireLease(ctx, "collect."+base64.RawURLEncoding.EncodeToString([]byte(tenant)), holder, ttl)
	if err != nil {
		return nil, fmt.Errorf("acquire collect lease of tenant %s: %w", tenant, err)
	}
	return l, nil
}
