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
// since rev. A write retried after its reply was lost, which finds its own value, counts as swapped; a
// refusal whose head cannot be read back is an error (the outcome is unknown), never a false swapped.
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
	e, gerr := h.kv.Get(ctx, key)
	if gerr == nil && bytes.Equal(e.Value(), value) && e.Revision() != rev {
		return e.Revision(), true, nil // our own write, whose reply was lost
	}
	if (errors.Is(err, jetstream.ErrKeyExists) || isWrongSequence(err)) && readBackAnswered(gerr) {
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("write checkpoint head of %s/%s: %w", tenant, workspace, err)
}

// TenantHeads returns every head of tenant's workspaces, by workspace name (none: an empty map). It reads
// them through one watch of the tenant's keys, from the stream's leader.
func (h *Heads) TenantHeads(ctx context.Context, tenant string) (map[string][]byte, error) {
	heads := map[string][]byte{}
	err := h.watchKeys(ctx, base64.RawURLEncoding.EncodeToString([]byte(tenant))+".*", func(key string, value []byte) error {
		_, enc, _ := strings.Cut(key, ".")
		name, err := base64.RawURLEncoding.DecodeString(enc)
		if err != nil {
			return fmt.Errorf("key %q: %w", key, err)
		}
		heads[string(name)] = value
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read checkpoint heads of tenant %s: %w", tenant, err)
	}
	return heads, nil
}

// Tenants returns every tenant that has a head (a workspace's, deleted or not, or a snapshot's), each
// once, in no set order. It lists the bucket's keys, from the stream's leader.
func (h *Heads) Tenants(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	err := h.watchKeys(ctx, ">", func(key string, _ []byte) error {
		enc, _, _ := strings.Cut(key, ".")
		t, err := base64.RawURLEncoding.DecodeString(enc)
		if err != nil {
			return fmt.Errorf("key %q: %w", key, err)
		}
		if !seen[string(t)] {
			seen[string(t)] = true
			out = append(out, string(t))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the tenants of the checkpoint heads: %w", err)
	}
	return out, nil
}

// snapshotKey is the key of snapshot snap of tenant's workspace: a third token after the workspace's
// head key, so that TenantHeads (two tokens) never sees it.
func snapshotKey(tenant, workspace, snap string) string {
	return headKey(tenant, workspace) + "." + base64.RawURLEncoding.EncodeToString([]byte(snap))
}

// CreateSnapshot stores value as snapshot snap of tenant's workspace, unless the workspace has a snapshot
// of that name (created false, nothing written). A write retried after its reply was lost, which finds its
// own value, counts as created; a refusal whose snapshot cannot be read back is an error, never a false
// created.
func (h *Heads) CreateSnapshot(ctx context.Context, tenant, workspace, snap string, value []byte) (bool, error) {
	key := snapshotKey(tenant, workspace, snap)
	_, err := h.kv.Create(ctx, key, value)
	if err == nil {
		return true, nil
	}
	e, gerr := h.kv.Get(ctx, key)
	if gerr == nil && bytes.Equal(e.Value(), value) {
		return true, nil // our own write, whose reply was lost
	}
	if (errors.Is(err, jetstream.ErrKeyExists) || isWrongSequence(err)) && readBackAnswered(gerr) {
		return false, nil
	}
	return false, fmt.Errorf("write snapshot %s of %s/%s: %w", snap, tenant, workspace, err)
}

// Snapshots returns every snapshot of tenant's workspaces, by workspace and snapshot name (none: an empty
// map). It reads them through one watch of the tenant's snapshot keys, from the stream's leader.
func (h *Heads) Snapshots(ctx context.Context, tenant string) (map[string]map[string][]byte, error) {
	out := map[string]map[string][]byte{}
	err := h.watchKeys(ctx, base64.RawURLEncoding.EncodeToString([]byte(tenant))+".*.*", func(key string, value []byte) error {
		_, rest, _ := strings.Cut(key, ".")
		wenc, senc, _ := strings.Cut(rest, ".")
		ws, err := base64.RawURLEncoding.DecodeString(wenc)
		if err != nil {
			return fmt.Errorf("key %q: %w", key, err)
		}
		snap, err := base64.RawURLEncoding.DecodeString(senc)
		if err != nil {
			return fmt.Errorf("key %q: %w", key, err)
		}
		if out[string(ws)] == nil {
			out[string(ws)] = map[string][]byte{}
		}
		out[string(ws)][string(snap)] = value
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read snapshots of tenant %s: %w", tenant, err)
	}
	return out, nil
}

// DeleteSnapshots removes every snapshot of tenant's workspace (none is not an error).
func (h *Heads) DeleteSnapshots(ctx context.Context, tenant, workspace string) error {
	var keys []string
	err := h.watchKeys(ctx, headKey(tenant, workspace)+".*", func(key string, _ []byte) error {
		keys = append(keys, key)
		return nil
	})
	for _, k := range keys {
		if err != nil {
			break
		}
		err = h.kv.Purge(ctx, k)
	}
	if err != nil {
		return fmt.Errorf("delete snapshots of %s/%s: %w", tenant, workspace, err)
	}
	return nil
}

// watchKeys calls fn with every current key matching filter and its value, deleted keys left out.
func (h *Heads) watchKeys(ctx context.Context, filter string, fn func(key string, value []byte) error) error {
	w, err := h.kv.WatchFiltered(ctx, []string{filter}, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("the watch ended")
			}
			if e == nil {
				return nil // every current key delivered
			}
			if err := fn(e.Key(), e.Value()); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
