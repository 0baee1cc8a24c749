package jetstream

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Heads is the workspaces' checkpoint heads (internal/checkpoint's Heads): the key-value bucket
// <bucket>_heads, one key per workspace (<tenant>.<workspace>, each base64url-encoded), one revision kept,
// no TTL, read from the stream's leader. A head is written only by compare-and-set on the revision its
// writer read, so that a worker whose copy is older than the latest checkpoint never replaces it. It is
// in NATS whichever object store holds the chunks and trees (JetStream's or S3): S3 has no
// compare-and-set that every S3-compatible server offers. Safe for concurrent use; it lives as long as its
// Conn.
type Heads struct {
	*session
	kv jetstream.KeyValue
}

// headsState is the Conn's lazily opened heads bucket.
type headsState struct {
	headsOnce sync.Once
	heads     *Heads
	headsErr  error
}

// Heads opens the heads bucket, creating it if it is missing (the first worker that keeps checkpoints
// makes it, with the replicas of the calls stream).
func (c *Conn) Heads(ctx context.Context) (*Heads, error) {
	c.headsOnce.Do(func() {
		c.headsErr = whileClusterForms(ctx, provisionWait, func() (err error) {
			c.heads, err = openHeads(ctx, c.session)
			return err
		})
	})
	return c.heads, c.headsErr
}

func openHeads(ctx context.Context, s *session) (*Heads, error) {
	bucket := s.cfg.headsBucket()
	kv, err := s.js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		_, err = s.js.CreateStream(ctx, leaderReadBucket(bucket, "toolpool workspace checkpoint heads, by tenant.workspace", 1, 0, s.cfg.Replicas))
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			err = nil // another worker made it meanwhile
		}
		if err != nil {
			return nil, explainCreate("bucket "+bucket, s.cfg.Replicas, err)
		}
		kv, err = s.js.KeyValue(ctx, bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	return &Heads{session: s, kv: kv}, nil
}

func headKey(tenant, workspace string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(tenant)) + "." + base64.RawURLEncoding.EncodeToString([]byte(workspace))
}

// GetHead returns tenant's workspace's head and its revision; nil and 0 when it has none.
func (h *Heads) GetHead(ctx context.Context, tenant, workspace string) ([]byte, uint64, error) {
	e, err := h.kv.Get(ctx, headKey(tenant, workspace))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return nil, 0, nil
	case err != nil:
		return nil, 0, fmt.Errorf("read checkpoint head of %s/%s: %w", tenant, workspace, err)
	}
	return e.Value(), e.Revision(), nil
}

// SwapHead stores value as tenant's workspace's head if the head is still at revision rev (0: it has
// none), and returns the new revision; swapped is false, and nothing is written, when the head moved on
// since rev. A write retried after its reply was lost, which finds its own value, counts as swapped.
func (h *Heads) SwapHead(ctx context.Context, tenant, workspace string, value []byte, rev uint64) (uint64, bool, error) {
	key := headKey(tenant, workspace)
	var (
		newRev uint64
		err    error
	)
	if rev == 0 {
		newRev, err = h.kv.Create(ctx, key, value)
	} else {
		newRev, err = h.kv.Update(ctx, key, value, rev)
	}
	if err == nil {
		return newRev, true, nil
	}
	if e, gerr := h.kv.Get(ctx, key); gerr == nil && bytes.Equal(e.Value(), value) && e.Revision() != rev {
		return e.Revision(), true, nil // our own write, whose reply was lost
	}
	if errors.Is(err, jetstream.ErrKeyExists) || isWrongSequence(err) {
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("write checkpoint head of %s/%s: %w", tenant, workspace, err)
}

// TenantHeads returns every head of tenant's workspaces, by workspace name (none: an empty map). It reads
// them through one watch of the tenant's keys, from the stream's leader.
func (h *Heads) TenantHeads(ctx context.Context, tenant string) (map[string][]byte, error) {
	w, err := h.kv.WatchFiltered(ctx, []string{base64.RawURLEncoding.EncodeToString([]byte(tenant)) + ".*"}, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read checkpoint heads of tenant %s: %w", tenant, err)
	}
	defer w.Stop()
	heads := map[string][]byte{}
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("read checkpoint heads of tenant %s: the watch ended", tenant)
			}
			if e == nil {
				return heads, nil // every current head delivered
			}
			_, enc, _ := strings.Cut(e.Key(), ".")
			name, err := base64.RawURLEncoding.DecodeString(enc)
			if err != nil {
				return nil, fmt.Errorf("read checkpoint heads of tenant %s: key %q: %w", tenant, e.Key(), err)
			}
			heads[string(name)] = e.Value()
		case <-ctx.Done():
			return nil, fmt.Errorf("read checkpoint heads of tenant %s: %w", tenant, ctx.Err())
		}
	}
}
