package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/toolpool/toolpool/internal/checkpoint"
	"github.com/toolpool/toolpool/internal/checkpoint/s3store"
	"github.com/toolpool/toolpool/internal/metrics"
	"github.com/toolpool/toolpool/internal/queue"
	"github.com/toolpool/toolpool/internal/queue/jetstream"
)

// checkpointsConfig keeps workspaces in object storage (docs/workspaces.md#workspaces-in-object-storage):
// the store, and how files are cut and moved.
type checkpointsConfig struct {
	// Store is none (the default: a workspace lives in workspaces_dir alone), jetstream (the object store
	// of the NATS server the worker uses) or s3 (the s3 section's bucket).
	Store      string `yaml:"store"`
	ChunkBytes int    `yaml:"chunk_bytes"`
	Parallel   int    `yaml:"parallel"`
	// PackFilesUnder: a checkpoint writes its new files under this many bytes into pack objects, not one
	// object each; 0: none.
	PackFilesUnder int64 `yaml:"pack_files_under"`
	// MaxWorkspaceBytes is the checkpoint budget of one workspace (bytes of its files), MaxTenantBytes a
	// tenant's (its workspaces' latest checkpoints together); 0: none.
	MaxWorkspaceBytes int64 `yaml:"max_workspace_bytes"`
	MaxTenantBytes    int64 `yaml:"max_tenant_bytes"`
	// GCEvery is how often the pool collects each tenant's checkpoint garbage (one worker per tenant and
	// period, under a lease); 0: only on demand (SIGUSR1). GCGrace is how long an object no head names is kept.
	GCEvery time.Duration `yaml:"gc_every"`
	GCGrace time.Duration `yaml:"gc_grace"`
	S3      s3Config      `yaml:"s3"`
}

// s3Config is s3store.Config as the file spells it. The keys default to the environment's
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION (a Kubernetes Secret), which the file overrides.
type s3Config struct {
	Endpoint        string `yaml:"endpoint"`
	Bucket          string `yaml:"bucket"`
	Region          string `yaml:"region"`
	Prefix          string `yaml:"prefix"`
	AccessKeyID     string `yaml:"access_key_id"`
	SecretAccessKey string `yaml:"secret_access_key"`
}

// The checkpoint stores.
const (
	checkpointsNone      = "none"
	checkpointsJetStream = "jetstream"
	checkpointsS3        = "s3"
)

func defaultCheckpoints() checkpointsConfig {
	return checkpointsConfig{
		Store: checkpointsNone, ChunkBytes: checkpoint.DefaultChunkBytes, Parallel: checkpoint.DefaultParallel,
		PackFilesUnder: checkpoint.DefaultPackFilesUnder,
		GCEvery:        time.Hour, GCGrace: checkpoint.DefaultGrace,
		S3: s3Config{AccessKeyID: os.Getenv("AWS_ACCESS_KEY_ID"), SecretAccessKey: os.Getenv("AWS_SECRET_ACCESS_KEY"),
			Region: os.Getenv("AWS_REGION")},
	}
}

// packFilesUnder is PackFilesUnder as checkpoint.Config spells it: there 0 is the default, and none is
// negative.
func (c *checkpointsConfig) packFilesUnder() int64 {
	if c.PackFilesUnder == 0 {
		return -1
	}
	return c.PackFilesUnder
}

func (c *checkpointsConfig) s3() s3store.Config {
	return s3store.Config{Endpoint: c.S3.Endpoint, Bucket: c.S3.Bucket, Region: c.S3.Region, Prefix: c.S3.Prefix,
		AccessKeyID: c.S3.AccessKeyID, SecretAccessKey: c.S3.SecretAccessKey}
}

// validate checks the section, each bad value with what to change.
func (c *checkpointsConfig) validate() error {
	var errs []error
	switch c.Store {
	case checkpointsNone, checkpointsJetStream:
	case checkpointsS3:
		// The keys are checked when the store is made (checkpointer): they may come from the environment
		// of the worker's pod, which a rendering of its config file does not have.
		s3 := c.s3()
		s3.AccessKeyID, s3.SecretAccessKey = "-", "-"
		if err := s3.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("checkpoints.s3: %w", err))
		}
	default:
		errs = append(errs, fmt.Errorf("checkpoints.store %q is none of none, jetstream or s3", c.Store))
	}
	if c.ChunkBytes < checkpoint.MinChunkBytes || c.ChunkBytes > checkpoint.MaxChunkBytes {
		errs = append(errs, fmt.Errorf("checkpoints.chunk_bytes %d is outside %d..%d (default %d)", c.ChunkBytes,
			checkpoint.MinChunkBytes, checkpoint.MaxChunkBytes, checkpoint.DefaultChunkBytes))
	}
	if c.PackFilesUnder < 0 || c.PackFilesUnder > checkpoint.PackBytes {
		errs = append(errs, fmt.Errorf("checkpoints.pack_files_under %d is outside 0..%d: files under this many bytes are packed (default %d), 0 packs none",
			c.PackFilesUnder, checkpoint.PackBytes, checkpoint.DefaultPackFilesUnder))
	}
	if c.MaxWorkspaceBytes < 0 {
		errs = append(errs, fmt.Errorf("checkpoints.max_workspace_bytes %d is negative: set the most bytes a workspace's checkpoint may hold, or 0 for no budget", c.MaxWorkspaceBytes))
	}
	if c.MaxTenantBytes < 0 {
		errs = append(errs, fmt.Errorf("checkpoints.max_tenant_bytes %d is negative: set the most bytes a tenant's checkpoints may hold together, or 0 for no budget", c.MaxTenantBytes))
	}
	if c.GCEvery < 0 || c.GCEvery > 0 && c.GCEvery < time.Minute {
		errs = append(errs, fmt.Errorf("checkpoints.gc_every %s must be at least 1m (default 1h), or 0 to collect only on demand (SIGUSR1)", c.GCEvery))
	}
	if c.GCGrace < checkpoint.MinGrace {
		errs = append(errs, fmt.Errorf("checkpoints.gc_grace %s is under %s: a checkpoint in progress could lose an object to garbage collection (default %s)", c.GCGrace, checkpoint.MinGrace, checkpoint.DefaultGrace))
	}
	if c.Parallel < 1 || c.Parallel > 256 {
		errs = append(errs, fmt.Errorf("checkpoints.parallel %d is outside 1..256 (default %d)", c.Parallel, checkpoint.DefaultParallel))
	}
	return errors.Join(errs...)
}

// checkpointer returns the worker's checkpointer on the configured store, reporting each save and restore
// to observe, or nil when workspaces are not kept in object storage. An S3 bucket that is missing or
// refuses the keys stops the worker at start.
func (c *config) checkpointer(ctx context.Context, conn *jetstream.Conn, observe func(string, checkpoint.Result, time.Duration, error)) (*checkpoint.Checkpointer, error) {
	var store checkpoint.Store
	switch c.Checkpoints.Store {
	case checkpointsJetStream:
		s, err := conn.Checkpoints(ctx)
		if err != nil {
			return nil, fmt.Errorf("checkpoints.store jetstream: %w", err)
		}
		store = s
	case checkpointsS3:
		s, err := s3store.New(c.Checkpoints.s3(), nil)
		if err != nil {
			return nil, fmt.Errorf("checkpoints.s3: %w (the keys may come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)", err)
		}
		if err := s.Check(ctx); err != nil {
			return nil, fmt.Errorf("checkpoints.s3: %w", err)
		}
		store = s
	default:
		return nil, nil
	}
	heads, err := conn.Heads(ctx) // in NATS whatever the store: written by compare-and-set
	if err != nil {
		return nil, fmt.Errorf("checkpoints: %w", err)
	}
	return checkpoint.New(checkpoint.Config{Dir: c.WorkspacesDir, UID: int(c.UID), GID: int(c.GID), Worker: c.ID,
		ChunkBytes: c.Checkpoints.ChunkBytes, Parallel: c.Checkpoints.Parallel, PackFilesUnder: c.Checkpoints.packFilesUnder(), MaxWorkspaceBytes: c.Checkpoints.MaxWorkspaceBytes,
		MaxTenantBytes: c.Checkpoints.MaxTenantBytes, Grace: c.Checkpoints.GCGrace, Now: conn.Now, Observe: observe}, store, heads)
}

// collectGarbage collects every tenant's checkpoint garbage, every period until ctx ends (the first pass
// a minute after start), each tenant under its collect lease held for the period (an hour at most: the
// leases bucket keeps nothing longer), so that the pool's workers collect each tenant about once per
// period between them (period 0: never). A value on now (the worker's SIGUSR1) runs a pass at once, of every tenant
// whatever the leases (two collections of a tenant at once are harmless).
func collectGarbage(ctx context.Context, cp *checkpoint.Checkpointer, leases *jetstream.Leases, id string, period time.Duration,
	now <-chan os.Signal, wm *metrics.WorkerMetrics, log *slog.Logger) {
	leased := func(ctx context.Context, tenant string) (bool, error) {
		_, err := leases.AcquireCollect(ctx, tenant, id, min(period, time.Hour))
		if errors.Is(err, queue.ErrExists) {
			return false, nil
		}
		return err == nil, err
	}
	observe := func(tenant string, r checkpoint.Collected, err error) {
		wm.ObserveCollect(tenant, r, err)
		if err == nil && r.Swept > 0 {
			log.Info("checkpoint garbage collected", "tenant", tenant, "swept", r.Swept, "swept_bytes", r.SweptBytes, "kept", r.Kept, "kept_bytes", r.KeptBytes, "took", r.Took)
		}
	}
	pass := func(lock checkpoint.CollectLock) {
		if err := cp.CollectAll(ctx, lock, observe); err != nil && ctx.Err() == nil {
			log.Warn("collect checkpoint garbage", "error", err)
		}
	}
	next := time.NewTimer(time.Minute)
	defer next.Stop()
	if period == 0 { // never on a schedule: on demand only
		next.Stop()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-now:
			log.Info("collecting checkpoint garbage now (SIGUSR1)")
			pass(func(context.Context, string) (bool, error) { return true, nil })
		case <-next.C:
			pass(leased)
			next.Reset(period)
		}
	}
}
